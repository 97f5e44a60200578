"""The judging core of a GRM replica: which engine runs the judge, how a judgment reaches it, reloads and health.

`GRMServer` (serve.app: the routes) inherits `JudgeCore`. Two paths from a route to the engine, chosen per loaded
judge by `judge.engine_mode` (serve.config `judge_engine_mode`):

- async (vllm's default): each judgment awaits `AsyncVLLMEngine.complete` directly, with no batch queue and no lock on
  the way. vLLM's `AsyncLLM` batches continuously: a request joins the running batch at the next step and returns
  the moment it finishes, so a short judgment never waits for the slowest of a batch, and the engine is never idle
  while judgments wait for a batch to close. The adapter is a LoRA request per call: a new adapter of the same base
  model is swapped in (`AsyncVLLMEngine.set_adapter`) without reloading anything.
- batch (hf and openai always; vllm with `judge.engine_mode: batch`): one `@serve.batch` method groups judgments
  (`batching.max_batch_size`, `batching.batch_wait_timeout_s`) into one blocking `engine.generate`, behind a lock.
  The hf engine decodes a static batch (all rows start together, the batch ends with its longest row), so grouping
  requests is what keeps it busy; openai's engine is a bounded client of a server that batches on its own.

Both sit behind the LRU cache keyed by (model identity incl. adapter hash, rendered messages, sampling).
`reconfigure(user_config)` (re)loads the judge when its identity changes: an hf or openai engine loads while the
old one keeps serving and is swapped in between batches; a vllm engine (one GPU cannot hold two) is drained first
(batch: the lock waits for the running batch; async: new judgments wait at a gate until those in flight finish),
closed and reloaded, unless only the adapter changed and the async engine's LoRA slot holds the new one.

Why `AsyncLLM` inside this deployment rather than Ray Serve's LLM deployments (`ray.serve.llm`, Ray 2.60): its
`LLMServer` (ray/llm/_internal/serve/core/server/llm_server.py) runs the same `AsyncLLM` but serves vLLM's OpenAI
routes (`OpenAIServingChat`: chat, completions, embeddings), with LoRA through Serve model multiplexing by model id.
The reward model's own routes (/score, /compare, /reward/group with their verdict grammars, reward maths, the cache
keyed by adapter hash, the in-cluster handle of GRPO's workers) would then live in a second deployment calling it
through a handle: one more hop and serialisation per judgment and the cache apart from the engine, for no scheduling
it does not already get from `AsyncLLM` here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import time

from ray import serve

from actors.engines.base import ChatRequest, Completion, SamplingParams
from actors.engines.cache import request_key
from core.config import ConfigError, build, with_defaults
from serve.adapter import (
    build_async_judge_engine,
    build_judge_engine,
    judge_identity,
    same_base_engine,
    served_name,
)
from serve.cache import LRUCache
from serve.config import ReplicaSettings, judge_engine_mode, load_prompts, validate_replica_settings
from serve.monitor_sink import MonitorSink
from serve.monitoring import CallerLedger, probe_pairs, served_markers

log = logging.getLogger("ray.serve")
PROBE = ChatRequest(messages=[{"role": "user", "content": "Say OK."}],
                    sampling=SamplingParams(temperature=0.0, max_tokens=1))


class JudgeCore:
    """Engine, mode, cache, reloads, health and counters of one replica (the routes are `serve.app.GRMServer`)."""

    def __init__(self):
        self.settings: ReplicaSettings | None = None
        self.prompts = None
        self.engine = None
        self.judge = None  # the JudgeConfig of the loaded engine
        self.mode = ""  # "async" | "batch": how the loaded engine is driven
        self.identity = self.model_name = self.adapter = ""
        self.loading = False
        self.cache = LRUCache()
        self._token = b""
        self._engine_lock = asyncio.Lock()
        # monotonic start of the engine call now running (a batch or the health probe); None = idle
        self._engine_busy_since: float | None = None
        self.counters = collections.Counter()
        # the reward-hacking monitors of the callers that name themselves (serve.monitoring)
        self.ledger = CallerLedger()
        self.sink: MonitorSink | None = None
        # monitor.probe_path's pairs, judged after each monitored step of a caller (serve.app `_probe`)
        self.probe: list[dict] = []
        self._probes: set[asyncio.Task] = set()
        self.batch_sizes = collections.Counter()
        # async mode: start times of the judgments in flight, and a gate closed while the engine is reloaded
        self._in_flight: dict[int, float] = {}
        self._tickets = itertools.count()
        self.max_in_flight = self.async_requests = 0
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def reconfigure(self, user_config: dict) -> None:
        """Apply new settings; reload the judge only when its identity (model, adapter hash), its engine mode or its
        vLLM arguments changed (an async vLLM judge swaps a new adapter in without reloading)."""
        try:
            settings = build(ReplicaSettings, with_defaults(ReplicaSettings, user_config))
            validate_replica_settings(settings)
        except (ConfigError, ValueError) as exc:
            raise ValueError(f"user_config: {exc}") from exc
        prompts = load_prompts(settings.prompts)
        identity = await asyncio.to_thread(judge_identity, settings.judge)
        if identity != self.identity or (self.judge is not None and self._engine_settings_changed(settings.judge)):
            await self._load_engine(settings.judge, identity)
        self._generate_batch.set_max_batch_size(settings.batching.max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(settings.batching.batch_wait_timeout_s)
        self.cache.resize(settings.cache_size)
        self._token = os.environ.get(settings.auth_token_env, "").encode() if settings.auth_token_env else b""
        if settings.auth_token_env and not self._token:
            log.warning("serve.auth_token_env names %s but it is unset on this replica: auth is OFF",
                        settings.auth_token_env)
        self.ledger.configure(settings.monitor, served_markers(prompts, settings.monitor.format_ngram))
        self.probe = await asyncio.to_thread(probe_pairs, settings.monitor)
        if self.sink is None or self.sink.cfg != settings.wandb:
            if self.sink is not None:
                await asyncio.to_thread(self.sink.close)
            self.sink = MonitorSink(settings.wandb)
        self.settings, self.prompts = settings, prompts

    def _engine_settings_changed(self, judge) -> bool:
        """A new mode or new vLLM engine arguments need a new engine, whatever the model identity says."""
        return (judge_engine_mode(judge) != self.mode or judge.vllm_args != self.judge.vllm_args)

    async def _load_engine(self, judge, identity: str) -> None:
        self.loading = True
        mode = judge_engine_mode(judge)
        try:
            if (mode == "async" and self.mode == "async" and self.engine is not None
                    and same_base_engine(self.judge, judge) and self.engine.can_swap_to(judge.adapter or judge.engine.adapter)):
                # only the adapter changed: the next judgments name the new LoRA, those in flight finish on theirs
                self.engine.set_adapter(judge.adapter or judge.engine.adapter)
                self._install(self.engine, judge, identity, mode)
                self.counters["adapter_swaps"] += 1
            elif self.engine is not None and (judge.engine.kind == "vllm" or self.judge.engine.kind == "vllm"):
                # one GPU cannot hold two vLLM engines: drain, free, reload
                async with self._drained():
                    self.engine.close()
                    self.engine = None
                    self._install(await asyncio.to_thread(_builder(mode), judge), judge, identity, mode)
            else:
                engine = await asyncio.to_thread(_builder(mode), judge)
                async with self._engine_lock:
                    old = self._install(engine, judge, identity, mode)
                if old is not None:
                    old.close()
            log.info("judge loaded (%s mode): %s", mode, identity)
        finally:
            self.loading = False

    @contextlib.asynccontextmanager
    async def _drained(self):
        """No engine call runs inside: the batch lock is held and, for async mode, the judgments in flight have
        finished while new ones wait at the gate."""
        async with self._engine_lock:
            self._gate.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._gate.set()

    def _install(self, engine, judge, identity: str, mode: str):
        """Swap in a loaded engine (no engine call runs meanwhile); returns the previous one."""
        old, self.engine = self.engine, engine
        self.judge, self.mode = judge, mode
        self.identity, self.model_name, self.adapter = identity, served_name(judge), judge.adapter
        self.cache.clear()
        return old

    def record(self, caller, prompt: str, texts: list[str], rewards: list[float | None],
               verdicts: list[tuple[int, int]] = (), failed_judgments: int = 0) -> None:
        """A judged group for its caller's monitors (`serve.monitoring`); closed steps' metrics go to W&B, and
        with a probe set each monitored step is followed by the judge's probe accuracy (`_probe`)."""
        if caller is None:
            return
        self.ledger.add(caller.name, caller.step, prompt, texts, rewards, verdicts, failed_judgments)
        closed = self.ledger.take_metrics()
        if self.sink is not None:
            self.sink.put(closed)
        for name, step, _ in closed if self.probe else ():
            task = asyncio.get_running_loop().create_task(self._probe(name, step))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe(self, caller: str, step: int) -> None:
        """The probe pairs through this replica's judge; the routes' class implements it (`serve.app`)."""
        raise NotImplementedError

    def __del__(self):
        # Serve calls it when the replica stops: a vLLM engine core is a process of its own, freed here
        sink = getattr(self, "sink", None)
        if sink is not None:
            sink.close(timeout_s=30)
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            try:
                engine.close()
            except Exception as exc:  # noqa: BLE001 - the replica is going either way
                log.warning("closing the judge engine failed: %s: %s", type(exc).__name__, exc)

    # -- the two paths to the engine -----------------------------------------------------------------------------

    async def _complete(self, messages: list[dict], sampling) -> tuple[Completion, bool]:
        """One judge generation: from the cache, else from the engine. Returns (completion, cached)."""
        request = ChatRequest(messages=messages, sampling=sampling)
        hit = self.cache.get(request_key(self.identity, request))
        if hit is not None:
            return hit, True
        if self.mode == "async":
            completion, identity = await self._generate_async(request)
        else:
            completion, identity = await self._generate_batch(request)
        if completion.finish_reason != "error":
            self.cache.put(request_key(identity, request), completion)
        return completion, False

    async def _generate_async(self, request: ChatRequest) -> tuple[Completion, str]:
        if not self._gate.is_set():  # a reload is draining the engine
            await self._gate.wait()
        engine, identity = self.engine, self.identity
        ticket = next(self._tickets)
        self._in_flight[ticket] = time.monotonic()
        self._idle.clear()
        self.max_in_flight = max(self.max_in_flight, len(self._in_flight))
        self.async_requests += 1
        try:
            if engine is None:  # the reload it waited for failed
                return Completion(text="", finish_reason="error", error="the judge engine is not loaded"), identity
            completion = await engine.complete(request)
        finally:
            del self._in_flight[ticket]
            if not self._in_flight:
                self._idle.set()
        return completion, identity

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    async def _generate_batch(self, requests: list[ChatRequest]) -> list[tuple[Completion, str]]:
        async with self._engine_lock:
            engine, identity = self.engine, self.identity
            self.batch_sizes[len(requests)] += 1
            self._engine_busy_since = time.monotonic()
            try:
                completions = await asyncio.to_thread(engine.generate, requests)
            except Exception as exc:  # noqa: BLE001 - whatever one request did, the others must still be answered
                self.counters["batches_split"] += 1
                log.warning("a batch of %d failed (%s: %s); generating its requests one by one", len(requests),
                            type(exc).__name__, exc)
                completions = [await asyncio.to_thread(generate_alone, engine, r) for r in requests]
            finally:
                self._engine_busy_since = None
        return [(completion, identity) for completion in completions]

    # -- health and stats ----------------------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Serve's liveness check (every `health.period_s`; see serve.config.HealthConfig): raising is a failure.
        Healthy = settings applied, a judge loaded (or reloading), no engine call (async: no judgment in flight)
        running past `health.max_engine_call_s`, and, when idle with `health.probe`, one token generated (under load
        the judgments show the engine answers, so the probe never queues behind them)."""
        settings = self.settings
        if settings is None:
            raise RuntimeError("no settings applied (reconfigure never succeeded)")
        if self.engine is None and not self.loading:
            raise RuntimeError("the judge engine is not loaded")
        if self.mode == "async" and getattr(self.engine, "errored", False):
            raise RuntimeError("the vLLM engine core has died")
        busy_since = self._engine_busy_since
        if self._in_flight:
            busy_since = min(self._in_flight.values())
        limit = settings.health.max_engine_call_s
        if busy_since is not None and limit and time.monotonic() - busy_since > limit:
            raise RuntimeError(f"an engine call has run {time.monotonic() - busy_since:.0f} s "
                               f"(health.max_engine_call_s = {limit:g}): the replica is wedged")
        if (self.engine is None or busy_since is not None or not settings.health.probe
                or settings.judge.engine.kind == "openai" or self._engine_lock.locked()):
            return
        if self.mode == "async":
            completion = await self.engine.complete(PROBE)  # an engine failure is an error completion
        else:
            completion = await self._probe_batch_engine()
        self.counters["health_probes"] += 1
        if completion.finish_reason == "error":
            raise RuntimeError(f"the engine failed the health probe: {completion.error}")

    async def _probe_batch_engine(self) -> Completion:
        async with self._engine_lock:
            self._engine_busy_since = time.monotonic()
            try:
                return (await asyncio.to_thread(self.engine.generate, [PROBE]))[0]
            except Exception as exc:  # noqa: BLE001 - any engine failure is this replica's ill health
                return Completion(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._engine_busy_since = None

    def stats_body(self) -> dict:
        """/stats: the engine mode and its load (batch sizes, or judgments in flight), the cache, the counters."""
        body = {"replica": serve.get_replica_context().replica_tag, "model_identity": self.identity,
                "engine_mode": self.mode}
        if self.mode == "async":
            body.update(engine_requests=self.async_requests, in_flight=len(self._in_flight),
                        max_in_flight_seen=self.max_in_flight)
        else:
            sizes = self.batch_sizes
            body.update(batches=sum(sizes.values()), engine_requests=sum(k * v for k, v in sizes.items()),
                        batch_sizes={str(k): v for k, v in sorted(sizes.items())},
                        max_batch_size_seen=max(sizes, default=0),
                        max_batch_size=self.settings.batching.max_batch_size if self.settings else None)
        body["cache"] = {"size": len(self.cache), "capacity": self.cache.capacity, "hits": self.cache.hits,
                         "misses": self.cache.misses}
        # per caller: counts, monitor/* metrics, alerts and the record of returned rewards (serve.monitoring)
        body["callers"] = self.ledger.stats()
        return {**body, **dict(self.counters)}


def _builder(mode: str):
    return build_async_judge_engine if mode == "async" else build_judge_engine


def generate_alone(engine, request: ChatRequest) -> Completion:
    """One request on its own: its failure becomes its own error completion (never the batch's)."""
    try:
        return engine.generate([request])[0]
    except Exception as exc:  # noqa: BLE001 - reported to this request's client, not raised into the others
        return Completion(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")
