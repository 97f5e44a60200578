"""Judge-shaped decoding: prompts that share a long instruction prefix, with the prefix held once vs per row.

    python -m bench.judge_prefix                          # 32 pairwise judge prompts, SmolLM2 bf16, 64 new tokens
    python -m bench.judge_prefix --prompts 64 --max-tokens 96

The demo's judge stages (jury, rejudge) send prompts of ~750 tokens whose first ~640 (the rubric and a worked
example, `configs/prompts/jury_pairwise_brief.yaml`) are the same for every row. Prints `bench <name> = <value>`:

- `judge_prefix_tokens_per_s`: completion tokens / wall seconds of one `HFEngine.generate` over all prompts
  (`max_batch_size` = the prompt count), the shared prefix run once and attended to once per group
  (`actors.engines.hf.prefix_attention`), best of two calls;
- `judge_unshared_tokens_per_s`: the same engine with `enable_prefix_caching: false` (every row prefills and
  attends over its own copy of the prefix), best of two calls;
- `judge_prefix_vs_unshared`: the ratio, measured in one run.

Greedy; the two sides' completions can differ in bf16 (the attention sums in another order), so the token counts
are printed too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine
from eval.prompts import load_template

REPO = Path(__file__).resolve().parents[1]


def judge_requests(count: int, max_tokens: int) -> list[ChatRequest]:
    """`count` pairwise judgments of the demo corpus's sentences: a half-length copy (A) against the sentence (B)."""
    template = load_template(REPO / "configs" / "prompts" / "jury_pairwise_brief.yaml")
    lines = (REPO / "configs" / "data" / "demo_corpus.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
    texts = [texts[i % len(texts)] for i in range(count)]
    return [ChatRequest(template.render(source=t, candidate_a=t[: len(t) // 2], candidate_b=t),
                        SamplingParams(max_tokens=max_tokens)) for t in texts]


def best_rate(engine: HFEngine, requests: list[ChatRequest]) -> tuple[float, int]:
    """Best completion tokens per second over two calls, and that call's token count."""
    best, tokens = 0.0, 0
    for _ in range(2):
        start = time.perf_counter()
        done = engine.generate(requests)
        count = sum(c.completion_tokens for c in done)
        rate = count / (time.perf_counter() - start)
        if rate > best:
            best, tokens = rate, count
    return best, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    requests = judge_requests(args.prompts, args.max_tokens)
    spec = EngineSpec(model=args.model, max_batch_size=args.prompts, num_threads=args.threads)
    rates = {}
    for name, shared in (("prefix", True), ("unshared", False)):
        engine = HFEngine(dataclasses.replace(spec, enable_prefix_caching=shared))
        engine.generate(requests[:2])
        rates[name], tokens = best_rate(engine, requests)
        stats = engine.last_stats
        print(f"info {name}: {tokens} completion tokens, prompt tokens {stats.prompt_tokens}, prefilled "
              f"{stats.prefilled_tokens}, shared prefix {stats.shared_prefix_tokens}", flush=True)
        print(f"bench judge_{name}_tokens_per_s = {rates[name]:.1f}", flush=True)
        engine.close()
    print(f"bench judge_prefix_vs_unshared = {rates['prefix'] / rates['unshared']:.2f}")


if __name__ == "__main__":
    main()
