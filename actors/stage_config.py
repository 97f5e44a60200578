"""Config sections shared by the Ray Data stages: sampling, actor pools, and one model of a list.

YAML-shaped twins of the engine types (lists instead of tuples) so job configs can embed them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from actors.engine import EngineSpec, SamplingParams, check_sampling
from actors.secrets import Secrets
from core.config import Section, check_custom_resources, dotted, fail

# CPUs requested by the light pure pre/post functions around model actors. Whole-CPU defaults would let the
# model pools reserve every core (two 1-CPU pools on a 2-core box) and starve these tasks: the stage would hang.
LIGHT_CPU = 0.25


@dataclass
class SamplingConfig(Section):
    """Decoding settings of the model's requests (YAML twin of actors.engine.SamplingParams)."""

    temperature: float = 0.0  # softmax temperature in [0, 2]; 0 = greedy decoding
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 = no nucleus filter
    top_k: int = -1  # sample among the k most likely tokens; -1 = no top-k filter (0 is refused)
    max_tokens: int = 128  # most new tokens per completion (>= 1); hf caps it at the model's context room
    seed: int = 0  # per-request sampling seed in [0, 2**63 - 1], passed to every engine (hf, vllm, openai)
    # strings that end a completion where the earliest one starts (cut from the text); [] = none; no empty string
    stop: list[str] = field(default_factory=list)

    def check(self, where: str = "") -> None:
        """Called on every sampling section of every job config (core.config.check_tree) with its dotted key."""
        check_sampling(self, where)

    def to_params(self) -> SamplingParams:
        return SamplingParams(**{**asdict(self), "stop": tuple(self.stop)})

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class PoolConfig(Section):
    """How the model's actor pool is placed: actors, resources per actor, rows per batch."""

    concurrency: int = 1  # actors in the pool, each holding one copy of the model (>= 1)
    num_cpus: float = 1.0  # Ray CPUs reserved per actor (fractions allowed); hf's 0 num_threads uses this
    num_gpus: float = 0.0  # Ray GPUs reserved per actor (fractions share a GPU); 0 = a CPU-only actor
    batch_size: int = 16  # rows per Ray Data batch handed to one actor call (>= 1)
    # custom Ray resources per actor, e.g. {gpu_slot: 1}: the pool is placed only on nodes that advertise them
    # (a cluster's node type declares them; the autoscaler starts such a node for the pool's demand)
    resources: dict[str, float] = field(default_factory=dict)

    def check(self, where: str = "") -> None:
        # num_cpus / num_gpus >= 0 is check_tree's floor for every number
        for name in ("concurrency", "batch_size"):
            if getattr(self, name) < 1:
                fail(dotted(where, name), f"must be >= 1, got {getattr(self, name)}")
        check_custom_resources(self.resources, dotted(where, "resources"))

    def map_batches_kwargs(self, model: str = "") -> dict:
        """`map_batches` arguments of the pool, once the cluster can hold it: a pool it can never place is refused
        here (ConfigError naming the pool's keys) instead of Ray Data waiting for its actors for ever."""
        import ray.data

        from actors.ray_capacity import ensure_fits
        from core.resource_fit import Ask

        unit = {"CPU": self.num_cpus, "GPU": self.num_gpus, **{k: float(v) for k, v in self.resources.items()}}
        keys = ("pool.concurrency", "pool.num_cpus", *(("pool.num_gpus",) if self.num_gpus else ()),
                *(("pool.resources",) if self.resources else ()))
        ensure_fits(Ask(f"actor pool of model {model!r}" if model else "actor pool", "actors", self.concurrency,
                        unit, keys))
        kwargs = {"compute": ray.data.ActorPoolStrategy(size=self.concurrency), "batch_size": self.batch_size,
                  "num_cpus": self.num_cpus}
        if self.num_gpus:
            kwargs["num_gpus"] = self.num_gpus
        if self.resources:
            kwargs["resources"] = {name: float(amount) for name, amount in self.resources.items()}
        return kwargs


def engine_secrets(engine: EngineSpec) -> Secrets:
    """The engine's API key (named by `api_key_env`) for its actors' constructor (`ChatWorker(secrets=...)`).

    Not a runtime-env variable: Ray logs those in clear text (see actors.secrets).
    """
    return Secrets([engine.api_key_env])


@dataclass
class ModelConfig:
    """One model in a generator pool or a jury: a label, an engine, sampling and placement."""

    # label used in outputs and reports ("smollm2-greedy"); must be unique in its list
    name: str = "smollm2"
    engine: EngineSpec = field(default_factory=EngineSpec)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)


def check_unique_names(models: list, where: str) -> None:
    names = [m.name for m in models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        fail(where, f"model names must be unique, repeated: {dupes}")
    if not models:
        fail(where, "at least one model is required")
