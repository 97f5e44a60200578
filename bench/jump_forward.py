"""Grammar-constrained verdicts: jump-forward (forced tokens fed in one forward) vs one token per forward.

    python -m bench.jump_forward                    # 64 pairwise verdicts, SmolLM2 at float32, 96 tokens
    python -m bench.jump_forward --dtype auto       # the dtype the CPU picks (bf16 where native)

The demo's rejudge asks SmolLM2 for pairwise verdicts under the grammar of `eval.judging.grammar` (16 free
reasoning tokens, then `FINAL GRADE` blocks whose text is forced but for the grade): most of each verdict is forced.
Float32 by default, the path a CPU without native bf16 takes. Prints `bench <name> = <value>`:

- `judge_single_steps_s`, `judge_fast_forward_s`: wall seconds of one `HFEngine.generate` over all prompts
  (`max_batch_size` = the prompt count) with `fast_forward` off and on, best of two calls each;
- `judge_fast_forward_vs_single_steps`: the speed-up, measured in one run;
- `judge_forwards_single_steps`, `judge_forwards_fast_forward`: decode forwards of one call.

The two sides must answer the same text: the count of identical answers is printed and a difference exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine
from bench.judge_prefix import judge_requests
from eval.judging.grammar import judge_grammar


def timed(engine: HFEngine, requests: list[ChatRequest]) -> tuple[float, list]:
    """Best wall seconds of two calls, and the completions."""
    best, done = float("inf"), []
    for _ in range(2):
        start = time.perf_counter()
        done = engine.generate(requests)
        best = min(best, time.perf_counter() - start)
    return best, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    sampling = SamplingParams(max_tokens=args.max_tokens, grammar=judge_grammar("pairwise", args.max_tokens))
    requests = [dataclasses.replace(r, sampling=sampling) for r in judge_requests(args.prompts, args.max_tokens)]
    spec = EngineSpec(model=args.model, max_batch_size=args.prompts, num_threads=args.threads, dtype=args.dtype)
    seconds, answers, forwards = {}, {}, {}
    for name, on in (("single_steps", False), ("fast_forward", True)):
        engine = HFEngine(dataclasses.replace(spec, fast_forward=on))
        engine.generate(requests[:2])
        seconds[name], done = timed(engine, requests)
        answers[name] = [c.raw_text for c in done]
        forwards[name] = sum(engine.last_stats.thread_steps.values())
        print(f"info {name}: dtype {engine.dtype}, {sum(c.completion_tokens for c in done)} completion tokens, "
              f"forced tokens fed {engine.last_stats.forced_tokens}", flush=True)
        print(f"bench judge_{name}_s = {seconds[name]:.2f}", flush=True)
        print(f"bench judge_forwards_{name} = {forwards[name]}", flush=True)
        engine.close()
    same = sum(a == b for a, b in zip(answers["single_steps"], answers["fast_forward"]))
    print(f"info identical answers: {same} of {len(requests)}; first: {json.dumps(answers['fast_forward'][0])}")
    print(f"bench judge_fast_forward_vs_single_steps = {seconds['single_steps'] / seconds['fast_forward']:.2f}")
    return 0 if same == len(requests) else 1


if __name__ == "__main__":
    sys.exit(main())
