"""What a job config must hold on the cluster at once, in GPUs and CPUs (pure: reads the config, not the cluster).

    groups(cfg)        # [[Ask, ...], ...]: each list is held at the same time; the job needs the largest
    gpus_at_once(cfg)  # GPUs of the largest group (the floor of what the cluster must hold), and with every
                       # autoscaling reward service at its max_replicas

A job's stages run one after another. Within a stage, Ray Train's worker group is placed whole (one placement group),
and policy GRPO's reward service keeps its replicas beside the training workers that call it: both must fit at once
(`jobs.policy.grpo.placement`, checked by `actors.ray_capacity.ensure_all_fit` before any work). Every actor pool is
its own group: the pools of one Ray Data plan run side by side when the cluster holds them, one after the other when
it does not (`core.resource_fit`, "Everything a job must hold at once").

docs/cluster.md's table "GPUs each shipped cluster config needs at once" is this module's output for
configs/*_cluster.yaml (`jobs.plan.markdown_table`; tests/test_resource_fit.py checks the two agree). `quorum plan`
(`jobs.plan`) prints these groups against the cluster's node types, with each GPU's memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from actors.stage_config import PoolConfig
from core.resource_fit import Ask
from serve.config import ServeConfig
from train.config import TrainerBase
from train.trainer import workers_ask


def walk(node: Any, where: str = ""):
    """(dotted key, value) of every dataclass in the tree, the root included."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        yield where, node
        for f in dataclasses.fields(node):
            yield from walk(getattr(node, f.name), f"{where}.{f.name}" if where else f.name)
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from walk(item, f"{where}.{i}")


def pool_ask(pool: PoolConfig, key: str) -> Ask:
    """An actor pool's `min_actors` (what Ray Data starts before the stage runs), named by its keys."""
    unit = {"CPU": float(pool.num_cpus), "GPU": float(pool.num_gpus), **{k: float(v) for k, v in pool.resources.items()}}
    return Ask(key, "actors", pool.min_actors, unit, (f"{key}.concurrency", f"{key}.num_gpus"))


def groups(cfg: Any) -> list[list[Ask]]:
    """The asks of `cfg` that must be held together, one list per group (see the module docstring)."""
    if isinstance(cfg, ServeConfig):
        return [[cfg.replicas_ask()]]
    placement = getattr(_job_module(cfg), "placement", None)
    out = [placement(cfg)] if placement is not None else []
    for key, node in walk(cfg):
        if isinstance(node, TrainerBase) and placement is None:
            out.append([workers_ask(node, key)])
        elif isinstance(node, PoolConfig):
            out.append([pool_ask(node, key)])
    return out


def _gpus(asks: list[Ask]) -> float:
    return sum(ask.count * ask.unit.get("GPU", 0.0) for ask in asks)


def gpus_at_once(cfg: Any) -> tuple[float, float]:
    """(GPUs of the largest group, the same with every reward service at its `max_replicas`)."""
    low = max((_gpus(group) for group in groups(cfg)), default=0.0)
    high = max((_gpus([_at_max(cfg, ask) for ask in group]) for group in groups(cfg)), default=0.0)
    return low, high


def _at_max(cfg: Any, ask: Ask) -> Ask:
    if ask.stage != "serve":
        return ask
    serve_cfg = cfg if isinstance(cfg, ServeConfig) else cfg.serve_config()
    return dataclasses.replace(ask, count=serve_cfg.autoscaling.max_replicas)


def _job_module(cfg: Any):
    import importlib

    module = importlib.import_module(type(cfg).__module__)
    return module if module.__name__.startswith("jobs.") else None


def largest(cfg: Any) -> list[Ask]:
    return max(groups(cfg), key=_gpus, default=[])
