"""Config of the generative reward model (GRM) Serve app, loaded from YAML like every job config.

    quorum serve configs/grm.yaml [key=value ...]

Two parts with different update paths:

- `ReplicaSettings` (judge model + adapter, prompts, sampling, batching, limits, cache, request timeout, auth env
  name) travels to every replica as the deployment's `user_config`. With `serve deploy` a change of it is applied
  in place by `GRMServer.reconfigure` (no replica restart); `quorum serve` re-runs roll the replicas instead.
- The rest (HTTP host/port, route prefix, app name, autoscaling, per-replica resources, health-check period and
  timeout, graceful shutdown, Ray address) shapes the deployment itself. `health` travels both ways: its period and
  timeout are deployment options, its probe settings are read by the replica's `check_health`.

Secrets never appear here: `serve.auth_token_env` is the *name* of the environment variable holding the token.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.engines.base import EngineSpec
from actors.engines.vllm_sync import check_extra_args
from actors.stage_config import SamplingConfig
from core.config import Section, check_tree, dotted, fail, in_range, one_of, positive
from core.ray_env import RayConfig
from core.resource_fit import Ask
from serve import judge_prompts, protocol
from serve.monitor_sink import ServiceWandbConfig
from serve.monitoring import ServiceMonitorConfig


def run_app_name(app_name: str, run_id: str) -> str:
    """The Serve application a job deploys for one run: `serve.app_name` and the run id, so two runs never share
    (or delete) one app. Characters a route prefix or an actor name would not take become ``-``.

    >>> run_app_name("grm-policy-grpo", "policy_grpo_cluster"), run_app_name("grm", "a b/c")
    ('grm-policy-grpo-policy_grpo_cluster', 'grm-a-b-c')
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-") or "run"
    return f"{app_name}-{safe}"


def run_route_prefix(route_prefix: str, app: str) -> str:
    """A run's app under its own route prefix (Serve refuses a second app on a prefix another app holds).

    >>> run_route_prefix("/", "grm-r1"), run_route_prefix("/grpo/", "grm-r1")
    ('/grm-r1', '/grpo/grm-r1')
    """
    return f"{route_prefix.rstrip('/')}/{app}"


@dataclass
class HTTPConfig:
    # address the Serve HTTP proxy binds; 127.0.0.1 keeps it on loopback, 0.0.0.0 exposes it
    host: str = "127.0.0.1"
    port: int = 8000  # TCP port of the Serve HTTP proxy, 1..65535
    # URL prefix of this app (several Serve apps can share one proxy)
    route_prefix: str = "/"
    # Serve application name; re-running `quorum serve` with the same name updates that app. policy_grpo deploys
    # its own app per run: <app_name>-<run id>, under the route prefix <route_prefix>/<that name>
    app_name: str = "grm"
    # per-request deadline inside the replica; a request past it gets 504 (a client may ask for less)
    request_timeout_s: float = 120.0
    # name of the environment variable holding the bearer token ("" = no auth); read by the replicas
    auth_token_env: str = ""


@dataclass
class JudgeConfig:
    engine: EngineSpec = field(default_factory=lambda: EngineSpec(kind="hf", model="smollm2-135m"))
    # LoRA adapter directory saved by peft `save_pretrained` (e.g. <run>/adapter); "" = base model only
    adapter: str = ""
    # model name reported by /v1/chat/completions; "" = the engine's model name
    served_name: str = ""
    # drop <think>...</think> from policy responses before they are shown to the judge (MENLO §5)
    strip_think: bool = True
    # decode verdicts under their format's grammar (eval.judging.grammar: /score's pointwise format, MENLO's grade
    # blocks for /compare and /reward/group), so every finished answer parses; false = free text, as the papers
    constrained: bool = True
    # how a replica runs the judge. async (vllm only): each judgment goes straight to vLLM's AsyncLLM and joins
    # the running batch at once (continuous batching), the adapter is a LoRA request per call, and an adapter
    # change swaps it without reloading the model. batch: @serve.batch groups judgments into one engine call
    # (`batching`), the adapter merged into the weights at load. auto: async for vllm, batch for hf and openai
    # (hf decodes a static batch; openai has its own server batching behind a bounded client)
    engine_mode: str = "auto"
    # further vLLM engine arguments of a vllm judge (AsyncEngineArgs / vllm.LLM keywords, e.g. enforce_eager: true,
    # max_num_seqs: 128); keys the engine spec sets (model, dtype, max_model_len, LoRA slots, ...) are refused
    vllm_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptsConfig:
    # pointwise template (configs/prompts/<name>.yaml or a path)
    pointwise: str = "jury_score"
    # how /score reads the pointwise judge: "answer" (paper 001's "Answer: [k]", parse_score) or "menlo"
    # (paper 003's <final_grade> FINAL GRADE: k - LABEL </final_grade>, parse_menlo_grade)
    pointwise_format: str = "answer"
    # request field -> template variable; fields: prompt, response and optionally reference
    pointwise_vars: dict[str, str] = field(
        default_factory=lambda: {"prompt": "base_sentence", "response": "new_sentence"})
    # pairwise template, parsed with eval.judging.menlo_parse.parse_menlo_grades
    pairwise: str = "jury_pairwise"
    # request field -> template variable; fields: prompt, response_a, response_b
    pairwise_vars: dict[str, str] = field(
        default_factory=lambda: {"prompt": "source", "response_a": "candidate_a", "response_b": "candidate_b"})
    # MENLO rubrics (configs/data/menlo_rubrics.yaml); needed when a template declares dimension/question/criteria,
    # which are then filled from the request's `dimension`; `locale` comes from the request
    rubrics: str = ""
    # render the dimension's graded criteria (true) or only the five labels (false), as judge_eval's `rubric`
    with_rubric: bool = True
    # listwise template for /reward/group's scheme "listwise" (one call ranks the whole group; quorum's extension,
    # the paper judges pairs): e.g. menlo_listwise; "" = the server refuses that scheme
    listwise: str = ""
    # rank: the judge orders the group (reward = normalised rank); grade: it grades each response 1..5 in one call
    # (reward = (grade - 1) / 4)
    listwise_mode: str = "rank"


@dataclass
class BatchingConfig:
    # judge generations per engine call (@serve.batch); 1 turns batching off
    max_batch_size: int = 8
    # how long a replica waits to fill a batch
    batch_wait_timeout_s: float = 0.05


@dataclass
class AutoscalingConfig(Section):
    # min_replicas == max_replicas: a fixed number of replicas (no autoscaling)
    min_replicas: int = 1
    max_replicas: int = 1  # most replicas Serve scales up to (>= min_replicas)
    # Serve adds replicas when ongoing requests per replica exceed this
    target_ongoing_requests: float = 8.0
    # HTTP requests one replica accepts at once; must be >= batching.max_batch_size to fill batches
    max_ongoing_requests: int = 64

    def check(self, where: str = "") -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            fail(dotted(where, "min_replicas"), f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}.."
                                                f"{self.max_replicas}")
        positive(self.target_ongoing_requests, dotted(where, "target_ongoing_requests"))
        positive(self.max_ongoing_requests, dotted(where, "max_ongoing_requests"))


@dataclass
class HealthConfig(Section):
    """Liveness of a replica. Serve calls `GRMServer.check_health` every `period_s`; a call that raises or outlasts
    `timeout_s` is a failure, and after 3 in a row (Ray's REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD) the controller
    kills the replica and starts a new one. A dead replica actor is noticed at the next period."""

    period_s: float = 10.0  # seconds between two health checks of a replica (> 0)
    timeout_s: float = 30.0  # seconds a health check may take before it counts as a failure (> 0)
    # while idle, check_health generates one token of a fixed prompt, so "healthy" means the engine answers (local
    # engines only: a hosted `openai` judge is not called every period); false = loaded is enough
    probe: bool = True
    # an engine call (one batch; in judge.engine_mode async, the oldest judgment in flight) running longer than
    # this is a wedged replica; 0 = no limit. Must be >= serve.request_timeout_s: a call may legitimately take that
    # long
    max_engine_call_s: float = 600.0

    def check(self, where: str = "") -> None:
        positive(self.period_s, dotted(where, "period_s"))
        positive(self.timeout_s, dotted(where, "timeout_s"))


@dataclass
class ShutdownConfig(Section):
    """A replica being stopped (scale-down, rolling update, `serve delete`) first stops taking requests, then waits
    for its ongoing ones, checking every `wait_loop_s`, at most `timeout_s` before it is killed."""

    wait_loop_s: float = 2.0  # seconds between two checks for ongoing requests of a stopping replica (> 0)
    # must cover serve.request_timeout_s, or a rolling update cuts requests the deadline still allows
    timeout_s: float = 130.0

    def check(self, where: str = "") -> None:
        positive(self.wait_loop_s, dotted(where, "wait_loop_s"))
        positive(self.timeout_s, dotted(where, "timeout_s"))


@dataclass
class ResourcesConfig:
    # ray_actor_options of each replica
    num_cpus: float = 1.0
    num_gpus: float = 0.0  # GPUs per replica; 0 = CPU; a vllm judge needs >= its engine.tensor_parallel_size


@dataclass
class ReplicaSettings:
    """Everything a replica reads from `user_config` (see module docstring)."""

    judge: JudgeConfig = field(default_factory=JudgeConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_tokens=256))
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: protocol.Limits = field(default_factory=protocol.Limits)
    # LRU entries of (model identity, rendered prompt, sampling) -> completion; 0 = no cache
    cache_size: int = 1024
    request_timeout_s: float = 120.0
    auth_token_env: str = ""
    health: HealthConfig = field(default_factory=HealthConfig)
    monitor: ServiceMonitorConfig = field(default_factory=ServiceMonitorConfig)
    wandb: ServiceWandbConfig = field(default_factory=ServiceWandbConfig)


@dataclass
class ServeConfig:
    serve: HTTPConfig = field(default_factory=HTTPConfig)  # the HTTP proxy, route, app name, deadline and auth
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster the app is deployed on
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # the judge model: engine, LoRA adapter, verdict decoding
    prompts: PromptsConfig = field(default_factory=PromptsConfig)  # judge templates, their variables and rubrics
    # the judge's decoding settings (max_tokens 256 by default)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_tokens=256))
    batching: BatchingConfig = field(default_factory=BatchingConfig)  # Serve's dynamic batching of judge calls
    autoscaling: AutoscalingConfig = field(default_factory=AutoscalingConfig)  # replica count and per-replica load
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)  # CPUs and GPUs of each replica
    health: HealthConfig = field(default_factory=HealthConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    limits: protocol.Limits = field(default_factory=protocol.Limits)  # request size limits (refused past them)
    # LRU entries of (model identity, rendered prompt, sampling) -> completion per replica; 0 = no cache
    cache_size: int = 1024
    # reward-hacking monitors per caller (serve.monitoring): requests that name a `caller` are recorded and monitored
    monitor: ServiceMonitorConfig = field(default_factory=ServiceMonitorConfig)
    # W&B runs of the monitors, one per caller (serve.monitor_sink); off by default for the service
    wandb: ServiceWandbConfig = field(default_factory=ServiceWandbConfig)

    def replicas_ask(self, key_prefix: str = "") -> Ask:
        """What Serve must place before the app runs: `min_replicas` replicas of `resources` (`max_replicas` is a
        ceiling Serve's autoscaler grows towards as the cluster makes room, not a reservation). `key_prefix` names
        where a job sets this config (policy GRPO: ``grm.overrides: ``)."""
        unit = {"CPU": float(self.resources.num_cpus), "GPU": float(self.resources.num_gpus)}
        keys = ("autoscaling.min_replicas", "resources.num_cpus", *(("resources.num_gpus",) if unit["GPU"] else ()))
        return Ask("serve", "replicas", self.autoscaling.min_replicas, unit, tuple(key_prefix + k for k in keys))

    def validate(self) -> None:
        """The rules across sections (check_tree has run every section's own `check` and the number floors)."""
        http = self.serve
        in_range(http.port, 1, 65535, "serve.port")
        if not http.route_prefix.startswith("/"):
            fail("serve.route_prefix", f"must start with '/', got {http.route_prefix!r}")
        if not http.app_name.strip():
            fail("serve.app_name", "must be a non-empty string")
        positive(http.request_timeout_s, "serve.request_timeout_s")
        validate_replica_settings(self.replica_settings())
        scaling = self.autoscaling
        if scaling.max_ongoing_requests < self.batching.max_batch_size:
            fail("autoscaling.max_ongoing_requests", f"{scaling.max_ongoing_requests} must be >= "
                 f"batching.max_batch_size ({self.batching.max_batch_size}) or batches never fill")
        engine = self.judge.engine
        # judge.engine.device cpu: vLLM's CPU build (the optional vLLM-CPU tier and bench/judge_service.py)
        if engine.kind == "vllm" and engine.device != "cpu" and self.resources.num_gpus < engine.tensor_parallel_size:
            fail("resources.num_gpus", f"{self.resources.num_gpus} must cover judge.engine.tensor_parallel_size "
                                       f"({engine.tensor_parallel_size}) for vllm (or judge.engine.device cpu "
                                       "for vLLM's CPU build)")
        if self.shutdown.timeout_s < http.request_timeout_s:
            fail("shutdown.timeout_s", f"{self.shutdown.timeout_s:g} must be >= serve.request_timeout_s "
                 f"({http.request_timeout_s:g}) or a rolling update cuts requests their deadline still allows")
        limit = self.health.max_engine_call_s
        if limit and limit < http.request_timeout_s:
            fail("health.max_engine_call_s", f"{limit:g} must be 0 or >= serve.request_timeout_s "
                 f"({http.request_timeout_s:g}): a batch may run that long")

    def replica_settings(self) -> ReplicaSettings:
        return ReplicaSettings(
            judge=self.judge, prompts=self.prompts, sampling=self.sampling, batching=self.batching,
            limits=self.limits, cache_size=self.cache_size, request_timeout_s=self.serve.request_timeout_s,
            auth_token_env=self.serve.auth_token_env, health=self.health, monitor=self.monitor,
            wandb=self.wandb,
        )

    def user_config(self) -> dict:
        """The JSON-able `user_config` of the deployment (paths made absolute: replicas run elsewhere)."""
        settings = self.replica_settings()
        data = dataclasses.asdict(settings)
        data["judge"]["adapter"] = absolute(settings.judge.adapter)
        data["judge"]["engine"]["model"] = absolute_if_path(settings.judge.engine.model)
        for key in ("pointwise", "pairwise", "listwise"):
            data["prompts"][key] = absolute_if_path(getattr(settings.prompts, key))
        data["prompts"]["rubrics"] = absolute(settings.prompts.rubrics)
        data["monitor"]["probe_path"] = absolute(settings.monitor.probe_path)
        return data


def validate_replica_settings(settings: ReplicaSettings) -> None:
    """Checks shared by the driver (before deploying) and each replica (on every reconfigure)."""
    # the same section checks as every job config (sampling, engine, numbers), for a hand-edited user_config too
    # (batch_wait_timeout_s, cache_size >= 0: check_tree's floor; limits: their own `check`)
    check_tree(settings)
    judge = settings.judge
    one_of(judge.engine.kind, ("hf", "vllm", "openai"), "judge.engine.kind")
    check_engine_mode(judge)
    if judge.adapter:
        if judge.engine.kind == "openai":
            fail("judge.adapter", "a LoRA adapter needs a local engine (hf or vllm), not openai")
        check_adapter_dir(judge.adapter)
    load_prompts(settings.prompts)
    if settings.batching.max_batch_size < 1:
        fail("batching.max_batch_size", f"must be >= 1, got {settings.batching.max_batch_size}")
    in_range(settings.sampling.max_tokens, 1, settings.limits.max_tokens, "sampling.max_tokens")


ENGINE_MODES = ("auto", "async", "batch")


def check_engine_mode(judge: JudgeConfig) -> None:
    """`judge.engine_mode` and `judge.vllm_args` against the engine kind (errors name the dotted key)."""
    one_of(judge.engine_mode, ENGINE_MODES, "judge.engine_mode")
    vllm = judge.engine.kind == "vllm"
    if judge.engine_mode == "async" and not vllm:
        fail("judge.engine_mode", f"async runs vLLM's AsyncLLM and needs judge.engine.kind vllm, got "
                                  f"{judge.engine.kind!r} (use auto or batch)")
    if judge.vllm_args and not vllm:
        fail("judge.vllm_args", f"vLLM engine arguments need judge.engine.kind vllm, got {judge.engine.kind!r}")
    try:
        check_extra_args(judge.vllm_args, "judge.vllm_args")
    except ValueError as exc:
        fail(*str(exc).split(": ", 1))
    if judge_engine_mode(judge) == "async" and judge.adapter and judge.engine.adapter:
        fail("judge.engine.adapter", "set one adapter: judge.adapter (served as a LoRA request per call)")


def judge_engine_mode(judge: JudgeConfig) -> str:
    """"async" or "batch": how a replica runs this judge (`JudgeConfig.engine_mode`, auto resolved by kind).

    >>> judge_engine_mode(JudgeConfig(engine=EngineSpec(kind="vllm")))
    'async'
    >>> judge_engine_mode(JudgeConfig(engine=EngineSpec(kind="hf")))
    'batch'
    """
    if judge.engine_mode == "auto":
        return "async" if judge.engine.kind == "vllm" else "batch"
    return judge.engine_mode


def load_prompts(prompts: PromptsConfig) -> judge_prompts.JudgePrompts:
    return judge_prompts.load_judge_prompts(prompts.pointwise, prompts.pointwise_vars, prompts.pairwise,
                                       prompts.pairwise_vars, prompts.pointwise_format, prompts.rubrics,
                                       prompts.with_rubric, prompts.listwise, prompts.listwise_mode)


def check_adapter_dir(path: str) -> None:
    """A peft adapter directory has adapter_config.json and adapter weights."""
    adapter = Path(path).expanduser()
    if not (adapter / "adapter_config.json").is_file():
        fail("judge.adapter", f"{path} has no adapter_config.json (expected a peft save_pretrained dir)")
    if not any(adapter.glob("adapter_model.*")):
        fail("judge.adapter", f"{path} has no adapter_model.safetensors / .bin weights")


def absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if path else ""


def absolute_if_path(spec: str) -> str:
    """Local paths become absolute; names (`smollm2-135m`, `hf:org/repo`, `jury_score`) pass through."""
    return absolute(spec) if ("/" in spec or spec.endswith((".yaml", ".yml"))) and not spec.startswith("hf:") else spec
