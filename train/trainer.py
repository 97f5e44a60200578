"""Driver side of preference training: `TrainConfig` -> Ray Train `TorchTrainer` (DeepSpeed + LoRA) -> `TrainResult`.

    from train.config import TrainConfig
    from train.trainer import run_training
    cfg = TrainConfig(model="smollm2-135m", loss="arpo", num_workers=2, micro_batch_size=4, grad_accum=16)
    result = run_training(cfg, rows, run_dir="runs/po-lexical")    # rows: [{prompt_messages, chosen, rejected}]
    result.adapter_dir                                             # runs/po-lexical/adapter (peft save_pretrained)

Data path: the rows are materialised on the driver (a `ray.data.Dataset` is read with `take_all`) and passed to the
workers inside `train_loop_config`; each worker reads its deterministic share (`pairs_data.step_row_indices`).
Preference sets are small (paper 000: 8k pairs), and a plan that depends only on the step number is what lets a
resumed run read exactly the batches an uninterrupted run would. Switch to `ray.train.get_dataset_shard` if the
rows ever stop fitting in worker memory.

Results: Ray Train V2's `Result.metrics` are the metrics attached to the latest *checkpoint*; the worker loop always
checkpoints its last step, so they are the run's final metrics.

Resuming: Ray Train restarts the worker group from the latest checkpoint up to ``max_failures`` times; calling
`run_training` again with the same `run_dir` (same storage path and run name) also resumes from the latest
checkpoint, since Ray Train V2 restores a run from its storage folder (`TorchTrainer.restore` is deprecated in V2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from train.config import TrainConfig, TrainerBase


@dataclasses.dataclass
class TrainResult:
    """What a finished run leaves behind."""

    # metrics of the last report (rank 0's view, reduced over workers): step, loss, rewards, ...; worker_nodes: the
    # Ray node id of each rank, by rank
    metrics: dict[str, Any]
    # the latest Ray Train checkpoint (adapter + DeepSpeed engine state), or None
    checkpoint_path: str | None
    # <run_dir>/adapter: the LoRA adapter saved with peft `save_pretrained` (no merged weights)
    adapter_dir: str | None
    # Ray Train's folder for this run: <storage_path>/<run_name>
    storage_dir: str
    # metrics of every kept checkpoint, by step (Ray Train V2 keeps no driver-side history of other reports)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # GRPO with validation prompts: the adapter with the best val/reward/mean and its best.json (step, score, ...)
    best_adapter_dir: str | None = None
    best: dict[str, Any] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Driver


def _materialise(rows: Any) -> list[dict]:
    if rows is None:
        return []
    if isinstance(rows, list):
        return rows
    if hasattr(rows, "take_all"):  # ray.data.Dataset, without importing ray.data here
        return rows.take_all()
    raise TypeError(f"rows: expected a list of dicts or a ray.data.Dataset, got {type(rows).__name__}")


def worker_env(cfg: TrainerBase) -> dict[str, str]:
    """Environment of every Ray Train worker: DeepSpeed's CPU accelerator off-GPU and one BLAS thread per CPU."""
    env = {"OMP_NUM_THREADS": str(cfg.cpus_per_worker)}
    if not cfg.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    env.update(cfg.env_vars)
    return env


def worker_resources(cfg: TrainerBase) -> dict[str, float]:
    """Ray resources of one training worker: its CPUs plus the config's custom resources ({gpu_slot: 1})."""
    return {"CPU": cfg.cpus_per_worker, **{k: float(v) for k, v in cfg.resources_per_worker.items()}}


def worker_secrets(cfg: TrainerBase, names: Any = ()) -> Any:
    """The secret variables a trainer's workers install (`actors.secrets.Secrets`: values travel in the loop config,
    pickled, never in a runtime env): `names` plus the W&B key when the trainer's runs are online."""
    from actors.secrets import Secrets
    from core.tracking import wandb_secret_names

    return Secrets([*names, *(wandb_secret_names(cfg.wandb_mode) if cfg.wandb else [])])


def accelerator_type(cfg: TrainerBase) -> str | None:
    """The Ray accelerator label the GPU workers must be placed on (`gpu_type`; Ray labels every A100 "A100")."""
    from train.memory_budget import RAY_ACCELERATOR_TYPE

    return RAY_ACCELERATOR_TYPE.get(cfg.gpu_type, cfg.gpu_type) if cfg.use_gpu and cfg.gpu_type else None


def check_workers_fit(cfg: TrainerBase, where: str) -> None:
    """Refuse (ConfigError naming the `where.*` keys) a worker group the cluster can never place: Ray Train would
    wait for it for ever. Where an autoscaler can add the nodes, wait for them, bounded (`actors.ray_capacity`)."""
    from actors.ray_capacity import ensure_fits
    from core.resource_fit import Ask

    unit = worker_resources(cfg)
    if cfg.use_gpu:  # ScalingConfig(use_gpu=True) gives each worker one GPU
        unit.setdefault("GPU", 1.0)
    keys = (f"{where}.num_workers", f"{where}.cpus_per_worker",
            *((f"{where}.resources_per_worker",) if cfg.resources_per_worker else ()),
            *((f"{where}.use_gpu",) if cfg.use_gpu else ()))
    ensure_fits(Ask("training", "workers", cfg.num_workers, unit, keys))


def build_trainer(cfg: TrainerBase, loop_config: dict, storage_path: str, loop: Any = None) -> Any:
    """The `TorchTrainer` for `cfg` (either trainer's config); `loop_config` is the worker function's whole input,
    `loop` the worker function (default: preference training's `train.loop.train_loop_per_worker`)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if loop is None:
        from train.loop import train_loop_per_worker as loop

    scaling = ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                            resources_per_worker=worker_resources(cfg), accelerator_type=accelerator_type(cfg))
    run = RunConfig(
        storage_path=storage_path,
        name=cfg.run_name,
        checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        failure_config=FailureConfig(max_failures=cfg.max_failures),
        worker_runtime_env={"env_vars": worker_env(cfg)},
    )
    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        scaling_config=scaling,
        run_config=run,
    )


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
    from train.pairs_data import plan_total_steps

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
    result = build_trainer(cfg, loop_config, storage_path).fit()
    if result.error is not None:
        raise result.error
    return _collect(result, out, str(Path(storage_path) / cfg.run_name))


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


def _collect(result: Any, out: Path, storage_dir: str) -> TrainResult:
    """Copy the adapter of the latest checkpoint next to the run's other outputs."""
    checkpoint_path, adapter_dir = None, None
    if result.checkpoint is not None:
        checkpoint_path = result.checkpoint.path
        with result.checkpoint.as_directory() as ckpt_dir:
            source = Path(ckpt_dir) / "adapter"
            if source.is_dir():
                adapter_dir = str(out / "adapter")
                shutil.rmtree(adapter_dir, ignore_errors=True)
                shutil.copytree(source, adapter_dir)
    metrics = dict(result.metrics or {})
    (out / "final_metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    history = sorted((dict(m) for _, m in result.best_checkpoints or []), key=lambda m: m.get("step", 0))
    return TrainResult(metrics=metrics, checkpoint_path=checkpoint_path, adapter_dir=adapter_dir,
                       storage_dir=storage_dir, history=history)
