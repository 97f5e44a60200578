"""W&B tracking (offline when no API key) and the secret-redacting log filter.

Secrets (W&B, OpenAI-compatible API keys, Serve tokens) live only in environment variables; configs hold the
*names* of those variables (`*_env` keys). `install_redaction` masks the values of those variables in every log
record, and nothing here ever puts an environment value into a config, manifest or W&B payload.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import pandas as pd

from core.config import ALWAYS_SECRET, Section, dotted, one_of


@dataclass
class WandbConfig(Section):
    enabled: bool = True
    project: str = "quorum"
    entity: str = ""
    # auto = online when WANDB_API_KEY is set, else offline; or online | offline | disabled
    mode: str = "auto"
    # extra tags on the run
    tags: list[str] | None = None

    @property
    def on(self) -> bool:
        """Whether runs log at all (a trainer's rank 0 starts its own W&B run only then)."""
        return self.enabled and self.mode != "disabled"

    def check(self, where: str = "") -> None:
        one_of(self.mode, ("auto", "online", "offline", "disabled"), dotted(where, "mode"))


# ---------------------------------------------------------------------------------------------------------------
# Secrets


def secret_env_names(config: Any) -> set[str]:
    """Every env-var name a config points at through a key ending in `_env`, plus the well-known ones."""
    names = set(ALWAYS_SECRET)
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


def start_tracking(cfg: WandbConfig, job: str, run_id: str, config: dict, local_dir: str | None) -> Tracker:
    """Start a W&B run with the resolved config; offline unless an API key is present (or mode says so)."""
    if not cfg.enabled or cfg.mode == "disabled":
        return Tracker()
    import wandb

    mode = cfg.mode if cfg.mode != "auto" else ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    run = wandb.init(
        project=cfg.project, entity=cfg.entity or None, name=f"{job}/{run_id}", group=job, job_type=job,
        config=config, mode=mode, dir=local_dir, tags=cfg.tags or None, reinit="finish_previous",
        settings=wandb.Settings(console="off"),
    )
    return Tracker(run)
