"""W&B tracking (offline when no API key) and the secret-redacting log filter.

Secrets (W&B, OpenAI-compatible API keys, Serve tokens) live only in environment variables; configs hold the
*names* of those variables (`*_env` keys). `install_redaction` masks the values of those variables in every log
record, and nothing here ever puts an environment value into a config, manifest or W&B payload.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from core.config import ALWAYS_SECRET, Section, dotted, fail, one_of

# where W&B reads its key, on the driver and (installed by actors.secrets) on every training worker
WANDB_KEY_ENV = "WANDB_API_KEY"
WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class WandbConfig(Section):
    """W&B tracking of the job's run; its trainers' runs join the run's group."""

    enabled: bool = True  # log the run to W&B (offline without a key); false = no W&B run at all
    project: str = "quorum"  # W&B project of the job's run and its trainers' runs
    entity: str = ""  # W&B team or user; "" = the API key's default entity
    # auto = online when WANDB_API_KEY is set, else offline; or online | offline | disabled
    mode: str = "auto"
    # extra tags on the run
    tags: list[str] | None = None

    @property
    def on(self) -> bool:
        """Whether runs log at all (a trainer's rank 0 starts its own W&B run only then)."""
        return self.enabled and self.mode != "disabled"

    def check(self, where: str = "") -> None:
        one_of(self.mode, WANDB_MODES, dotted(where, "mode"))


# ---------------------------------------------------------------------------------------------------------------
# Secrets


def secret_env_names(config: Any, well_known: bool = True) -> set[str]:
    """Every env-var name a config points at through a key ending in `_env`, plus the well-known ones."""
    names = set(ALWAYS_SECRET) if well_known else set()
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("_env") and isinstance(value, str) and value:
                    names.add(value)
                else:
                    stack.append(value)
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return names


class RedactSecrets(logging.Filter):
    """Replace secret values in log messages (and their args) with '***'."""

    def __init__(self, env_names: set[str]):
        super().__init__()
        self.env_names = env_names

    def _secrets(self) -> list[str]:
        # read at log time: a key exported after start-up is still masked
        return [v for v in (os.environ.get(n, "") for n in self.env_names) if len(v) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._secrets()
        if secrets:
            message = record.getMessage()
            for secret in secrets:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


def install_redaction(env_names: set[str]) -> RedactSecrets:
    """Attach the filter to the root logger's handlers (and future records through the root logger)."""
    flt = RedactSecrets(env_names)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            stream=sys.stderr)
    for handler in root.handlers:
        handler.addFilter(flt)
    return flt


def add_file_log(path: str, flt: RedactSecrets) -> logging.Handler:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(flt)
    logging.getLogger().addHandler(handler)
    return handler


# ---------------------------------------------------------------------------------------------------------------
# W&B


class Tracker:
    """A W&B run, or nothing when disabled. Logging calls are unconditional for callers."""

    def __init__(self, run: Any = None):
        self.run = run

    def log(self, metrics: dict, step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, prefix: str, values: dict) -> None:
        if self.run is not None:
            for key, value in values.items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    self.run.summary[f"{prefix}/{key}"] = value

    def table(self, name: str, df: pd.DataFrame, max_rows: int = 200) -> None:
        if self.run is not None:
            import wandb

            self.run.log({name: wandb.Table(dataframe=df.head(max_rows).reset_index(drop=True))})

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def resolve_mode(mode: str, environ: Mapping[str, str] = os.environ) -> str:
    """auto -> W&B's own `WANDB_MODE` where set, else online when this process has a W&B key, else offline; other
    modes pass through.

    >>> resolve_mode("auto", {}), resolve_mode("auto", {"WANDB_API_KEY": "k"}), resolve_mode("offline", {"WANDB_API_KEY": "k"})
    ('offline', 'online', 'offline')
    >>> resolve_mode("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"})
    'offline'
    """
    one_of(mode, WANDB_MODES, "wandb.mode")
    if mode != "auto":
        return mode
    env_mode = {"dryrun": "offline", "run": "online"}.get(environ.get("WANDB_MODE", ""), environ.get("WANDB_MODE", ""))
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    return "online" if environ.get(WANDB_KEY_ENV) else "offline"


def job_run_name(job: str, run_id: str) -> str:
    """The job's W&B run name, and the group of every run it starts (its own and its trainers')."""
    return f"{job}/{run_id}"


def start_tracking(cfg: WandbConfig, job: str, run_id: str, config: dict, local_dir: str | None) -> Tracker:
    """Start a W&B run with the resolved config; offline unless an API key is present (or mode says so)."""
    if not cfg.on:
        return Tracker()
    import wandb

    name = job_run_name(job, run_id)
    run = wandb.init(
        project=cfg.project, entity=cfg.entity or None, name=name, group=name, job_type=job,
        config=config, mode=resolve_mode(cfg.mode), dir=local_dir, tags=cfg.tags or None, reinit="finish_previous",
        settings=wandb.Settings(console="off"),
    )
    return Tracker(run)


def trainer_tracking(cfg: WandbConfig, job: str, run_id: str,
                     environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The tracking fields of a trainer config (`train.config.TrackingFields`) for a trainer a job starts: its runs
    take the job run's project, entity and tags, sit in the job run's group, and are online exactly when the job's
    run is (the driver resolves `auto`; its key reaches the workers through `actors.secrets`, by name).

    Raises:
        ConfigError: mode online without a key in the driver's environment: `wandb login`'s netrc file stays on
            this machine, so the training workers on other nodes could not log in.
    """
    mode = resolve_mode(cfg.mode, environ) if cfg.on else "disabled"
    if mode == "online" and not environ.get(WANDB_KEY_ENV):
        fail("wandb.mode", f"online needs {WANDB_KEY_ENV} set in the submitting environment: the training workers "
             "get the key from there (a `wandb login` netrc file does not reach other nodes)")
    return {"wandb": cfg.on, "wandb_project": cfg.project, "wandb_entity": cfg.entity, "wandb_mode": mode,
            "wandb_group": job_run_name(job, run_id), "wandb_tags": list(cfg.tags or [])}


def wandb_secret_names(mode: str) -> list[str]:
    """The variables a trainer's workers need for W&B: the key, by name, when its runs are online."""
    return [WANDB_KEY_ENV] if mode == "online" else []


def start_worker_run(trainer: Any, *, run_id: str, local_dir: str, config: dict, rank: int) -> Any:
    """A training worker's W&B run (`worker_wandb_init` of the trainer config's tracking fields), or None."""
    kwargs = worker_wandb_init(enabled=trainer.wandb, project=trainer.wandb_project, entity=trainer.wandb_entity,
                               mode=trainer.wandb_mode, group=trainer.wandb_group, tags=trainer.wandb_tags,
                               run_name=trainer.run_name, run_id=run_id, local_dir=local_dir, config=config, rank=rank)
    if kwargs is None:
        return None
    import wandb

    os.makedirs(local_dir, exist_ok=True)
    return wandb.init(**kwargs)


def worker_wandb_init(*, enabled: bool, project: str, entity: str, mode: str, group: str, tags: list[str],
                      run_name: str, run_id: str, local_dir: str, config: dict, rank: int,
                      environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """`wandb.init` keyword arguments of a training worker's run, or None for a worker that logs none.

    Rank 0 logs the trainer's metrics, reduced over the workers (and per-rank figures gathered to it); one run per
    trainer keeps the group readable. Its mode is the job's, resolved on the driver (`trainer_tracking`); `auto`
    (a trainer started without a job) is resolved here, in the worker's environment. The key never
    appears here: wandb reads `WANDB_API_KEY` from the worker's environment, where `actors.secrets` installed it.
    """
    if not enabled or rank != 0 or mode == "disabled":
        return None
    if mode == "auto":
        mode = resolve_mode("auto", environ)
    return {"project": project, "entity": entity or None, "group": group or None, "tags": list(tags) or None,
            "job_type": "train", "name": f"{group}/{run_name}" if group else run_name, "id": run_id,
            "resume": "allow", "dir": local_dir, "mode": mode, "config": config}
