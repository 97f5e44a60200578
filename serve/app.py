"""The generative reward model (GRM) as a Ray Serve app: one deployment, a FastAPI ingress, the judge behind it.

    quorum serve configs/grm.yaml                                   # local Ray; Ctrl-C stops it
    quorum serve configs/grm.yaml --print-config=grm_serve.yaml     # then: serve deploy grm_serve.yaml

Endpoints: POST /v1/chat/completions (OpenAI-compatible), GET /v1/models, POST /score (pointwise grade),
POST /compare (pairwise grades + preference), POST /reward/group (a reward per response, all_pairs,
vs_reference or listwise: one call ranks the group), POST /openrlhf (OpenRLHF's remote reward-model protocol),
GET /health (liveness), GET /ready (model loaded, its identity), GET /stats (engine mode, judgments in flight or
batch sizes, cache, and per caller the reward-hacking monitors of `serve.monitoring`).
Request formats, parsing and reward maths live in the pure `serve.protocol`, message rendering in `serve.judge_prompts`.

This module holds the routes and the app builders. How a judgment reaches the engine (vLLM's continuous batching
in `judge.engine_mode` async, `@serve.batch` otherwise), the cache, reloads and health live in `serve.judging`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve
from starlette.exceptions import HTTPException

from actors.secrets import Secrets
from actors.stage_config import engine_secrets
from core.config import ConfigError, build, with_defaults
from core.tracking import resolve_mode, wandb_secret_names
from eval.judging.grammar import judge_grammar
from eval.judging.listwise import listwise_grammar
from eval.reward_wire import GroupRewardResponse
from serve import protocol as P
from serve import rewards as R
from serve.config import ReplicaSettings, ServeConfig
from serve.errors import error_body, install_error_handlers, validation_error_body
from serve.guard import admit
from serve.judging import JudgeCore
from serve.monitoring import probe_step

DEPLOYMENT_NAME = "GRMServer"
log = logging.getLogger("ray.serve")

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
class GRMServer(JudgeCore):
    """One replica: the HTTP routes over the judging core (engine, its mode, cache, reloads, health)."""

    def __init__(self, secrets: Secrets | None = None):
        if secrets is not None:
            # the token / judge API key set where the app was deployed (a constructor argument: never logged)
            secrets.install()
        super().__init__()

    def admit(self, request: Request) -> JSONResponse | None:
        """None to let the request through, else the rejection (serve.guard: body size, bearer token)."""
        return admit(request, self.settings, self._token, self.counters)

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
        return self.stats_body()

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
        out = P.score_response(completion, self.model_name, cached, self.prompts.pointwise_format)
        self.record(body.caller, body.prompt, [body.response], [None if out.grade is None else float(out.grade)],
                    failed_judgments=int(out.parse_status != "ok"))
        return out

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
            out = await self._reward_listwise(settings, body, [texts[i] for i in range(len(body.responses))])
            return self._recorded(body, out)
        pairs = R.plan_pairs(len(body.responses), body.scheme, body.both_orders)
        sampling = self._judge_sampling(settings, body.sampling, "pairwise")
        messages = [self.prompts.compare_messages(body.prompt, texts[a], texts[b], body.dimension, body.locale)
                    for a, b in pairs]
        calls = [self._complete(m, sampling) for m in messages]
        results = await self._with_deadline(asyncio.gather(*calls), body.timeout_s)
        judgments = [R.read_judgment(a, b, c, cached) for (a, b), (c, cached) in zip(pairs, results)]
        return self._recorded(body, R.group_response(body.scheme, len(body.responses), judgments,
                                                     [c for c, _ in results], self.model_name))

    def _recorded(self, body: P.GroupRewardRequest, out: GroupRewardResponse) -> GroupRewardResponse:
        """Record a group answer for its caller's monitors (serve.monitoring), as the caller will train on it."""
        if body.caller is not None:
            verdicts = [(j.grade_a, j.grade_b) for j in out.judgments if j.parse_status == "ok"]
            self.record(body.caller, body.prompt, body.responses, R.caller_rewards(out, body.caller.signal), verdicts,
                        out.counts.n_failed_judgments)
        return out

    async def _probe(self, caller: str, step: int) -> None:
        """monitor.probe_path's pairs judged as `/reward/group` judges a pair (all_pairs, both orders; through the
        cache, so an unchanged judge costs nothing after the first step): the preference of the higher mean margin,
        None when no judgment parsed or the request failed (counted wrong), against the gold preference."""
        pairs = self.probe

        async def verdict(pair: dict) -> str | None:
            request = P.GroupRewardRequest(prompt=pair["prompt"], responses=[pair["response_a"], pair["response_b"]],
                                           scheme="all_pairs", both_orders=True, dimension=pair["dimension"],
                                           locale=pair["locale"])
            try:
                margins = (await self.reward_group(request)).rewards
            except (HTTPException, P.RequestError, ValueError):
                return None
            if None in margins:
                return None
            return "tie" if margins[0] == margins[1] else "A" if margins[0] > margins[1] else "B"

        try:
            predicted = await asyncio.gather(*[verdict(pair) for pair in pairs])
            monitor = self.ledger.callers.get(caller)
            if monitor is None:  # dropped past monitor.max_callers meanwhile
                return
            metrics = probe_step(monitor, step, list(predicted), [pair["gold"] for pair in pairs])
        except Exception as exc:  # noqa: BLE001 - a background task: its failure is counted and logged, never lost
            self.counters["probe_errors"] += 1
            log.warning("the probe run after step %s of caller %s failed: %s: %s", step, caller,
                        type(exc).__name__, exc)
            return
        self.counters["probe_runs"] += 1
        if self.sink is not None:
            self.sink.put([(caller, step, metrics)])

    @api.post("/openrlhf")
    async def openrlhf(self, body: P.OpenRLHFRequest, scheme: str = "score", signal: str = "own_grade",
                       caller: str | None = None, dimension: str | None = None, locale: str | None = None,
                       failed_reward: float | None = None) -> dict:
        """OpenRLHF's remote reward model (`--reward.remote_url http://HOST:PORT/openrlhf?...`): one reward per
        query, each response recovered from its query and prompt (`P.openrlhf_response`). Query parameters
        (OpenRLHF sends only the URL): `scheme` score (each response graded alone, reward = its grade),
        vs_reference (judged against its label), all_pairs | listwise (the queries of this request that share a
        prompt form a group); `signal` own_grade | margin for the pairwise schemes; `caller` names the run for the
        monitors; `failed_reward`: the reward of a response whose judgment failed, counted in `extra_logs`
        `quorum_failed` (omitted: such a request is answered 502, OpenRLHF retries it and then has no reward)."""
        settings = self._ready_settings()
        P.check_openrlhf(body, settings.limits)
        if scheme not in P.OPENRLHF_SCHEMES:
            raise P.RequestError("scheme", f"{scheme!r} is not one of {P.OPENRLHF_SCHEMES}")
        if signal not in ("own_grade", "margin"):
            raise P.RequestError("signal", f"{signal!r} is not own_grade or margin")
        if failed_reward is not None and not math.isfinite(failed_reward):
            raise P.RequestError("failed_reward", f"must be a finite number, got {failed_reward}")
        tag = None if caller is None else P.CallerTag(name=caller, signal=signal)
        context = {"dimension": dimension, "locale": locale, "caller": tag}
        responses = [P.openrlhf_response(q, p, f"query[{i}]") for i, (q, p) in enumerate(zip(body.query, body.prompts))]
        rewards: list[float | None] = [None] * len(responses)
        failures: list[str] = [""] * len(responses)
        if scheme == "score":
            outs = await asyncio.gather(*[self.score(P.ScoreRequest(prompt=p, response=r, **context))
                                          for p, r in zip(body.prompts, responses)])
            for i, out in enumerate(outs):
                rewards[i] = None if out.grade is None else float(out.grade)
                failures[i] = out.parse_status
        else:
            groups: dict[str, list[int]] = {}
            for i, prompt in enumerate(body.prompts):
                # vs_reference judges each row against its own label; the group schemes group a prompt's rows
                groups.setdefault(str(i) if scheme == "vs_reference" else prompt, []).append(i)
            requests = []
            for rows in groups.values():
                reference = None
                if scheme == "vs_reference":
                    reference = (body.labels or [None] * len(responses))[rows[0]]
                    if not isinstance(reference, str) or not reference.strip():
                        raise P.RequestError(f"labels[{rows[0]}]", "scheme vs_reference judges against the label: "
                                                                   "it must be a non-empty string")
                requests.append(P.GroupRewardRequest(prompt=body.prompts[rows[0]], responses=[responses[i] for i in rows],
                                                     reference=reference, scheme=scheme, **context))
            for request in requests:
                P.check_group(request, settings.limits)  # every group acceptable before any is judged
            outs = await asyncio.gather(*[self.reward_group(r) for r in requests])
            for rows, out in zip(groups.values(), outs):
                values = R.caller_rewards(out, signal)
                for k, i in enumerate(rows):
                    rewards[i] = values[k]
                    failures[i] = "ok" if values[k] is not None else "; ".join(out.items[k].errors) or "failed"
        failed = [r is None for r in rewards]
        if any(failed) and failed_reward is None:
            first = failed.index(True)
            raise HTTPException(502, f"the judgment of query[{first}] failed ({failures[first]}) and the URL sets "
                                     "no failed_reward")
        self.counters["openrlhf_failed"] += sum(failed)
        final = [failed_reward if r is None else r for r in rewards]
        return {"rewards": final, "scores": final,
                "extra_logs": {"quorum_failed": [float(f) for f in failed]}}

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
        their nodes (train.grpo.reward.handle). Same validation, limits, deadline and bodies, as (HTTP status, JSON
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
    """The auth token, the judge engine's API key and (monitors logged to W&B online) the W&B key, by name."""
    wandb_key = wandb_secret_names(resolve_mode(cfg.wandb.mode)) if cfg.wandb.on else []
    return Secrets([cfg.serve.auth_token_env, *engine_secrets(cfg.judge.engine).names, *wandb_key])


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
