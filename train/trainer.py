"""The Ray Train side both trainers share (preference training: `train.preference.trainer`; GRPO:
`train.grpo.trainer`): the worker group's resources, environment and secrets, the `TorchTrainer`, and the adapter and
metrics a finished run leaves (`TrainResult`).

Results: Ray Train V2's `Result.metrics` are the metrics attached to the latest *checkpoint*; the worker loop always
checkpoints its last step, so they are the run's final metrics.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from train.config import TrainerBase


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
    # finetune full: <run_dir>/model, the 16-bit Hugging Face export of the trained model (no adapter_dir then)
    model_dir: str | None = None
    # finetune full with validation prompts: the export of the best validation score (<run_dir>/best_model)
    best_model_dir: str | None = None
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


def workers_ask(cfg: TrainerBase, where: str) -> Any:
    """The worker group as a `core.resource_fit.Ask`: `num_workers` units of the worker's resources (one GPU each
    with `use_gpu`), named by the `where.*` keys."""
    from core.resource_fit import Ask

    unit = worker_resources(cfg)
    if cfg.use_gpu:  # ScalingConfig(use_gpu=True) gives each worker one GPU
        unit.setdefault("GPU", 1.0)
    keys = (f"{where}.num_workers", f"{where}.cpus_per_worker",
            *((f"{where}.resources_per_worker",) if cfg.resources_per_worker else ()),
            *((f"{where}.use_gpu",) if cfg.use_gpu else ()))
    return Ask("training", "workers", cfg.num_workers, unit, keys)


def check_workers_fit(cfg: TrainerBase, where: str) -> None:
    """Refuse (ConfigError naming the `where.*` keys) a worker group the cluster can never place: Ray Train would
    wait for it for ever. Where an autoscaler can add the nodes, wait for them, bounded (`actors.ray_capacity`)."""
    from actors.ray_capacity import ensure_fits

    ensure_fits(workers_ask(cfg, where))


def build_trainer(cfg: TrainerBase, loop_config: dict, storage_path: str, loop: Any) -> Any:
    """The `TorchTrainer` for `cfg` (either trainer's config); `loop_config` is the worker function's whole input,
    `loop` the worker function (`train.preference.trainer.preference_worker`, `train.grpo.trainer.grpo_worker`: each
    imports its loop in the worker)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

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
        # a rank that waits longer than this in a collective fails the group (GRPO checks the reward wait against it)
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo", timeout_s=cfg.collective_timeout_s),
        scaling_config=scaling,
        run_config=run,
    )


def _collect(result: Any, out: Path, storage_dir: str) -> TrainResult:
    """Copy the adapter (or the full model's export) of the latest checkpoint next to the run's other outputs."""
    checkpoint_path, copied = None, {}
    if result.checkpoint is not None:
        checkpoint_path = result.checkpoint.path
        with result.checkpoint.as_directory() as ckpt_dir:
            for name in ("adapter", "model"):  # finetune lora / full
                source = Path(ckpt_dir) / name
                if source.is_dir():
                    copied[name] = str(out / name)
                    shutil.rmtree(copied[name], ignore_errors=True)
                    shutil.copytree(source, copied[name])
    metrics = dict(result.metrics or {})
    (out / "final_metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    history = sorted((dict(m) for _, m in result.best_checkpoints or []), key=lambda m: m.get("step", 0))
    return TrainResult(metrics=metrics, checkpoint_path=checkpoint_path, adapter_dir=copied.get("adapter"),
                       storage_dir=storage_dir, history=history, model_dir=copied.get("model"))
