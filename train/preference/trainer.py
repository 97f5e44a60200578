"""Driver side of preference training: `TrainConfig` -> Ray Train `TorchTrainer` (DeepSpeed + LoRA) -> `TrainResult`.

    from train.config import TrainConfig
    from train.preference.trainer import run_training
    cfg = TrainConfig(model="smollm2-135m", loss="arpo", num_workers=2, micro_batch_size=4, grad_accum=16)
    result = run_training(cfg, rows, run_dir="runs/po-lexical")    # rows: [{prompt_messages, chosen, rejected}]
    result.adapter_dir                                             # runs/po-lexical/adapter (peft save_pretrained)

Data path: the rows are materialised on the driver (a `ray.data.Dataset` is read with `take_all`) and passed to the
workers inside `train_loop_config`; each worker reads its deterministic share (`train.sequences.step_row_indices`).
Preference sets are small (paper 000: 8k pairs), and a plan that depends only on the step number is what lets a
resumed run read exactly the batches an uninterrupted run would. Switch to `ray.train.get_dataset_shard` if the
rows ever stop fitting in worker memory.

Resuming: Ray Train restarts the worker group from the latest checkpoint up to ``max_failures`` times; calling
`run_training` again with the same `run_dir` (same storage path and run name) also resumes from the latest
checkpoint, since Ray Train V2 restores a run from its storage folder (`TorchTrainer.restore` is deprecated in V2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from train.config import TrainConfig
from train.trainer import TrainResult, _collect, _materialise, build_trainer, check_workers_fit, worker_secrets


def run_training(cfg: TrainConfig, train_rows: Any, eval_rows: Any = None, *, run_dir: str,
                 wandb_dir: str = "", where: str = "trainer") -> TrainResult:
    """Train a LoRA adapter with DeepSpeed on Ray Train workers and copy the final adapter to ``<run_dir>/adapter``.

    Args:
        cfg: The run config (validated here).
        train_rows: ``{prompt_messages, chosen, rejected}`` rows (``{prompt_messages, target}`` for SFT), as a list
            or a `ray.data.Dataset`.
        eval_rows: Optional rows of the same shape, evaluated every ``eval_every`` steps and at the end.
        run_dir: Output folder: resolved config, Ray Train storage (unless ``storage_path`` is set), adapter.
        wandb_dir: Where rank 0 writes its W&B run ("" = Ray Train's run folder). A caller whose ``run_dir`` is
            renamed afterwards (a run store stage) passes a folder that is not, so `wandb sync` finds the files.
        where: The config key of `cfg` (errors about the worker group name ``<where>.num_workers``, ...).

    Returns:
        The `TrainResult`.

    Raises:
        ValueError: invalid config or too few rows for one global batch.
        ray.train.TrainingFailedError: the workers failed more than ``max_failures`` times.
    """
    from actors.models import resolve_model_dir
    from train.sequences import plan_total_steps

    cfg.validate()
    check_workers_fit(cfg, where)
    rows, evals = _materialise(train_rows), _materialise(eval_rows)
    total_steps = plan_total_steps(len(rows), cfg.global_batch_size, cfg.epochs, cfg.max_steps)
    out = Path(run_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    storage_path = cfg.storage_path or str(out / "ray")
    (out / "train_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    loop_config = {
        "train": dataclasses.asdict(cfg),
        "model_dir": resolve_model_dir(cfg.model),
        "train_rows": rows,
        "eval_rows": evals,
        "total_steps": total_steps,
        "wandb_dir": wandb_dir or str(Path(storage_path) / cfg.run_name),
        # one W&B run per Ray Train run folder: restarted workers append to it, a new attempt starts another
        "wandb_id": hashlib.sha1(str(Path(storage_path) / cfg.run_name).encode()).hexdigest()[:12],
        # the W&B key by name, when the run is online (never in the workers' runtime env, which Ray logs)
        "secrets": worker_secrets(cfg),
    }
    result = build_trainer(cfg, loop_config, storage_path, loop=preference_worker).fit()
    if result.error is not None:
        raise result.error
    return _collect(result, out, str(Path(storage_path) / cfg.run_name))


def preference_worker(config: dict) -> None:
    """Every worker's function: `train.preference.loop.train_loop_per_worker`, imported in the worker. Ray pickles
    this function by reference, so the driver never imports the loop's DeepSpeed and peft (~3 s of a training
    stage's start on 2 cores, and memory the driver does not need)."""
    from train.collectives import guard_for_rehearsal

    # a rehearsal's check of the cluster's device rule (train.collectives; a no-op elsewhere), before the loop's
    # modules are imported
    guard_for_rehearsal()
    from train.preference.loop import train_loop_per_worker

    train_loop_per_worker(config)


def train_stage(cfg: TrainConfig, train_rows: list, eval_rows: list | None, *, out_dir: str, wandb_dir: str,
                where: str, extra: dict | None = None) -> dict:
    """The body of a run-store `train` stage: at least one global batch of rows (else ConfigError naming `where`),
    `run_training` into ``<out_dir>/run``, the final numeric metrics (plus `extra`) as the stage's one-row table.

    Returns the stage summary: rows, steps, loss, seconds, actor-seconds (seconds x workers) and the Ray node id of
    each rank (`worker_nodes`, by rank).
    """
    import time

    import pyarrow as pa

    from core.errors import ConfigError
    from core.runstore import write_table

    if len(train_rows) < cfg.global_batch_size:
        raise ConfigError(f"{where}: {len(train_rows)} training rows, fewer than one global batch "
                          f"({cfg.global_batch_size}); lower {where}.micro_batch_size / grad_accum")
    started = time.time()
    # W&B writes into `wandb_dir` (the run directory), not the stage's temporary folder, which is renamed when done
    result = run_training(cfg, train_rows, eval_rows or None, run_dir=f"{out_dir}/run", wandb_dir=wandb_dir,
                          where=where)
    seconds = time.time() - started
    metrics = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}
    write_table(pa.Table.from_pylist([{**(extra or {}), **metrics}]), out_dir)
    return {"train_rows": len(train_rows), "eval_rows": len(eval_rows or []), "steps": metrics.get("step"),
            "loss": metrics.get("loss"), "seconds": round(seconds, 3),
            "actor_seconds": round(seconds * cfg.num_workers, 3),
            "worker_nodes": result.metrics.get("worker_nodes", [])}
