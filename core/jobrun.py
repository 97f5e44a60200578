"""What every job does before its first stage: open the run directory, save the resolved config, mask secrets,
log to a file, and start W&B. Each job's config embeds `JobSections` (run / ray / wandb) first.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from core import console
from core.config import Section
from core.model_store import check_cluster_storage
from core.ray_env import RayConfig
from core.runstore import RunConfig, RunStore, StageResult
from core.tracking import Tracker, WandbConfig, add_file_log, install_redaction, secret_env_names, start_tracking


@dataclass
class JobSections(Section):
    """The config sections every job has; a job's `Config` subclasses this and adds its own."""

    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster the job joins or starts, and its workers
    wandb: WandbConfig = field(default_factory=WandbConfig)  # W&B tracking of the job's run (and its trainers)

    def check(self, where: str = "") -> None:
        """A cluster config (ray.shared_storage set) keeps its outputs and models on the shared storage."""
        check_cluster_storage(dataclasses.asdict(self))


@dataclass
class JobRun:
    store: RunStore
    run_id: str
    # the resolved config as a dict (what config.yaml, the manifest and W&B get)
    config: dict
    # the shared request cache under run.root ("" when run.request_cache is off)
    cache_dir: str

    def start_tracking(self, job: str, wandb: WandbConfig) -> Tracker:
        return start_tracking(wandb, job, self.run_id, self.config, None if self.store.uri_prefix else self.store.path)

    @property
    def location(self) -> str:
        """The run directory as a user passes it on: an absolute path, or the URI of a remote root."""
        return self.store.uri_prefix + self.store.path

    def offline_wandb_runs(self) -> list[str]:
        """The W&B offline run folders in a local run directory (the job's and the trainers'), for `wandb sync`."""
        if self.store.uri_prefix:
            return []
        return sorted(str(p) for p in Path(self.store.path).glob("wandb/offline-run-*") if p.is_dir())


# every run opened by this process, in order: the CLI prints where they are when the job ends
OPENED: list[JobRun] = []


def open_run(job: str, cfg: JobSections, config_path: str = "") -> JobRun:
    """The run directory `<run.root>/<job>/<run id>` (id defaults to the config file's stem), started and logged.

    Secrets named by `*_env` keys are masked from every log handler from here on; the driver log is
    `logs/driver.log` in a local run directory.
    """
    run_id = cfg.run.id or (Path(config_path).stem if config_path else "default")
    store = RunStore(cfg.run.root, job, run_id, resume=cfg.run.resume, rehearsal=cfg.run.rehearsal)
    config_dict = dataclasses.asdict(cfg)
    redaction = install_redaction(secret_env_names(config_dict))
    if not store.uri_prefix:
        Path(store.path, "logs").mkdir(exist_ok=True)
        add_file_log(f"{store.path}/logs/driver.log", redaction)
        # from here the terminal shows stage lines only; Ray's, W&B's and every worker's output go to the log
        console.capture(f"{store.path}/logs/driver.log")
    store.start(config_dict, yaml.safe_dump(config_dict, sort_keys=False))
    cache = f"{cfg.run.root.rstrip('/')}/_cache/requests" if cfg.run.request_cache else ""
    run = JobRun(store, run_id, config_dict, cache)
    OPENED.append(run)
    return run


def record_stages(results: list[StageResult], tracker: Tracker) -> None:
    """One driver-log line and one W&B summary entry per stage: ran or reused, rows, seconds, its summary."""
    width = max((len(r.name) for r in results), default=0)
    for result in results:
        logging.getLogger("quorum").info("stage %-*s %s rows=%d %.1fs %s", width, result.name,
                                         "skipped" if result.skipped else "ran", result.rows, result.seconds,
                                         result.summary)
        tracker.summary(result.name, {**result.summary, "skipped": result.skipped, "rows": result.rows})
