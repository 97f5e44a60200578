"""Connecting to Ray: a local cluster on a laptop, the job's cluster under `ray job submit`.

Every worker's environment is built here, once (not scattered through jobs): where models come from is the
config's `ray.models` (core.model_store), written into the runtime env of every worker; the other defaults below
yield to the driver's own environment. A submitted driver's environment is the cluster's, never the submitting
shell's (core.model_store says where Ray decides that), so a setting that must reach the workers is a config key.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from core.config import Section, dotted, fail
from core.model_store import MODEL_ENV_KEYS, ModelsConfig, on_storage

log = logging.getLogger(__name__)

WORKER_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    # DeepSpeed picks its accelerator at import; on CPU-only workers it must be told
    "DS_ACCELERATOR": "",
}
# never a secret here: Ray logs a runtime env's variables in clear text (runtime_env_agent.log). Secrets reach
# actors as constructor arguments (actors.secrets); a local cluster's workers inherit this process's environment
# A job's own local cluster is one machine that no autoscaler drains: Ray Train's preemption watcher (one more
# actor process per training run, polling node drain state) has nothing to watch there. On 2 cores each extra
# process start is ~1.5 s of CPU taken from the training workers' imports. Clusters joined by address keep it.
# The Train controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default 2 s) and notices a
# started worker group, a finished run and its shutdown only at a poll: on one machine that waiting was ~7 s of a
# 4-step run's ~25 s (tiny model, 2 workers); a poll every 0.2 s costs a few local RPCs a second. A poll that misses
# its interval on a busy machine is only a missed health check (a worker is declared dead after Ray's 10 minutes).
LOCAL_CLUSTER_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
PASS_THROUGH = ("QUORUM_CACHE", "WANDB_MODE", "DS_ACCELERATOR", "OMP_NUM_THREADS")


@dataclass
class RayConfig(Section):
    # "" = RAY_ADDRESS if set (ray job submit sets it), else start a new local cluster (never join another one
    # on this machine); or "auto" / "host:port" / "ray://host:port"
    address: str = ""
    # the directory every node of the cluster mounts at the same path (cluster.yaml's EFS mount, k8s/'s shared
    # claim): when set, run.root, trainer storage paths and ray.models.hf_home must lie under it; "" = one machine
    shared_storage: str = ""
    # where hf:<repo> models come from on every worker (core.model_store)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    # CPUs of a *local* cluster; 0 = all cores
    num_cpus: int = 0
    # extra environment variables for every worker
    env_vars: dict[str, str] = field(default_factory=dict)
    # nice value of the workers of a *local* cluster. Ray's own default is 15 (keeps its raylet responsive on a
    # dedicated node), which on a shared laptop or CI runner lets any plain process starve the model actors: an
    # actor at nice 15 gets ~3% of a core beside one busy nice-0 process, and its torch threads wait for the
    # slowest of them at every barrier (bench.generate --contention 1: 0.05 of idle). A cluster started with
    # `ray start` sets it there: `RAY_worker_niceness=0 ray start --head`
    worker_niceness: int = 0


    def check(self, where: str = "") -> None:
        storage = self.shared_storage
        if storage and ("://" in storage or not os.path.isabs(storage)):
            fail(dotted(where, "shared_storage"), f"{storage!r} must be the absolute path where every node mounts "
                                                  "the shared filesystem (e.g. /mnt/shared)")
        hf_home = self.models.hf_home
        if storage and hf_home and not on_storage(hf_home, storage):
            fail(dotted(where, "models.hf_home"), f"{hf_home!r} is not on ray.shared_storage ({storage}): every "
                                                  "node must load the same staged models")
        for name in self.env_vars:
            if name in MODEL_ENV_KEYS:
                fail(dotted(where, f"env_vars.{name}"), "set by ray.models (hub_access, hf_home) for every worker; "
                                                        "set it there")


def worker_env(cfg: RayConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables of every worker's runtime env.

    `environ` (default: this process's) may override the defaults and supplies the pass-through variables; the
    model story (`cfg.models`) and `cfg.env_vars` come from the config only. `environ={}` gives the config's own
    environment, for a runtime env written for another machine (`quorum serve --print-config`).
    """
    environ = os.environ if environ is None else environ
    env = {k: environ.get(k, v) for k, v in WORKER_ENV_DEFAULTS.items()}
    env.update({k: environ[k] for k in PASS_THROUGH if k in environ})
    env.update(cfg.models.env())
    env.update(cfg.env_vars)
    if not env.get("DS_ACCELERATOR"):
        env.pop("DS_ACCELERATOR", None)
    return env


def init_ray(cfg: RayConfig) -> None:
    """Idempotent: a second call (or a test that already started Ray) is a no-op."""
    import ray

    if ray.is_initialized():
        return
    runtime_env = {"env_vars": worker_env(cfg)}
    address = cfg.address or os.environ.get("RAY_ADDRESS", "")
    if address:
        log.info("connecting to Ray at %s", address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
    else:
        # "local" starts this job's own cluster: a bare ray.init() would join whatever cluster a `ray start` on
        # this machine last recorded in /tmp/ray/ray_current_cluster, i.e. someone else's
        log.info("starting a local Ray cluster (num_cpus=%s)", cfg.num_cpus or "all")
        runtime_env["env_vars"] = {**LOCAL_CLUSTER_ENV, **runtime_env["env_vars"]}
        ray.init(address="local", num_cpus=cfg.num_cpus or None, runtime_env=runtime_env, include_dashboard=False,
                 log_to_driver=True, _system_config={"worker_niceness": cfg.worker_niceness})
    ray.data.DataContext.get_current().enable_progress_bars = True


def intra_op_threads(pinned: int, ray_cpus: float | None, available: int) -> int:
    """Torch intra-op threads for a model in this process; 0 = leave torch's default (outside Ray, unpinned).

    `pinned` (engine.num_threads > 0) wins. In a Ray actor or task (`ray_cpus` = the CPUs Ray assigned it, 0 when
    it asked for none), the floor of that share, at least 1 and at most the `available` cores: never
    `os.cpu_count()`, or several actors on one node each start a thread per core and wait for each other's
    descheduled threads at every barrier. Ray's own OMP_NUM_THREADS default says the same, but only when nothing
    set the variable first (a pass-through from the driver, an earlier task in a reused worker).

    >>> intra_op_threads(0, 0.5, 2), intra_op_threads(0, 2.0, 2), intra_op_threads(0, 8.0, 2), intra_op_threads(3, 1.0, 2)
    (1, 2, 2, 3)
    """
    if pinned > 0:
        return pinned
    if ray_cpus is None:
        return 0
    return max(1, min(int(ray_cpus), available))
