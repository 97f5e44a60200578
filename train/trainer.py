"""Driver side of preference training: `TrainConfig` -> Ray Train `TorchTrainer` (DeepSpeed + LoRA) -> `TrainResult`.

    from train.trainer import TrainConfig, run_training
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

from train.ds_config import PRECISIONS, SCHEDULERS, ZERO_STAGES
from train.losses import PreferenceLossConfig

LOSSES = ("dpo", "cpo", "simpo", "cpo_simpo", "arpo", "sft")


@dataclasses.dataclass
class LoraSection:
    """LoRA adapter (paper 000: r=16, alpha=32; dropout and target modules not stated)."""

    r: int = 16
    alpha: int = 32
    # the authors' training code disables LoRA dropout (paper 000 does not state it)
    dropout: float = 0.0
    # module names, or "all-linear" (peft's shorthand for every linear layer but the output head)
    target_modules: list[str] | str = dataclasses.field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                                                 "o_proj"])


@dataclasses.dataclass
class DeepSpeedSection:
    """DeepSpeed ZeRO stage and host offload (see `train.ds_config.build_ds_config`)."""

    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_params: bool = False


@dataclasses.dataclass
class TrainConfig:
    """One preference (or SFT) training run. Defaults are paper 000's ARPO-SimPO settings where it states them.

    Global batch = micro_batch_size × grad_accum × num_workers (paper: 128).
    """

    model: str = "smollm2-135m"
    # dpo | cpo | simpo | cpo_simpo | arpo | sft
    loss: str = "arpo"
    loss_config: PreferenceLossConfig = dataclasses.field(default_factory=PreferenceLossConfig)
    lora: LoraSection = dataclasses.field(default_factory=LoraSection)
    deepspeed: DeepSpeedSection = dataclasses.field(default_factory=DeepSpeedSection)
    lr: float = 1e-4
    warmup_ratio: float = 0.0
    # constant | linear | cosine
    scheduler: str = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    # > 0 overrides epochs
    max_steps: int = 0
    micro_batch_size: int = 4
    grad_accum: int = 32
    max_prompt_length: int = 256
    max_completion_length: int = 128
    # right | left
    padding_side: str = "right"
    # system turn added to rows whose prompt_messages have none
    system_instruction: str = ""
    seed: int = 0
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: int = 1
    # auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16 | fp16
    precision: str = "auto"
    gradient_checkpointing: bool = False
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    max_failures: int = 0
    # "" = <run_dir>/ray
    storage_path: str = ""
    run_name: str = "train"
    log_every: int = 1
    # 0 = evaluate the eval rows only at the end
    eval_every: int = 0
    wandb: bool = False
    wandb_project: str = "quorum"
    # extra environment variables for the workers
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)
    # TEST HOOK: the last rank raises after finishing this step, only in an attempt that started from step 0
    fail_at_step: int = 0

    @property
    def global_batch_size(self) -> int:
        """Pairs per optimizer step over all workers."""
        return self.micro_batch_size * self.grad_accum * self.num_workers

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range or inconsistent."""
        if self.loss not in LOSSES:
            raise ValueError(f"loss: {self.loss!r} is not one of {list(LOSSES)}")
        positive = ("lr", "epochs", "micro_batch_size", "grad_accum", "max_prompt_length", "max_completion_length",
                    "num_workers", "cpus_per_worker", "checkpoint_every", "keep_checkpoints", "log_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("max_steps", "max_failures", "eval_every", "weight_decay", "max_grad_norm", "fail_at_step"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio: must be in [0, 1), got {self.warmup_ratio}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler: {self.scheduler!r} is not one of {list(SCHEDULERS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: {self.precision!r} is not one of {list(PRECISIONS)}")
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side: {self.padding_side!r} is not 'left' or 'right'")
        if not self.model or not self.run_name:
            raise ValueError("model: and run_name: must be non-empty")
        if 0 < self.fail_at_step < self.checkpoint_every:
            raise ValueError(f"fail_at_step: {self.fail_at_step} < checkpoint_every ({self.checkpoint_every}) would "
                             "fail again on every restart (the hook fires only in attempts that start at step 0)")
        self._validate_sections()

    def _validate_sections(self) -> None:
        if self.deepspeed.zero_stage not in ZERO_STAGES:
            raise ValueError(f"deepspeed.zero_stage: {self.deepspeed.zero_stage} is not one of {list(ZERO_STAGES)}")
        if self.deepspeed.offload_params and self.deepspeed.zero_stage != 3:
            raise ValueError("deepspeed.offload_params: needs deepspeed.zero_stage 3")
        if self.deepspeed.offload_optimizer and self.deepspeed.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer: needs deepspeed.zero_stage 2 or 3")
        if self.lora.r <= 0 or self.lora.alpha <= 0:
            raise ValueError(f"lora.r / lora.alpha: must be > 0, got {self.lora.r} / {self.lora.alpha}")
        if not 0.0 <= self.lora.dropout < 1.0:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.lora.dropout}")
        modules = self.lora.target_modules
        if not modules or (isinstance(modules, str) and modules != "all-linear"):
            raise ValueError(f"lora.target_modules: expected a non-empty list or 'all-linear', got {modules!r}")
        if self.loss_config.nll_reduction not in ("token_mean", "seq_mean"):
            raise ValueError(f"loss_config.nll_reduction: {self.loss_config.nll_reduction!r} is not "
                             "'token_mean' or 'seq_mean'")
        if self.loss_config.beta <= 0:
            raise ValueError(f"loss_config.beta: must be > 0, got {self.loss_config.beta}")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Inverse of `dataclasses.asdict` (how the config travels to the workers)."""
        sections = {"loss_config": PreferenceLossConfig, "lora": LoraSection, "deepspeed": DeepSpeedSection}
        kwargs = {k: sections[k](**v) if k in sections else v for k, v in data.items()}
        return cls(**kwargs)


@dataclasses.dataclass
class TrainResult:
    """What a finished run leaves behind."""

    # metrics of the last report (rank 0's view, reduced over workers): step, loss, rewards, ...
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


def worker_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment of every Ray Train worker: DeepSpeed's CPU accelerator off-GPU and one BLAS thread per CPU."""
    env = {"OMP_NUM_THREADS": str(cfg.cpus_per_worker)}
    if not cfg.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    env.update(cfg.env_vars)
    return env


def build_trainer(cfg: TrainConfig, loop_config: dict, storage_path: str) -> Any:
    """The `TorchTrainer` for `cfg`; `loop_config` is the worker function's whole input."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from train.loop import train_loop_per_worker

    scaling = ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                            resources_per_worker={"CPU": cfg.cpus_per_worker})
    run = RunConfig(
        storage_path=storage_path,
        name=cfg.run_name,
        checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        failure_config=FailureConfig(max_failures=cfg.max_failures),
        worker_runtime_env={"env_vars": worker_env(cfg)},
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        scaling_config=scaling,
        run_config=run,
    )


def run_training(cfg: TrainConfig, train_rows: Any, eval_rows: Any = None, *, run_dir: str,
                 wandb_dir: str = "") -> TrainResult:
    """Train a LoRA adapter with DeepSpeed on Ray Train workers and copy the final adapter to ``<run_dir>/adapter``.

    Args:
        cfg: The run config (validated here).
        train_rows: ``{prompt_messages, chosen, rejected}`` rows (``{prompt_messages, target}`` for SFT), as a list
            or a `ray.data.Dataset`.
        eval_rows: Optional rows of the same shape, evaluated every ``eval_every`` steps and at the end.
        run_dir: Output folder: resolved config, Ray Train storage (unless ``storage_path`` is set), adapter.
        wandb_dir: Where rank 0 writes its W&B run ("" = Ray Train's run folder). A caller whose ``run_dir`` is
            renamed afterwards (a run store stage) passes a folder that is not, so `wandb sync` finds the files.

    Returns:
        The `TrainResult`.

    Raises:
        ValueError: invalid config or too few rows for one global batch.
        ray.train.TrainingFailedError: the workers failed more than ``max_failures`` times.
    """
    from actors.models import resolve_model_dir
    from train.pairs_data import plan_total_steps

    cfg.validate()
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
    }
    result = build_trainer(cfg, loop_config, storage_path).fit()
    if result.error is not None:
        raise result.error
    return _collect(result, out, str(Path(storage_path) / cfg.run_name))


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
