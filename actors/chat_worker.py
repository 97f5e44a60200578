"""`ChatWorker`: the model-holding Ray Data actor shared by the generate and jury stages.

Stages are named pure functions around it (Ray's processor pattern): a *pre* function renders each row into a
`messages_json` + `sampling_json` request, the worker completes the requests with its engine (through the
request cache), and a *post* function turns completions into the stage's columns. The worker itself knows nothing
about simplification or judging.

For judges, an optional `check` function (text, row) -> error string marks unusable outputs; those rows are asked
again up to `max_parse_retries` times with a new seed (and at least `retry_temperature`, since a greedy retry would
repeat itself). The last attempt is kept either way, with its error, so nothing is dropped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

import pandas as pd

from actors.cached_engine import CachedEngine
from actors.engine import ChatRequest, Completion, SamplingParams
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


class ChatWorker:
    """Callable class for `Dataset.map_batches(ChatWorker, batch_format="pandas", ...)`."""

    def __init__(self, spec: dict, cache_dir: str = "", check: Callable[[str, dict], str] | None = None,
                 max_parse_retries: int = 0, retry_temperature: float = 0.7, secrets: Secrets | None = None):
        if secrets is not None:
            secrets.install()  # the engine's API key, by name (actors.secrets: never a runtime-env variable)
        # the engine (loaded on the first call) and the request cache: actors.cached_engine
        self.model = CachedEngine(spec, cache_dir)
        self.spec = self.model.spec
        self.check, self.max_parse_retries, self.retry_temperature = check, max_parse_retries, retry_temperature

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        self.model.load()
        started = time.time()
        rows = batch.to_dict("records")
        results = self._complete(rows, attempt=0)
        attempts = [1] * len(rows)
        errors = [self._check(r, c) for r, c in zip(rows, results)]
        for attempt in range(1, self.max_parse_retries + 1):
            todo = [i for i, e in enumerate(errors) if e]
            if not todo:
                break
            retried = self._complete([rows[i] for i in todo], attempt)
            for i, completion in zip(todo, retried):
                results[i], attempts[i] = completion, attempt + 1
                errors[i] = self._check(rows[i], completion)
        out = batch.copy()
        per_row = (time.time() - started) / max(len(rows), 1)
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
        return out

    def _check(self, row: dict, result: tuple[Completion, bool]) -> str:
        completion, _ = result
        if completion.finish_reason == "error":
            return f"engine_error: {completion.error}"
        return self.check(completion.text, row) if self.check else ""

    def _complete(self, rows: list[dict], attempt: int) -> list[tuple[Completion, bool]]:
        """Completions for rows, from the cache where possible; returns (completion, was_cached) pairs."""
        return self.model.complete_cached([to_request(r, attempt, self.retry_temperature) for r in rows])


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

