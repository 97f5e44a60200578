"""What a job config takes on the cluster it is written for, and what cannot run there (`quorum plan`'s report,
`jobs.plan`; `preflight`, the same check `quorum run` and `quorum submit` make before any work). No Ray, no GPU.

- stages: per stage, what it places at once (Ray Train workers, Ray Data pools, Serve replicas, the driver), on
  which node type of the cluster file (`core.cluster_nodes`), and how many of those nodes;
- GPU memory: per GPU and phase, every trainer's worker (`train.memory_budget`: a GRPO worker with its colocated
  rollout engine, a preference / SFT worker's update) and every vLLM engine (Ray Data pools' actors, Serve
  replicas: `train.engine_memory`), the KV cache also as full sequences of the engine's `max_model_len`; with
  optimizer offload, its estimated cost per optimizer step (`train.offload_cost`);
- timeouts: the collective timeout against the worst reward wait, Serve's request and shutdown timeouts;
- storage: where results, checkpoints, adapters and models live.

Refusals, each (dotted key, message): a stage no node type can hold (`core.resource_fit.verdict_all`), a trainer's
worker or vLLM engine its GPU cannot hold, a LoRA rank above vLLM's largest `max_lora_rank`, a trainer's `gpu_type`
no node type has. The config's own checks (reward waits, Serve timeouts, the trainers' budgets) run when it is
loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from core.cluster_nodes import ClusterNode, node_types
from core.config import ConfigError
from core.resource_fit import REFUSE, Capacity, NodeType, describe, units_on, verdict_all
from jobs.placement import groups, walk
from serve.config import ServeConfig
from train.engine_memory import EngineFit, rank_problems, weight_bytes
from train.engine_memory import problems as engine_problems
from train.memory_budget import GPU_MEMORY_MIB, RESIDENT_PARTS, VLLM_LORA_RANK_SLOTS, budget
from train.memory_budget import problems as worker_problems
from train.model_shape import ModelShape, model_shape, shape_from_hf_config
from train.offload_cost import describe as describe_offload
from train.offload_cost import offload_cost

CLUSTER_ENV = "QUORUM_CLUSTER"
DEFAULT_CLUSTER = Path(__file__).resolve().parents[1] / "cluster.yaml"


def cluster_path(given: str = "") -> Path:
    return Path(given or os.environ.get(CLUSTER_ENV) or DEFAULT_CLUSTER)


@dataclasses.dataclass
class Report:
    cluster: str
    stages: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    memory: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    timeouts: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    storage: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# Stages: every group of asks against the node types


def _capacity(nodes: list[ClusterNode]) -> Capacity:
    return Capacity(nodes=(), node_types=tuple(NodeType(n.name, n.resources, n.max_count) for n in nodes if not n.head))


def node_for(unit: dict, nodes: list[ClusterNode]) -> ClusterNode | None:
    """The node type Ray would place one unit on: the first worker type that holds it, GPU types only for GPU asks."""
    gpu = unit.get("GPU", 0.0) > 0
    for node in nodes:
        if not node.head and (node.gpus > 0) == gpu and units_on(node.resources, unit) >= 1:
            return node
    return next((n for n in nodes if not n.head and units_on(n.resources, unit) >= 1), None)


def add_stages(report: Report, cfg: Any, nodes: list[ClusterNode]) -> None:
    cap = _capacity(nodes)
    for group in groups(cfg):
        verdict = verdict_all(group, cap)
        if verdict.kind == REFUSE:
            report.problems.append((", ".join(k for ask in group for k in ask.keys[:1]), verdict.message))
        for ask in group:
            node = node_for(dict(ask.unit), nodes)
            per = units_on(node.resources, ask.unit) if node else 0
            where = (f"{math.ceil(ask.count / per) if per != math.inf else 1} x {node.name} ({node.instance_type}"
                     + (f", {node.gpus} x {node.gpu_model or '?'}" if node.gpus else "") + ")") if node else "none"
            report.stages.append((describe(ask), where))
    report.stages.append(("driver: the job's entrypoint (`ray job submit --entrypoint-num-cpus 1`), no GPU",
                          "a CPU node"))


# ---------------------------------------------------------------------------------------------------------------
# GPU memory


def engine_shape(model: str, hub_cache: str) -> tuple[ModelShape | None, dict, str]:
    """(shape, config.json, where it came from) of an engine's model: a local directory's config.json, the staged
    snapshot's under `hub_cache`, else `train.model_shape.model_shape`'s known hub ids ({} as config.json)."""
    spec = model.removeprefix("hf:")
    found = Path(spec).expanduser() / "config.json"
    if not found.is_file() and model.startswith("hf:") and hub_cache:
        from core.model_store import snapshot_dir

        snapshot = snapshot_dir(spec, hub_cache)
        found = snapshot / "config.json" if snapshot else found
    if found.is_file():
        try:
            config = json.loads(found.read_text(encoding="utf-8"))
            return shape_from_hf_config(config), config, str(found)
        except (KeyError, TypeError, ValueError):
            pass  # not a Llama-style decoder's config.json: the known hub ids may still tell
    shape = model_shape(model)
    return shape, {}, "train/model_shape.py KNOWN_MODELS" if shape else ""


def adapter_rank(adapter: str) -> int:
    """The LoRA rank of a peft adapter directory that exists here; 0 otherwise (on the cluster's storage only)."""
    path = Path(adapter).expanduser() / "adapter_config.json"
    try:
        return int(json.loads(path.read_text(encoding="utf-8")).get("r", 0)) if adapter and path.is_file() else 0
    except (ValueError, OSError):
        return 0


def _pool_of(key: str, pools: dict[str, Any]) -> str:
    """The pool whose actors hold the engine at `key`: its section's `pool`, an enclosing section's, else the job's
    only GPU pool (an engine the job puts beside another in one actor, as CRAFT's reviser)."""
    parts = key.split(".")
    for end in range(len(parts) - 1, -1, -1):
        candidate = ".".join([*parts[:end], "pool"])
        if candidate in pools:
            return candidate
    gpu_pools = [k for k, p in pools.items() if p.num_gpus]
    return gpu_pools[0] if len(gpu_pools) == 1 else ""


def vllm_engines(cfg: Any, prefix: str = "") -> list[tuple[str, Any, float, str, str, str]]:
    """(key, EngineSpec, GPUs of its actor or replica, adapter, adapter's key, the pool's key: "" for a Serve
    replica, which checks its own GPUs) of every vLLM engine of `cfg`."""
    from actors.engines.base import EngineSpec
    from actors.stage_config import PoolConfig

    tree = list(walk(cfg))
    pools = {k: n for k, n in tree if isinstance(n, PoolConfig)}
    out = []
    for key, node in tree:
        if isinstance(node, EngineSpec) and node.kind == "vllm":
            if isinstance(cfg, ServeConfig):
                gpus, adapter, adapter_key = float(cfg.resources.num_gpus), cfg.judge.adapter, "judge.adapter"
                pool_key = ""
            else:
                pool_key = _pool_of(key, pools)
                pool = pools.get(pool_key)
                gpus, adapter, adapter_key = (pool.num_gpus if pool else 0.0), node.adapter, f"{key}.adapter"
            out.append((prefix + key, node, gpus, adapter, prefix + adapter_key, pool_key))
    return out


def _gpu_of(gpus: float, nodes: list[ClusterNode]) -> str:
    node = node_for({"GPU": gpus or 1.0}, nodes)
    return node.gpu_model if node and node.gpu_model in GPU_MEMORY_MIB else ""


def add_engines(report: Report, cfg: Any, nodes: list[ClusterNode]) -> None:
    engines = vllm_engines(cfg)
    serve_cfg = _served(cfg)
    if serve_cfg is not None:
        engines += vllm_engines(serve_cfg, "grm.overrides: ")
    hub_cache = cfg.ray.models.hub_cache() if cfg.ray.models.hf_home else ""
    for key, spec, gpus, adapter, adapter_key, pool_key in engines:
        report.problems += rank_problems(adapter_rank(adapter), adapter_key)
        label = f"{key} ({spec.model}, tp {spec.tensor_parallel_size})"
        if spec.device == "cpu":
            report.memory.append((label, "-", "vLLM's CPU build: no GPU"))
            continue
        if pool_key and gpus < spec.tensor_parallel_size:
            report.problems.append((f"{pool_key}.num_gpus", (
                f"{gpus:g} GPUs per actor cannot hold {key}: vLLM shards it over tensor_parallel_size "
                f"{spec.tensor_parallel_size} GPUs of its actor; give the pool that many")))
        gpu = _gpu_of(gpus, nodes)
        shape, hf_config, source = engine_shape(spec.model, hub_cache)
        if not gpu or shape is None:
            why = "no GPU node type of known memory holds it" if not gpu else (
                "model shape unknown: stage it (`quorum stage-models`) so its config.json is read")
            report.memory.append((label, "-", "not checked: " + why))
            report.notes.append(f"{key}: GPU memory not checked ({why})")
            continue
        fit = EngineFit(shape, gpu, spec.tensor_parallel_size, spec.gpu_memory_utilization, spec.max_model_len,
                        weight_bytes(hf_config, spec.dtype), min(adapter_rank(adapter), VLLM_LORA_RANK_SLOTS[-1]))
        report.memory.append(engine_row(label, fit, source))
        report.problems += engine_problems(fit, key)


def engine_row(label: str, fit: EngineFit, source: str) -> tuple[str, str, str]:
    b = fit.budget()
    return (label, f"{b['share']:.2f} of {b['share'] / fit.utilization:.2f} ({fit.gpu_type})", (
        f"weights {b['weights']:.2f} + LoRA slot {b['lora_slot']:.2f} + reserve {b['reserve']:.2f} + KV cache "
        f"{b['kv_cache']:.2f} = {b['sequences']:.1f} full {fit.max_model_len}-token sequences (shape: {source})"))


def _served(cfg: Any) -> ServeConfig | None:
    """The GRM app a policy-GRPO job deploys itself (none when it calls one at reward.url)."""
    reward = getattr(cfg, "reward", None)
    if hasattr(cfg, "serve_config") and not isinstance(cfg, ServeConfig) and not getattr(reward, "url", "x"):
        return cfg.serve_config()
    return None


def add_trainers(report: Report, cfg: Any, nodes: list[ClusterNode]) -> None:
    from train.config import GRPOConfig, TrainerBase

    cluster_gpus = {n.gpu_model for n in nodes if n.gpus}
    for key, node in walk(cfg):
        if not isinstance(node, TrainerBase) or not node.use_gpu:
            continue
        if node.gpu_type and node.gpu_type not in cluster_gpus:
            report.problems.append((f"{key}.gpu_type", (f"{node.gpu_type} is not the GPU of any node type of "
                                                       f"{report.cluster} ({', '.join(sorted(cluster_gpus)) or 'none'})")))
        plan = node.memory_plan()
        # a GRPO worker without a gpu_type is checked against the cluster's GPU; a preference / SFT worker against
        # the gpu_type its config names (as its own check at load)
        grpo = isinstance(node, GRPOConfig)
        if plan is None and grpo and not node.gpu_type and _gpu_of(1, nodes):
            plan = dataclasses.replace(node, gpu_type=_gpu_of(1, nodes)).memory_plan()
        if plan is None:
            why = ("a preference / SFT trainer is checked against the gpu_type it names" if not grpo and not
                   node.gpu_type else "the GPU memory budget covers trainers of a known model shape")
            report.memory.append((f"{key} ({node.model}, {node.num_workers} workers)", "-", "not checked: " + why))
            continue
        b = budget(plan)
        label = f"{key} worker ({node.model}, ZeRO-{plan.zero_stage}, " + (
            f"LoRA r {plan.lora_r})" if plan.lora_r else "full fine-tuning)")
        resident = sum(b.parts.get(n, 0.0) for n in RESIDENT_PARTS)
        if plan.rollout_kind != "none":
            report.memory.append((label + ": rollout", f"{b.rollout_gib:.2f} of {b.gpu_gib:.2f} ({plan.gpu_type})",
                                  f"DeepSpeed resident {resident:.2f} (" + _parts(b.parts, RESIDENT_PARTS) + ") + "
                                  + (f"vLLM share {plan.gpu_memory_utilization * b.gpu_gib:.2f}"
                                     if plan.rollout_kind == "vllm" else "HF generate's gathered weights and KV cache")))
        update = ("zero3_gathered", "zero3_head_copy", "zero2_reduce_bucket", "activations", "attention_mask", "logits",
                  "vllm_during_update")
        report.memory.append((label + ": update", f"{b.update_gib:.2f} of {b.gpu_gib:.2f} ({plan.gpu_type})",
                              f"DeepSpeed resident {resident:.2f} " + (
                                  "" if plan.rollout_kind != "none" else f"({_parts(b.parts, RESIDENT_PARTS)}) ")
                              + "+ " + _parts(b.parts, update)))
        report.problems += [(f"{key}.{k}", m) for k, m in worker_problems(plan)]
        cost = offload_cost(plan)
        if cost is not None:
            report.notes.append(describe_offload(cost, key, node.optimizer_steps_per_step))
        if plan.rollout_kind == "vllm":
            report.problems += rank_problems(plan.lora_r, f"{key}.lora.r")
            # the colocated engine's share while it samples, itemised like a pool's engine (its fit is the budget's)
            engine = EngineFit(plan.shape, plan.gpu_type, 1, plan.gpu_memory_utilization,
                               plan.max_prompt_length + plan.max_completion_length,
                               lora_rank=min(plan.lora_r, VLLM_LORA_RANK_SLOTS[-1]), lora_targets=plan.lora_targets)
            report.memory.append(engine_row(f"{key}.rollout engine (colocated, asleep in the update)", engine,
                                            "train/model_shape.py"))


def _parts(parts: dict[str, float], names) -> str:
    return ", ".join(f"{n} {parts[n]:.2f}" for n in names if parts.get(n))


# ---------------------------------------------------------------------------------------------------------------
# Timeouts and storage


def add_timeouts(report: Report, cfg: Any) -> None:
    from train.config import GRPOConfig
    from train.grpo.reward.client import RewardServiceConfig
    from train.grpo.reward.wait import step_wait

    for key, node in walk(cfg):
        if isinstance(node, GRPOConfig):
            report.timeouts.append((f"{key}.collective_timeout_s", f"{node.collective_timeout_s:g} s",
                                    "the longest a rank waits in a collective for the others"))
    reward = getattr(cfg, "reward", None)
    grpo = getattr(cfg, "grpo", None)
    if isinstance(reward, RewardServiceConfig) and isinstance(grpo, GRPOConfig):
        wait = step_wait(grpo, reward)
        worst = reward.worst_wait_s()
        report.timeouts.append(("reward.timeout_s x (retries + 1) + back-offs", f"{worst:g} s",
                                "one reward request's worst wait"))
        report.timeouts.append((f"a {wait.phase}'s worst reward wait", f"{wait.rounds * worst:g} s", (
            f"{wait.rounds} rounds of reward.concurrency requests ({wait.counted}); must stay below "
            f"grpo.collective_timeout_s ({grpo.collective_timeout_s:g} s)")))
    for prefix, serve_cfg in (("", cfg if isinstance(cfg, ServeConfig) else None), ("grm.overrides: ", _served(cfg))):
        if serve_cfg is None:
            continue
        report.timeouts += [
            (f"{prefix}serve.request_timeout_s", f"{serve_cfg.serve.request_timeout_s:g} s", "one judge call's deadline"),
            (f"{prefix}health.timeout_s", f"{serve_cfg.health.timeout_s:g} s", "one health check"),
            (f"{prefix}shutdown.timeout_s", f"{serve_cfg.shutdown.timeout_s:g} s",
             "a replica's drain before it is killed (>= serve.request_timeout_s)")]


# path fields of the config's sections, and what lives there
PATH_FIELDS = {"storage_path": "Ray Train checkpoints", "init_adapter": "the LoRA adapter training starts from",
               "adapter": "a LoRA adapter an engine loads"}


def add_storage(report: Report, cfg: Any) -> None:
    from core.model_store import models_by_repo, unstaged

    ray = cfg.ray
    report.storage.append(("ray.shared_storage", ray.shared_storage or "(none: one machine)",
                           "mounted at the same path on every node"))
    run = getattr(cfg, "run", None)
    if run is not None and getattr(run, "root", ""):
        report.storage.append(("run.root", run.root, "run directories: results, manifests, reports, adapters"))
    for key, node in walk(cfg):
        for name, holds in PATH_FIELDS.items():
            value = getattr(node, name, None)
            if isinstance(value, str) and value:
                report.storage.append((f"{key}.{name}" if key else name, value, holds))
    repos = models_by_repo({k: v for k, v in dataclasses.asdict(cfg).items() if k != "ray"})
    if not repos:
        return
    hf_home, models = ray.models.hf_home, f"hub model{'s' if len(repos) != 1 else ''}"
    if hf_home and Path(hf_home).is_dir():
        missing = unstaged(dataclasses.asdict(cfg), ray.models)
        staged = f"{len(repos) - len(missing)} of {len(repos)} {models} staged" + (
            f" (not: {', '.join(missing)})" if missing else "")
    else:
        staged = f"{len(repos)} {models}; the cache is not readable from here, so their staging is not checked"
    report.storage.append(("ray.models.hf_home", hf_home or "(each node's own cache)",
                           f"{staged}; `quorum stage-models CONFIG` stages them, hub_access {ray.models.hub_access}"))


# ---------------------------------------------------------------------------------------------------------------
# The report, the pre-flight check, the command


def build_report(cfg: Any, cluster: Path) -> Report:
    nodes = node_types(cluster)
    report = Report(cluster=str(cluster))
    add_stages(report, cfg, nodes)
    add_trainers(report, cfg, nodes)
    add_engines(report, cfg, nodes)
    add_timeouts(report, cfg)
    add_storage(report, cfg)
    return report


def refusal(problems: list[tuple[str, str]], cluster: str) -> str:
    keys = ", ".join(dict.fromkeys(k for k, _ in problems))
    return f"{keys}: cannot run on {cluster}: " + "; ".join(f"{k}: {m}" for k, m in problems)


def preflight(cfg: Any, cluster: str = "") -> None:
    """`quorum run` / `quorum submit`'s check before any work, for a config that names shared storage (a cluster
    config): the plan's refusals as one ConfigError (exit 2) naming the keys. A cluster file that is absent
    (an installed package without the repository's cluster.yaml) is said on stderr, not guessed."""
    if not getattr(getattr(cfg, "ray", None), "shared_storage", ""):
        return
    path = cluster_path(cluster)
    if not path.is_file():
        print(f"quorum: no cluster file at {path} (set {CLUSTER_ENV}): GPU memory and node types not checked",
              file=sys.stderr)
        return
    report = build_report(cfg, path)
    if report.problems:
        raise ConfigError(refusal(report.problems, str(path)))
