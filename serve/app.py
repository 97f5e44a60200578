"""The generative reward model (GRM) as a Ray Serve app: one deployment, a FastAPI ingress, batched judging.

    quorum serve configs/grm.yaml                                   # local Ray; Ctrl-C stops it
    quorum serve configs/grm.yaml --print-config=grm_serve.yaml     # then: serve deploy grm_serve.yaml

Endpoints: POST /v1/chat/completions (OpenAI-compatible), GET /v1/models, POST /score (pointwise grade),
POST /compare (pairwise grades + preference), POST /reward/group (a reward per response, all_pairs,
vs_reference or listwise: one call ranks the group), GET /health (liveness), GET /ready (model loaded, its
identity), GET /stats (batch sizes, cache).
Request formats, parsing and reward maths live in the pure `serve.protocol`, message rendering in `serve.judge_prompts`.

Every judge generation goes through one `@serve.batch` method in front of the engine's batched `generate`, behind
an LRU cache keyed by (model identity incl. adapter hash, rendered messages, sampling). `reconfigure(user_config)`
(re)loads the judge when its identity changes: the new engine loads while the old one keeps serving, then they are
swapped between batches (vLLM, which cannot hold two engines on one GPU, drains and reloads instead).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve
from starlette.exceptions import HTTPException

from actors.cache import request_key
from actors.engine import ChatRequest, Completion, SamplingParams
from actors.secrets import Secrets
from actors.stage_config import engine_secrets
from core.config import ConfigError, build, with_defaults
from eval.judge_grammar import judge_grammar
from eval.listwise import listwise_grammar
from eval.reward_wire import GroupRewardResponse
from serve import protocol as P
from serve import rewards as R
from serve.adapter import build_judge_engine, judge_identity, served_name
from serve.cache import LRUCache
from serve.config import ReplicaSettings, ServeConfig, load_prompts, validate_replica_settings
from serve.errors import error_body, install_error_handlers, validation_error_body
from serve.guard import admit
from serve.judge_prompts import JudgePrompts

log = logging.getLogger("ray.serve")
DEPLOYMENT_NAME = "GRMServer"

api = FastAPI(title="quorum generative reward model")


install_error_handlers(api)


@api.middleware("http")
async def _guard(request: Request, call_next):
    """Body size and bearer-token checks run before the body is read or validated."""
    server = serve.get_replica_context().servable_object
    rejection = server.admit(request)
    return rejection if rejection is not None else await call_next(request)


# ---------------------------------------------------------------------------------------------------------------
# The deployment


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class GRMServer:
    """One replica: a judge engine, the batch queue in front of it, the response cache and the HTTP routes."""

    def __init__(self, secrets: Secrets | None = None):
        if secrets is not None:
            # the token / judge API key set where the app was deployed (a constructor argument: never logged)
            secrets.install()
        self.settings: ReplicaSettings | None = None
        self.prompts: JudgePrompts | None = None
        self.engine = None
        self.identity = self.model_name = self.adapter = ""
        self.loading = False
        self.cache = LRUCache()
        self._token = b""
        self._engine_lock = asyncio.Lock()
        # monotonic start of the engine call now running (a batch or the health probe); None = idle
        self._engine_busy_since: float | None = None
        self.counters = collections.Counter()
        self.batch_sizes = collections.Counter()

    async def reconfigure(self, user_config: dict) -> None:
        """Apply new settings; reload the judge only when its identity (model, adapter hash) changed."""
        try:
            settings = build(ReplicaSettings, with_defaults(ReplicaSettings, user_config))
            validate_replica_settings(settings)
        except (ConfigError, ValueError) as exc:
            raise ValueError(f"user_config: {exc}") from exc
        prompts = load_prompts(settings.prompts)
        identity = await asyncio.to_thread(judge_identity, settings.judge)
        if identity != self.identity:
            await self._load_engine(settings.judge, identity)
        self._generate_batch.set_max_batch_size(settings.batching.max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(settings.batching.batch_wait_timeout_s)
        self.cache.resize(settings.cache_size)
        self._token = os.environ.get(settings.auth_token_env, "").encode() if settings.auth_token_env else b""
        if settings.auth_token_env and not self._token:
            log.warning("serve.auth_token_env names %s but it is unset on this replica: auth is OFF",
                        settings.auth_token_env)
        self.settings, self.prompts = settings, prompts

    async def _load_engine(self, judge, identity: str) -> None:
        self.loading = True
        try:
            if self.engine is not None and judge.engine.kind == "vllm":
                # one GPU cannot hold two vLLM engines: drain (the lock waits for the running batch), free, reload
                async with self._engine_lock:
                    self.engine.close()
                    self.engine = None
                    self._install(await asyncio.to_thread(build_judge_engine, judge), judge, identity)
            else:
                engine = await asyncio.to_thread(build_judge_engine, judge)
                async with self._engine_lock:
                    old = self._install(engine, judge, identity)
                if old is not None:
                    old.close()
            log.info("judge loaded: %s", identity)
        finally:
            self.loading = False

    def _install(self, engine, judge, identity: str):
        """Swap in a loaded engine (caller holds the engine lock); returns the previous one."""
        old, self.engine = self.engine, engine
        self.identity, self.model_name, self.adapter = identity, served_name(judge), judge.adapter
        self.cache.clear()
        return old

    def admit(self, request: Request) -> JSONResponse | None:
        """None to let the request through, else the rejection (serve.guard: body size, bearer token)."""
        return admit(request, self.settings, self._token, self.counters)

    # -- judging core ------------------------------------------------------------------------------------------

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

    async def check_health(self) -> None:
        """Serve's liveness check (every `health.period_s`; see serve.config.HealthConfig): raising is a failure.
        Healthy = settings applied, a judge loaded (or reloading), no engine call running past
        `health.max_engine_call_s`, and, when idle with `health.probe`, one token generated (under load the batches
        show the engine answers, so the probe never queues behind them)."""
        settings = self.settings
        if settings is None:
            raise RuntimeError("no settings applied (reconfigure never succeeded)")
        if self.engine is None and not self.loading:
            raise RuntimeError("the judge engine is not loaded")
        busy_since, limit = self._engine_busy_since, settings.health.max_engine_call_s
        if busy_since is not None and limit and time.monotonic() - busy_since > limit:
            raise RuntimeError(f"an engine call has run {time.monotonic() - busy_since:.0f} s "
                               f"(health.max_engine_call_s = {limit:g}): the replica is wedged")
        if (self.engine is None or busy_since is not None or not settings.health.probe
                or settings.judge.engine.kind == "openai" or self._engine_lock.locked()):
            return
        probe = ChatRequest(messages=[{"role": "user", "content": "Say OK."}],
                            sampling=SamplingParams(temperature=0.0, max_tokens=1))
        async with self._engine_lock:
            self._engine_busy_since = time.monotonic()
            try:
                completion = (await asyncio.to_thread(self.engine.generate, [probe]))[0]
            except Exception as exc:  # noqa: BLE001 - any engine failure is this replica's ill health
                completion = Completion(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._engine_busy_since = None
        self.counters["health_probes"] += 1
        if completion.finish_reason == "error":
            raise RuntimeError(f"the engine failed the health probe: {completion.error}")

    async def _complete(self, messages: list[dict], sampling) -> tuple[Completion, bool]:
        """One judge generation: from the cache, else through the batch queue. Returns (completion, cached)."""
        request = ChatRequest(messages=messages, sampling=sampling)
        hit = self.cache.get(request_key(self.identity, request))
        if hit is not None:
            return hit, True
        completion, identity = await self._generate_batch(request)
        if completion.finish_reason != "error":
            self.cache.put(request_key(identity, request), completion)
        return completion, False

    async def _with_deadline(self, awaitable, timeout_s: float | None):
        limit = min(timeout_s or float("inf"), self.settings.request_timeout_s)
        try:
            return await asyncio.wait_for(awaitable, limit)
        except TimeoutError:
            self.counters["timeouts"] += 1
            raise HTTPException(504, f"request exceeded its deadline of {limit:g} s") from None

    def _ready_settings(self) -> ReplicaSettings:
        if self.settings is None or self.engine is None:
            raise HTTPException(503, "the judge model is not loaded yet")
        return self.settings

    def _default_sampling(self):
        return self.settings.sampling.to_params()

    def _judge_sampling(self, settings, requested, fmt: str):
        """The request's judge sampling, with the verdict grammar of `fmt` unless `judge.constrained` is off."""
        sampling = P.judge_sampling(self._default_sampling(), settings.limits, requested)
        if not settings.judge.constrained:
            return sampling
        return dataclasses.replace(sampling, grammar=judge_grammar(fmt, sampling.max_tokens))

    # -- routes ------------------------------------------------------------------------------------------------

    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @api.get("/ready")
    async def ready(self):
        body = {"ready": self.engine is not None, "loading": self.loading, "model": self.model_name,
                "model_identity": self.identity, "adapter": self.adapter, "auth": bool(self._token),
                "replica": serve.get_replica_context().replica_tag}
        return body if self.engine is not None else JSONResponse(body, status_code=503)

    @api.get("/stats")
    async def stats(self) -> dict:
        sizes = self.batch_sizes
        batches = sum(sizes.values())
        return {
            "replica": serve.get_replica_context().replica_tag, "model_identity": self.identity,
            "batches": batches, "engine_requests": sum(k * v for k, v in sizes.items()),
            "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},
            "max_batch_size_seen": max(sizes, default=0),
            "max_batch_size": self.settings.batching.max_batch_size if self.settings else None,
            "cache": {"size": len(self.cache), "capacity": self.cache.capacity, "hits": self.cache.hits,
                      "misses": self.cache.misses},
            **dict(self.counters),
        }

    @api.get("/v1/models")
    async def models(self) -> dict:
        self._ready_settings()
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "quorum"}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: P.ChatCompletionRequest) -> dict:
        settings = self._ready_settings()
        P.check_chat(body, settings.limits)
        sampling = P.resolve_sampling(
            self._default_sampling(), settings.limits, temperature=body.temperature, top_p=body.top_p,
            max_tokens=body.max_completion_tokens or body.max_tokens, seed=body.seed, stop=body.stop)
        messages = [m.model_dump() for m in body.messages]
        completion, cached = await self._with_deadline(self._complete(messages, sampling), body.timeout_s)
        if completion.finish_reason == "error":
            raise P.RequestError("messages", f"the engine refused the prompt: {completion.error}")
        message = {"role": "assistant", "content": completion.text}
        if completion.reasoning:
            message["reasoning_content"] = completion.reasoning
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": completion.finish_reason}],
            "usage": P.usage_of([completion]).model_dump(),
            "quorum": {"model_identity": self.identity, "cached": cached},
        }

    @api.post("/score")
    async def score(self, body: P.ScoreRequest) -> P.ScoreResponse:
        settings = self._ready_settings()
        P.check_texts([("prompt", body.prompt), ("response", body.response), ("reference", body.reference)],
                      settings.limits)
        response = P.clean_response(body.response, settings.judge.strip_think)
        messages = self.prompts.score_messages(body.prompt, response, body.reference, body.dimension, body.locale)
        sampling = self._judge_sampling(settings, body.sampling,
                                        "pointwise" if self.prompts.pointwise_format == "menlo" else "score")
        completion, cached = await self._with_deadline(self._complete(messages, sampling), body.timeout_s)
        return P.score_response(completion, self.model_name, cached, self.prompts.pointwise_format)

    @api.post("/compare")
    async def compare(self, body: P.CompareRequest) -> P.CompareResponse:
        settings = self._ready_settings()
        P.check_texts([("prompt", body.prompt), ("response_a", body.response_a),
                       ("response_b", body.response_b)], settings.limits)
        strip = settings.judge.strip_think
        messages = self.prompts.compare_messages(body.prompt, P.clean_response(body.response_a, strip),
                                                 P.clean_response(body.response_b, strip), body.dimension,
                                                 body.locale)
        sampling = self._judge_sampling(settings, body.sampling, "pairwise")
        completion, cached = await self._with_deadline(self._complete(messages, sampling), body.timeout_s)
        return P.compare_response(completion, self.model_name, cached)

    @api.post("/reward/group")
    async def reward_group(self, body: P.GroupRewardRequest) -> GroupRewardResponse:
        settings = self._ready_settings()
        P.check_group(body, settings.limits)
        texts = {R.REFERENCE: body.reference}
        texts.update(enumerate(P.clean_response(r, settings.judge.strip_think) for r in body.responses))
        if body.scheme == "listwise":
            return await self._reward_listwise(settings, body, [texts[i] for i in range(len(body.responses))])
        pairs = R.plan_pairs(len(body.responses), body.scheme, body.both_orders)
        sampling = self._judge_sampling(settings, body.sampling, "pairwise")
        messages = [self.prompts.compare_messages(body.prompt, texts[a], texts[b], body.dimension, body.locale)
                    for a, b in pairs]
        calls = [self._complete(m, sampling) for m in messages]
        results = await self._with_deadline(asyncio.gather(*calls), body.timeout_s)
        judgments = [R.read_judgment(a, b, c, cached) for (a, b), (c, cached) in zip(pairs, results)]
        return R.group_response(body.scheme, len(body.responses), judgments, [c for c, _ in results],
                                self.model_name)

    async def _reward_listwise(self, settings, body: P.GroupRewardRequest, responses: list[str]):
        """Scheme listwise: one judge call for the whole group, decoded under the permutation (or grades) grammar."""
        n, mode = len(responses), self.prompts.listwise_mode
        messages = self.prompts.listwise_messages(body.prompt, responses, body.dimension, body.locale)
        sampling = P.judge_sampling(self._default_sampling(), settings.limits, body.sampling)
        if settings.judge.constrained:
            sampling = dataclasses.replace(sampling, grammar=listwise_grammar(n, mode, sampling.max_tokens))
        completion, cached = await self._with_deadline(self._complete(messages, sampling), body.timeout_s)
        return R.listwise_response(n, mode, completion, cached, self.model_name)

    async def reward_group_in_cluster(self, body: dict) -> tuple[int, dict]:
        """`POST /reward/group` through a DeploymentHandle, for GRPO's training workers: no HTTP proxy needed on
        their nodes (train.reward_handle). Same validation, limits, deadline and bodies, as (HTTP status, JSON
        body); no bearer token: only processes of the cluster hold a handle, and Ray's auth guards those."""
        self.counters["handle_requests"] += 1
        try:
            request = P.GroupRewardRequest.model_validate(body)
            return 200, (await self.reward_group(request)).model_dump(mode="json")
        except ValidationError as exc:
            return 422, validation_error_body(exc.errors())
        except P.RequestError as exc:
            return 400, error_body(400, str(exc), exc.field)
        except HTTPException as exc:
            return exc.status_code, error_body(exc.status_code, str(exc.detail))


def generate_alone(engine, request: ChatRequest) -> Completion:
    """One request on its own: its failure becomes its own error completion (never the batch's)."""
    try:
        return engine.generate([request])[0]
    except Exception as exc:  # noqa: BLE001 - reported to this request's client, not raised into the others
        return Completion(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------------------------
# Building the app


def deployment_options(cfg: ServeConfig) -> dict:
    """Serve deployment options from the config (also written into `--print-config` YAML)."""
    scaling = cfg.autoscaling
    options = {
        "user_config": cfg.user_config(),
        "max_ongoing_requests": scaling.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": cfg.resources.num_cpus, "num_gpus": cfg.resources.num_gpus},
        # liveness: Serve calls GRMServer.check_health every period; 3 failures in a row replace the replica
        "health_check_period_s": cfg.health.period_s,
        "health_check_timeout_s": cfg.health.timeout_s,
        # a stopping replica finishes its ongoing requests first (up to the timeout), then goes
        "graceful_shutdown_wait_loop_s": cfg.shutdown.wait_loop_s,
        "graceful_shutdown_timeout_s": cfg.shutdown.timeout_s,
        # a rolling restart starts the new replica before stopping the old one: no gap with one replica
        "max_surge_percent": 100,
    }
    if scaling.min_replicas == scaling.max_replicas:
        options["num_replicas"] = scaling.min_replicas
    else:
        options["autoscaling_config"] = {"min_replicas": scaling.min_replicas, "max_replicas": scaling.max_replicas,
                                         "target_ongoing_requests": scaling.target_ongoing_requests}
    return options


def make_deployment(cfg: ServeConfig):
    """The deployment with its options (no secrets: see `make_app`)."""
    return GRMServer.options(**deployment_options(cfg))


def make_app(cfg: ServeConfig):
    """The bound app: the deployment plus the secrets set in this process, as the replicas' constructor argument.

    As for job actors (actors.secrets): workers of a running cluster never saw what this process exported, and a
    runtime env would be written to Ray's logs; configs, `--print-config` and logs keep only variable names.
    """
    return make_deployment(cfg).bind(replica_secrets(cfg))


def check_replicas_fit(cfg: ServeConfig) -> None:
    """Serve would wait for replicas the cluster can never place: refuse them first, naming the keys (or wait,
    bounded, for an autoscaler: `actors.ray_capacity`). Only the replicas it must start (`min_replicas`) count.
    Called by the drivers that deploy (`quorum serve`, policy_grpo), never inside a Serve build task."""
    from actors.ray_capacity import ensure_fits
    from core.resource_fit import Ask

    unit = {"CPU": cfg.resources.num_cpus, "GPU": cfg.resources.num_gpus}
    ensure_fits(Ask("serve", "replicas", cfg.autoscaling.min_replicas, unit,
                    ("autoscaling.min_replicas", "resources.num_cpus", "resources.num_gpus")))


def replica_secrets(cfg: ServeConfig) -> Secrets:
    """The auth token and the judge engine's API key, by the names the config gives."""
    return Secrets([cfg.serve.auth_token_env, *engine_secrets(cfg.judge.engine).names])


def config_from_args(args: dict) -> ServeConfig:
    try:
        cfg = build(ServeConfig, with_defaults(ServeConfig, dict(args)))
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(f"serve app args: {exc}") from exc
    return cfg


def build_app(args: dict):
    """Serve app builder (`import_path: serve.app:build_app`); `args` is a ServeConfig mapping."""
    return make_app(config_from_args(args))
