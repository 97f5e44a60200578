"""`CachedEngine`: one engine (loaded on first use) behind the request cache, with per-call accounting.

`ChatWorker` completes one request per row; multi-step agents (the CRAFT planner + reviser, TG-MCTS) ask the same
engine many times per row. Both go through this class, so the cache logic lives in one place: every request is
looked up under `request_key(spec.cache_identity(), request)`, only the misses reach the engine, and fresh
successful completions are stored (failed ones never are: see actors.engines.cache).

`Usage` counts what a caller spent: engine calls (requests sent to the model, cache hits excluded), prompt and
completion tokens of those calls, seconds spent in the engine, and cache hits. `take_usage()` returns the counts
since the last take and resets them, so a worker can attribute cost to one system of one row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.engines.base import ChatRequest, Completion, EngineSpec
from actors.engines.cache import RequestCache, request_key
from actors.engines.factory import build_engine


@dataclass
class Usage:
    """Cost of a run of completions. Cache hits cost no call, no tokens and no seconds; they are counted apart."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cache_hits: int = 0

    def add(self, other: Usage) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class CachedEngine:
    """One engine + optional request cache. Not thread-safe: one per actor, called from one thread (the sync path)
    or one event loop (the async path, for an engine with `async complete_many`, e.g. actors.engines.vllm_async)."""

    def __init__(self, spec: EngineSpec | dict, cache_dir: str = "",
                 build: Callable[[EngineSpec], Any] = build_engine):
        self.spec = spec if isinstance(spec, EngineSpec) else EngineSpec(**spec)
        self._build = build  # spec -> engine; build_engine's sync engines unless the caller brings its own
        # Loaded on the first call, not here: Ray Data runs an actor's constructor on its main thread but every
        # call on one worker thread, and torch's OpenMP pool built on the main thread (model load, warm-up) then
        # competes with the worker thread's own pool - measured 22% slower decoding on 2 cores (bench.generate).
        self.engine = None
        self.cache = RequestCache(cache_dir) if cache_dir else None
        self.identity = self.spec.cache_identity()
        # when the model was loaded: throughput measurements start here, not at actor scheduling
        self.ready_at = 0.0
        self.usage = Usage()

    def load(self) -> None:
        if self.engine is None:
            self.engine = self._build(self.spec)
            self.ready_at = time.time()

    def complete_cached(self, requests: list[ChatRequest]) -> list[tuple[Completion, bool]]:
        """(completion, was_cached) per request, in order; only cache misses reach the engine."""
        keys, found, missing = self._lookup(requests)
        if missing:
            self.load()
            started = time.time()
            fresh = self.engine.generate([requests[i] for i in missing])
            self._store(keys, found, missing, fresh, time.time() - started)
        return self._answer(requests, found, missing)

    async def complete_cached_async(self, requests: list[ChatRequest]) -> list[tuple[Completion, bool]]:
        """`complete_cached` for an async engine: the misses are awaited (`engine.complete_many`), so calls from
        several coroutines overlap in the engine. Usage seconds are each call's own wall time (overlaps add up)."""
        keys, found, missing = self._lookup(requests)
        if missing:
            self.load()
            started = time.time()
            fresh = await self.engine.complete_many([requests[i] for i in missing])
            self._store(keys, found, missing, fresh, time.time() - started)
        return self._answer(requests, found, missing)

    def _lookup(self, requests: list[ChatRequest]) -> tuple[list[str], list[Completion | None], list[int]]:
        keys = [request_key(self.identity, r) for r in requests]
        found = [self.cache.get(k) if self.cache else None for k in keys]
        return keys, found, [i for i, c in enumerate(found) if c is None]

    def _store(self, keys: list[str], found: list, missing: list[int], fresh: list[Completion],
               seconds: float) -> None:
        self.usage.seconds += seconds
        for i, completion in zip(missing, fresh, strict=True):
            found[i] = completion
            self.usage.calls += 1
            self.usage.prompt_tokens += completion.prompt_tokens
            self.usage.completion_tokens += completion.completion_tokens
            if self.cache:
                self.cache.put(keys[i], completion)

    def _answer(self, requests: list[ChatRequest], found: list, missing: list[int]) -> list[tuple[Completion, bool]]:
        self.usage.cache_hits += len(requests) - len(missing)
        missing_set = set(missing)
        return [(c, i not in missing_set) for i, c in enumerate(found)]

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        return [c for c, _ in self.complete_cached(requests)]

    def take_usage(self) -> Usage:
        """The usage since the last take (or construction), and a fresh counter."""
        usage, self.usage = self.usage, Usage()
        return usage
