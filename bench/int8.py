"""`engine.quantize: int8` against float32 on the demo's two workloads, in one run.

    python -m bench.int8                  # SmolLM2, 64 pairwise verdicts (96 tokens) and 64 simplifications (64)

Float32 is the dtype a CPU without native bf16 runs; int8 is the declared option for it (actors.engines.hf.int8).
Prints `bench <name> = <value>`:

- `int8_judge_float32_s`, `int8_judge_int8_s`, `int8_judge_vs_float32`: wall seconds of one `HFEngine.generate`
  over 64 of the demo's pairwise verdicts (jury_pairwise_brief under its grammar: long prompts, mostly forced
  answers), best of two calls each, and the speed-up;
- `int8_generate_float32_s`, `int8_generate_int8_s`, `int8_generate_vs_float32`: the same for 64 greedy
  simplifications (bench.prompts' sentences, 64 new tokens: the demo's generate stage in shape);
- `int8_verdicts_agree`: the share of verdicts (A, B or tie, `parse_pairwise`) int8 answers as float32 does;
  `int8_verdicts_parsed`: int8's share of verdicts that parse (float32's is printed as info).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine
from bench.judge_prefix import judge_requests
from bench.jump_forward import timed
from bench.prompts import INSTRUCTION, SENTENCES, SYSTEM
from eval.judging.grammar import judge_grammar
from eval.judging.menlo_parse import parse_pairwise


def simplify_requests(count: int, max_tokens: int) -> list[ChatRequest]:
    """`count` greedy simplifications of bench.prompts' sentences (repeated as needed)."""
    return [ChatRequest([{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": INSTRUCTION + SENTENCES[i % len(SENTENCES)]}],
                        SamplingParams(temperature=0.0, max_tokens=max_tokens)) for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    sampling = SamplingParams(max_tokens=96, grammar=judge_grammar("pairwise", 96))
    workloads = {"judge": [dataclasses.replace(r, sampling=sampling) for r in judge_requests(args.prompts, 96)],
                 "generate": simplify_requests(args.prompts, 64)}
    spec = EngineSpec(model=args.model, max_batch_size=args.prompts, num_threads=args.threads, dtype="float32")
    seconds, verdicts = {}, {}
    for quantize in ("none", "int8"):
        engine = HFEngine(dataclasses.replace(spec, quantize=quantize))
        name = "float32" if quantize == "none" else "int8"
        for workload, requests in workloads.items():
            engine.generate(requests[:2])
            seconds[workload, name], done = timed(engine, requests)
            print(f"bench int8_{workload}_{name}_s = {seconds[workload, name]:.2f}", flush=True)
            if workload == "judge":
                verdicts[name] = [parse_pairwise(c.text).value for c in done]
        engine.close()
    for workload in workloads:
        ratio = seconds[workload, "float32"] / seconds[workload, "int8"]
        print(f"bench int8_{workload}_vs_float32 = {ratio:.2f}")
    pairs = list(zip(verdicts["float32"], verdicts["int8"]))
    print(f"info float32 verdicts parsed: {sum(v is not None for v in verdicts['float32'])} of {len(pairs)}")
    print(f"bench int8_verdicts_parsed = {sum(v is not None for v in verdicts['int8']) / len(pairs):.3f}")
    print(f"bench int8_verdicts_agree = {sum(a == b for a, b in pairs) / len(pairs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
