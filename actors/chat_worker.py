"""`ChatWorker`: the model-holding Ray Data actor shared by the generate and jury stages.

Stages are named pure functions around it (Ray's processor pattern): a *pre* function renders each row into a
`messages_json` + `sampling_json` request, the worker completes the requests with its engine (through the
request cache), and a *post* function turns completions into the stage's columns. The worker itself knows nothing
about simplification or judging.

For judges, an optional `check` function (text, row) -> error string marks unusable outputs; those rows are asked
again up to `max_parse_retries` times with a new seed (and at least `retry_temperature`, since a greedy retry would
repeat itself). The last attempt is kept either way, with its error, so nothing is dropped.

Several batches in flight. `__call__` is a coroutine, so Ray Data runs it on the actor's event loop and the pool's
`batches_in_flight` calls (`PoolConfig.compute`: the actor's `max_concurrent_calls_per_actor`) are all at the actor
at once (ray/data/_internal/planner/plan_udf_map_op.py, the `iscoroutinefunction(udf.__call__)` branch, and
`_generate_transform_fn_for_async_map`). What overlaps depends on the engine:

- vllm: the actor holds an `actors.engines.vllm_async.AsyncVLLMEngine` and awaits each batch's requests, so the rows of
  every batch in flight share vLLM's continuous batch: a batch's slow rows no longer hold the engine, and the next
  batch's rows fill the slots the finished ones free.
- hf and openai: their engines are synchronous, so every engine call (cache lookups and stores included: the
  request cache and `CachedEngine`'s counters are not thread-safe) runs on one dedicated engine thread, in arrival
  order. hf could not take two calls at once anyway (its decode loop holds one KV cache and one torch thread pool);
  openai already has `engine.max_concurrency` requests in flight inside one call. The batches in flight wait at the
  actor, so the next one starts the moment the last one ends (no gap for Ray Data to fetch, deserialize and send
  it). The thread also loads the model: torch's thread pool is built on the thread that decodes
  (actors.engines.cached).

Per-row `worker_seconds` is the row's share of the actor's busy time: while k rows are in flight at the actor each
gets 1/k of the time (`BusyClock`), so a stage's `actor_seconds` (their sum) is the time its actors were busy, with
overlapping batches counted once. A cache hit costs 0. With `timeline_dir`, each batch appends one JSON line
(`arrived` and `finished` times, `rows`, the actor's `pid`) to `<timeline_dir>/<pid>.jsonl`: how the
batches overlapped at each actor.

Why not Ray's `ray.data.llm` (`build_llm_processor` + `vLLMEngineProcessorConfig`, Ray 2.60) for the vllm path. It
keeps an `AsyncLLM` fed the same way (`max_concurrent_batches` as the actor's `max_concurrency`,
ray/llm/_internal/batch/processor/vllm_engine_proc.py), takes per-row `sampling_params` with a seed and a
`structured_outputs` grammar (stages/vllm_engine_stage.py `_prepare_llm_request`) and keeps a failed row's error
with `should_continue_on_error` (`_generate_with_error_handling`, `__inference_error__`). But its engine stage only
generates, so what the generate and jury stages need besides would sit outside its actor:
- the request cache: a hit must skip the engine; a processor sends every row it is given to vLLM
  (`vLLMEngineStageUDF.udf`), so lookups would be a stage before it and stores one after it;
- parse retries with new seeds: a processor is one pass, and each `processor(ds)` builds its own engine actor pool
  (`Processor.__call__` -> one `map_batches_internal` per stage, processor/base.py); retrying the unusable rows means a second
  pass that loads the model again, or giving up per-row retries;
- the thinking split and finish reasons of `actors.engines.base.Completion` (its output row is vLLM's `generated_text`,
  `vLLMOutputData`), the same chat rendering as our other vLLM engines (its `ChatTemplateStage` renders with the HF
  tokenizer in a separate CPU stage), and the `worker_ready_at` stamp the jury's actor-restart count reads.
`AsyncVLLMEngine` inside this actor gives the same continuous batching with all of that in one place; the
`bench.data_stage` ratio against offline `LLM.generate` is the check that nothing is lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from actors.engines.base import ChatRequest, Completion, EngineSpec, SamplingParams
from actors.engines.cached import CachedEngine
from actors.engines.factory import build_engine
from actors.secrets import Secrets

COMPLETION_COLUMNS = (
    "completion", "raw_completion", "reasoning", "prompt_tokens", "completion_tokens", "finish_reason",
    "engine_error", "cached", "attempts", "check_error", "worker_seconds", "worker_ready_at",
)


def to_request(row: dict, attempt: int = 0, retry_temperature: float = 0.7) -> ChatRequest:
    params = json.loads(row["sampling_json"])
    sampling = SamplingParams(**{**params, "stop": tuple(params.get("stop", ()))})
    if attempt:
        # a new seed, and real sampling: a greedy retry would reproduce the same unusable answer
        sampling = dataclasses.replace(
            sampling, seed=sampling.seed + 7919 * attempt, temperature=max(sampling.temperature, retry_temperature)
        )
    return ChatRequest(messages=json.loads(row["messages_json"]), sampling=sampling, request_id=str(row.get("id", "")))


class BusyClock:
    """Splits an actor's busy time among the rows in flight: while k rows are in flight, each accrues 1/k of the time.

    `enter` returns a mark; `leave` with that mark returns the seconds each of the batch's rows accrued. Summed over
    all rows, that is the time at least one row was in flight. Times are passed in (pure, testable).
    """

    def __init__(self):
        self.rows = 0
        self.per_row = 0.0  # seconds accrued so far by a row in flight from the start
        self.last = 0.0

    def _advance(self, now: float) -> None:
        if self.rows:
            self.per_row += (now - self.last) / self.rows
        self.last = now

    def enter(self, rows: int, now: float) -> float:
        self._advance(now)
        self.rows += rows
        return self.per_row

    def leave(self, rows: int, mark: float, now: float) -> float:
        self._advance(now)
        self.rows -= rows
        return self.per_row - mark


class ChatWorker:
    """Callable class for `Dataset.map_batches(ChatWorker, batch_format="pandas", **pool.map_batches_kwargs())`.

    Args:
        spec: the engine spec (as a dict: Ray ships constructor arguments).
        cache_dir: the request cache ("" = none).
        check: (text, row) -> error string for a usable-or-not verdict; unusable rows are asked again.
        max_parse_retries, retry_temperature: see the module docstring.
        secrets: the engine's API key, installed in the actor.
        engine_args: further vLLM engine arguments for a vllm spec (e.g. enforce_eager); see
            `actors.engines.vllm_sync.check_extra_args`.
        timeline_dir: where each batch's arrival and finish times go ("" = nowhere); see the module docstring.
    """

    def __init__(self, spec: dict, cache_dir: str = "", check: Callable[[str, dict], str] | None = None,
                 max_parse_retries: int = 0, retry_temperature: float = 0.7, secrets: Secrets | None = None,
                 engine_args: dict | None = None, timeline_dir: str = ""):
        if secrets is not None:
            secrets.install()  # the engine's API key, by name (actors.secrets: never a runtime-env variable)
        engine = EngineSpec(**spec) if isinstance(spec, dict) else spec
        self.asynchronous = engine.kind == "vllm"
        if self.asynchronous:
            from actors.engines.vllm_async import AsyncVLLMEngine

            build = functools.partial(AsyncVLLMEngine, extra_args=engine_args)
        else:
            if engine_args:
                raise ValueError(f"engine_args: only a vllm engine takes them, this one is {engine.kind!r}")
            build = build_engine
        # the engine and the request cache (actors.engines.cached): the model is loaded at the first cache miss, so
        # an actor whose every row is answered from the cache (a stage run again over a warm cache) never loads it
        # and records worker_ready_at 0 (the jury's restart count skips such rows). The sync path's miss runs on the
        # engine thread, which then loads the model; the async path's load blocks the event loop, so batches in
        # flight cannot start a second one
        self.model = CachedEngine(engine, cache_dir, build=build)
        self.spec = self.model.spec
        self.check, self.max_parse_retries, self.retry_temperature = check, max_parse_retries, retry_temperature
        # sync engines: every call (and the model load) on this one thread, in arrival order
        self._engine_thread = None if self.asynchronous else ThreadPoolExecutor(1, thread_name_prefix="chat-engine")
        self.clock = BusyClock()
        self.timeline = Path(timeline_dir) / f"{os.getpid()}.jsonl" if timeline_dir else None

    async def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        arrived = time.time()
        rows = batch.to_dict("records")
        mark = self.clock.enter(len(rows), arrived)
        try:
            results, attempts, errors = await self._complete_with_retries(rows)
        finally:
            finished = time.time()
            per_row = self.clock.leave(len(rows), mark, finished)
        out = batch.copy()
        out["completion"] = [c.text for c, _ in results]
        out["raw_completion"] = [c.raw_text for c, _ in results]
        out["reasoning"] = [c.reasoning for c, _ in results]
        out["prompt_tokens"] = [c.prompt_tokens for c, _ in results]
        out["completion_tokens"] = [c.completion_tokens for c, _ in results]
        out["finish_reason"] = [c.finish_reason for c, _ in results]
        out["engine_error"] = [c.error for c, _ in results]
        out["cached"] = [hit for _, hit in results]
        out["attempts"] = attempts
        out["check_error"] = errors
        out["worker_seconds"] = [0.0 if hit else per_row for _, hit in results]
        out["worker_ready_at"] = self.model.ready_at
        if self.timeline:
            self.timeline.parent.mkdir(parents=True, exist_ok=True)
            with self.timeline.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), "arrived": arrived, "finished": finished,
                                    "rows": len(rows)}) + "\n")
        return out

    async def _complete_with_retries(self, rows: list[dict]) -> tuple[list[tuple[Completion, bool]], list[int],
                                                                       list[str]]:
        results = await self._complete(rows, attempt=0)
        attempts = [1] * len(rows)
        errors = [self._check(r, c) for r, c in zip(rows, results)]
        for attempt in range(1, self.max_parse_retries + 1):
            todo = [i for i, e in enumerate(errors) if e]
            if not todo:
                break
            retried = await self._complete([rows[i] for i in todo], attempt)
            for i, completion in zip(todo, retried):
                results[i], attempts[i] = completion, attempt + 1
                errors[i] = self._check(rows[i], completion)
        return results, attempts, errors

    def _check(self, row: dict, result: tuple[Completion, bool]) -> str:
        completion, _ = result
        if completion.finish_reason == "error":
            return f"engine_error: {completion.error}"
        return self.check(completion.text, row) if self.check else ""

    async def _complete(self, rows: list[dict], attempt: int) -> list[tuple[Completion, bool]]:
        """Completions for rows, from the cache where possible; returns (completion, was_cached) pairs."""
        requests = [to_request(r, attempt, self.retry_temperature) for r in rows]
        if self.asynchronous:
            return await self.model.complete_cached_async(requests)
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, self.model.complete_cached,
                                                                requests)

    def __del__(self):
        # Ray Data drops the UDF when its pool shuts down (`_MapWorker.__ray_shutdown__`): stop vLLM's engine core
        engine = getattr(getattr(self, "model", None), "engine", None)
        if getattr(self, "asynchronous", False) and engine is not None:
            engine.close()
        if getattr(self, "_engine_thread", None) is not None:
            self._engine_thread.shutdown(wait=False)


def chat_actor_restarts() -> int:
    """Restarts so far of this driver's ChatWorker pool actors, from Ray's actor table (a worker process or its
    node died and Ray started the actor again: Ray Data pools run with max_restarts=-1 and retry the lost batch).

    Actors of finished stages keep their count, so a stage records the difference across its run. Uses Ray's
    `ray._private.state.actors` (a developer API that reads the GCS, no dashboard needed).
    """
    import ray
    from ray._private import state

    if not ray.is_initialized():
        return 0
    job = ray.get_runtime_context().get_job_id()
    return sum(int(a["NumRestarts"]) for a in state.actors().values()
               if a["JobID"] == job and "ChatWorker" in a["ActorClassName"])

