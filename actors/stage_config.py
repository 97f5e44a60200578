"""Config sections shared by the Ray Data stages: sampling, actor pools, and one model of a list.

YAML-shaped twins of the engine types (lists instead of tuples) so job configs can embed them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

from actors.engines.base import EngineSpec, SamplingParams, check_sampling
from actors.secrets import Secrets
from core.config import Section, check_custom_resources, dotted, fail
from core.resource_fit import OK, Ask, verdict

log = logging.getLogger("quorum.resources")

# CPUs requested by the light pure pre/post functions around model actors. Whole-CPU defaults would let the
# model pools reserve every core (two 1-CPU pools on a 2-core box) and starve these tasks: the stage would hang.
LIGHT_CPU = 0.25


@dataclass
class SamplingConfig(Section):
    """Decoding settings of the model's requests (YAML twin of actors.engines.base.SamplingParams)."""

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

    # actors in the pool, each holding one copy of the model: an int (a fixed pool, >= 1) or [min, max] (Ray Data
    # autoscales between them: it adds actors while batches queue, up to max, and removes idle ones down to min)
    concurrency: int | list[int] = 1
    num_cpus: float = 1.0  # Ray CPUs reserved per actor (fractions allowed); hf's 0 num_threads uses this
    num_gpus: float = 0.0  # Ray GPUs reserved per actor (fractions share a GPU); 0 = a CPU-only actor
    batch_size: int = 16  # rows per Ray Data batch handed to one actor call (>= 1)
    # batches each actor holds at once (>= 1): the next batch is already at the actor when one finishes; an async
    # engine (vllm) decodes all of them together in its continuous batch; the hf engine still runs one at a time
    batches_in_flight: int = 4
    # custom Ray resources per actor, e.g. {gpu_slot: 1}: the pool is placed only on nodes that advertise them
    # (a cluster's node type declares them; the autoscaler starts such a node for the pool's demand)
    resources: dict[str, float] = field(default_factory=dict)

    def check(self, where: str = "") -> None:
        # num_cpus / num_gpus >= 0 is check_tree's floor for every number
        check_concurrency(self.concurrency, dotted(where, "concurrency"))
        for name in ("batch_size", "batches_in_flight"):
            if getattr(self, name) < 1:
                fail(dotted(where, name), f"must be >= 1, got {getattr(self, name)}")
        check_custom_resources(self.resources, dotted(where, "resources"))

    @property
    def min_actors(self) -> int:
        """The actors the pool always holds (a fixed pool's size; an autoscaling pool's min)."""
        return self.concurrency if isinstance(self.concurrency, int) else self.concurrency[0]

    @property
    def max_actors(self) -> int:
        """The most actors the pool grows to (a fixed pool's size; an autoscaling pool's max)."""
        return self.concurrency if isinstance(self.concurrency, int) else self.concurrency[1]

    def compute(self):
        """The pool's `ray.data.ActorPoolStrategy`: fixed or [min, max] actors, `batches_in_flight` calls per actor.

        Ray Data runs `max_concurrent_calls_per_actor` calls at once on an actor (its Ray `max_concurrency`;
        ray/data/_internal/compute.py, actor_pool_map_operator.py `_create_actor_pool_config`). An `async def
        __call__` (ChatWorker) then awaits every call on the actor's one event loop; a plain `__call__` still runs
        one call at a time (Ray Data wraps it single-threaded, `make_callable_class_single_threaded`) while the next
        batches are fetched and queued at the actor.
        """
        import ray.data

        size = ({"size": self.concurrency} if isinstance(self.concurrency, int)
                else {"min_size": self.concurrency[0], "max_size": self.concurrency[1]})
        # Ray Data then sends each actor up to twice that many tasks (DataContext's default, as ray.data.llm's
        # processors leave it): the extra ones wait in the actor's queue, so a finished call is replaced without
        # waiting for the executor's next scheduling round
        return ray.data.ActorPoolStrategy(**size, max_concurrent_calls_per_actor=self.batches_in_flight)

    def map_batches_kwargs(self, model: str = "") -> dict:
        """`map_batches` arguments of the pool, once the cluster can hold it: a pool it can never place is refused
        here (ConfigError naming the pool's keys) instead of Ray Data waiting for its actors for ever."""
        from actors.ray_capacity import ensure_fits

        unit = {"CPU": self.num_cpus, "GPU": self.num_gpus, **{k: float(v) for k, v in self.resources.items()}}
        keys = ("pool.concurrency", "pool.num_cpus", *(("pool.num_gpus",) if self.num_gpus else ()),
                *(("pool.resources",) if self.resources else ()))
        # An autoscaling pool must fit its min: Ray Data starts the min before the stage runs. Its max is a ceiling,
        # not a reservation: actors beyond what the cluster holds stay pending (an autoscaling cluster adds nodes
        # for them) while the others work, so the max is not refused here.
        stage = f"actor pool of model {model!r}" if model else "actor pool"
        ensure_fits(Ask(stage, "actors", self.min_actors, unit, keys))
        if self.max_actors > self.min_actors:
            note_unplaceable_max(Ask(stage, "actors", self.max_actors, unit, keys))
        kwargs = {"compute": self.compute(), "batch_size": self.batch_size, "num_cpus": self.num_cpus,
                  "runtime_env": {"env_vars": dict(POOL_ACTOR_ENV)}}
        if self.num_gpus:
            kwargs["num_gpus"] = self.num_gpus
        if self.resources:
            kwargs["resources"] = {name: float(amount) for name, amount in self.resources.items()}
        return kwargs


# A pool's actors stop their engine in order when Ray Data releases them (ChatWorker.__del__, from Ray Data's
# `__ray_shutdown__`; otherwise the engine's atexit finalizer): a vLLM engine core process stops and unlinks its
# `/dev/shm/psm_*` queue, and each release reaches the actor's multiprocessing resource tracker. Ray's graceful
# actor exit SIGKILLs the worker's direct children before it calls `__ray_shutdown__`
# (core_worker_shutdown_executor: KillChildProcessesImmediately, then the actor's shutdown callback); with that on,
# the engine core dies before it unlinks its queue (which stays behind) and the tracker before the releases reach it
# ('resource_tracker: process died unexpectedly', then `KeyError: '/psm_...'`). Off for the pool's actors: whatever
# is left of an actor that crashed or was ray.kill-ed goes with its process group, which the raylet kills once the
# worker has exited (Ray's per-worker process group cleanup, on by default).
POOL_ACTOR_ENV = {"RAY_kill_child_processes_on_worker_exit": "false"}


def note_unplaceable_max(ask: Ask) -> None:
    """Log (never refuse) an autoscaling pool's max that the cluster cannot hold now: Ray Data grows the pool only
    as far as the cluster makes room."""
    import ray

    from actors.ray_capacity import capacity

    if not ray.is_initialized():
        return
    found = verdict(ask, capacity())
    if found.kind != OK:
        log.info("%s: its max is not reserved; the pool grows only as far as the cluster makes room (%s)",
                 ask.stage, found.message)


def check_concurrency(value: int | list[int], key: str) -> None:
    """A pool's `concurrency`: an int >= 1, or a [min, max] pair with 1 <= min <= max."""
    if isinstance(value, int):
        if value < 1:
            fail(key, f"must be >= 1, got {value}")
        return
    if len(value) != 2:
        fail(key, f"must be an int or a [min, max] pair, got {value}")
    low, high = value
    if low < 1:
        fail(key, f"min must be >= 1, got {value}")
    if high < low:
        fail(key, f"max must be >= min, got {value}")


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
