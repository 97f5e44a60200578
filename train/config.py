"""The trainers' configs: one family. `TrainConfig` (preference / SFT training) and `GRPOConfig` (GRPO) are built
from the same sections, so every shared field is declared, documented and validated once, here.

A trainer config is flat in YAML (`trainer.lr`, `grpo.num_workers`, ...), so the shared sections are dataclass
bases rather than nested keys: each base declares its fields and checks them in `_check_<section>`, and `validate`
runs every base's check, then the trainer's own. A trainer whose paper sets other defaults (GRPO: MENLO's lr, batch
and lengths) restates only the default, never the field's type or its check.

    cfg = load_config(GRPOConfig, None, ["group_size=4"])   # via core.config, like every job section
    cfg.validate()                                        # ValueError naming the first bad field
    GRPOConfig.from_dict(dataclasses.asdict(cfg)) == cfg  # how a config travels to the Ray Train workers
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any

from train.ds_config import PRECISIONS, SCHEDULERS, ZERO_STAGES
from train.losses import PreferenceLossConfig

LOSSES = ("dpo", "cpo", "simpo", "cpo_simpo", "arpo", "sft")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3")
ROLLOUT_KINDS = ("hf", "vllm")
VAL_METRICS = ("reward", "vs_baseline")


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name}: must be > 0, got {getattr(cfg, name)}")


def _non_negative(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name}: must be >= 0, got {getattr(cfg, name)}")


def _one_of(cfg: Any, name: str, allowed: tuple) -> None:
    if getattr(cfg, name) not in allowed:
        raise ValueError(f"{name}: {getattr(cfg, name)!r} is not one of {list(allowed)}")


# ---------------------------------------------------------------------------------------------------------------
# Nested sections


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

    def _check(self) -> None:
        if self.r <= 0 or self.alpha <= 0:
            raise ValueError(f"lora.r / lora.alpha: must be > 0, got {self.r} / {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules or (isinstance(self.target_modules, str) and self.target_modules != "all-linear"):
            raise ValueError(f"lora.target_modules: expected a non-empty list or 'all-linear', got "
                             f"{self.target_modules!r}")


@dataclasses.dataclass
class DeepSpeedSection:
    """DeepSpeed ZeRO stage and host offload (see `train.ds_config.build_ds_config`)."""

    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_params: bool = False

    def _check(self) -> None:
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"deepspeed.zero_stage: {self.zero_stage} is not one of {list(ZERO_STAGES)}")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("deepspeed.offload_params: needs deepspeed.zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer: needs deepspeed.zero_stage 2 or 3")


@dataclasses.dataclass
class RolloutSection:
    """How each GRPO worker samples its rollouts from its current policy."""

    # hf: `generate` on the worker's own (LoRA) policy (train.hf_rollout.HFRollout); vllm: a vLLM engine colocated
    # on each worker's GPU that receives the LoRA adapter after every optimizer step (train.vllm_rollout)
    kind: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    # 0 = no top-k cut
    top_k: int = 0
    # vllm: share of the worker's GPU memory for the rollout engine (weights + KV cache); DeepSpeed gets the rest
    gpu_memory_utilization: float = 0.3

    def _check(self, use_gpu: bool) -> None:
        if self.kind not in ROLLOUT_KINDS:
            raise ValueError(f"rollout.kind: {self.kind!r} is not one of {list(ROLLOUT_KINDS)}")
        if self.kind == "vllm" and not use_gpu:
            raise ValueError("rollout.kind: vllm rollouts run on each worker's GPU; set use_gpu: true (or kind: hf)")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"rollout.gpu_memory_utilization: must be in (0, 1), got {self.gpu_memory_utilization}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("rollout: need temperature > 0 (GRPO samples), 0 < top_p <= 1 and top_k >= 0")


# ---------------------------------------------------------------------------------------------------------------
# Flat sections every trainer has (bases; a dataclass lists the last base's fields first)


@dataclasses.dataclass
class ModelFields:
    model: str = "smollm2-135m"
    lora: LoraSection = dataclasses.field(default_factory=LoraSection)
    deepspeed: DeepSpeedSection = dataclasses.field(default_factory=DeepSpeedSection)
    # system turn added to rows whose prompt_messages have none
    system_instruction: str = ""
    max_prompt_length: int = 256
    max_completion_length: int = 128
    # a peft LoRA adapter directory training starts from instead of a fresh LoRA (paper 003's SFT -> RL: a judge_sft
    # run's train/run/adapter); its r, alpha and target modules must equal `lora`'s. "" = a fresh adapter
    init_adapter: str = ""

    def _check_model(self) -> None:
        if not self.model:
            raise ValueError("model: must be non-empty")
        _positive(self, "max_prompt_length", "max_completion_length")
        self.deepspeed._check()
        self.lora._check()
        if self.init_adapter:
            self._check_init_adapter()

    def _check_init_adapter(self) -> None:
        """The adapter must exist and have `lora`'s shape: the rollout engine, checkpoints and the vLLM LoRA slot are
        all sized from `lora`, so a silently different adapter would break them later."""
        path = os.path.join(self.init_adapter, "adapter_config.json")
        if not os.path.isfile(path):
            raise ValueError(f"init_adapter: {self.init_adapter!r} is not a peft adapter directory (no "
                             "adapter_config.json)")
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        for key, ours in (("r", self.lora.r), ("lora_alpha", self.lora.alpha)):
            if saved.get(key) != ours:
                raise ValueError(f"lora.{'alpha' if key == 'lora_alpha' else key}: {ours} differs from the "
                                 f"init_adapter's {saved.get(key)}; set it to the adapter's")
        if sorted(saved.get("target_modules") or []) != sorted(self.lora.target_modules):
            raise ValueError(f"lora.target_modules: {self.lora.target_modules} differs from the init_adapter's "
                             f"{sorted(saved.get('target_modules') or [])}")


@dataclasses.dataclass
class OptimiserFields:
    """AdamW and the learning-rate schedule (`train.ds_config`)."""

    lr: float = 1e-4
    warmup_ratio: float = 0.0
    # constant | linear | cosine
    scheduler: str = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    # > 0 overrides epochs
    max_steps: int = 0
    seed: int = 0

    def _check_optimiser(self) -> None:
        _positive(self, "lr", "epochs")
        _non_negative(self, "max_steps", "weight_decay", "max_grad_norm")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio: must be in [0, 1), got {self.warmup_ratio}")
        _one_of(self, "scheduler", SCHEDULERS)


@dataclasses.dataclass
class WorkerFields:
    """The Ray Train worker group and its numerics."""

    # rows (pairs, rollouts) per forward/backward on one worker
    micro_batch_size: int = 4
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: int = 1
    # auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16 | fp16
    precision: str = "auto"
    gradient_checkpointing: bool = False
    # extra environment variables for the workers (never secrets: core.config refuses secret-looking names)
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)

    def _check_workers(self) -> None:
        _positive(self, "micro_batch_size", "num_workers", "cpus_per_worker")
        _one_of(self, "precision", PRECISIONS)


@dataclasses.dataclass
class CheckpointFields:
    """Ray Train checkpoints, restarts and the run's storage folder."""

    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    max_failures: int = 0
    # "" = <run_dir>/ray
    storage_path: str = ""
    run_name: str = "train"
    # evaluate (GRPO: validate, keeping the best adapter) every this many steps; 0 = only after the last step
    eval_every: int = 0

    def _check_checkpoints(self) -> None:
        _positive(self, "checkpoint_every", "keep_checkpoints")
        _non_negative(self, "max_failures", "eval_every")
        if not self.run_name:
            raise ValueError("run_name: must be non-empty")


@dataclasses.dataclass
class TrackingFields:
    """W&B on rank 0 (offline unless WANDB_API_KEY is set)."""

    wandb: bool = False
    wandb_project: str = "quorum"


@dataclasses.dataclass
class TrainerBase(TrackingFields, CheckpointFields, WorkerFields, OptimiserFields, ModelFields):
    """What every trainer config has; `validate` checks the shared sections, then the trainer's `_check_own`."""

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range or inconsistent."""
        self._check_model()
        self._check_optimiser()
        self._check_workers()
        self._check_checkpoints()
        self._check_own()

    def _check_own(self) -> None:
        """The trainer's own fields; the shared ones are checked already."""

    @classmethod
    def from_dict(cls, data: dict) -> Any:
        """Inverse of `dataclasses.asdict` (how the config travels to the workers)."""
        hints = typing.get_type_hints(cls)
        return cls(**{k: hints[k](**v) if dataclasses.is_dataclass(hints[k]) else v for k, v in data.items()})


# ---------------------------------------------------------------------------------------------------------------
# The two trainers


@dataclasses.dataclass
class TrainConfig(TrainerBase):
    """One preference (or SFT) training run. Defaults are paper 000's ARPO-SimPO settings where it states them.

    Global batch = micro_batch_size × grad_accum × num_workers (paper: 128).
    """

    # dpo | cpo | simpo | cpo_simpo | arpo | sft
    loss: str = "arpo"
    loss_config: PreferenceLossConfig = dataclasses.field(default_factory=PreferenceLossConfig)
    grad_accum: int = 32
    # right | left
    padding_side: str = "right"
    log_every: int = 1
    # TEST HOOK: the last rank raises after finishing this step, only in an attempt that started from step 0
    fail_at_step: int = 0

    @property
    def global_batch_size(self) -> int:
        """Pairs per optimizer step over all workers."""
        return self.micro_batch_size * self.grad_accum * self.num_workers

    def _check_own(self) -> None:
        _one_of(self, "loss", LOSSES)
        _positive(self, "grad_accum", "log_every")
        _non_negative(self, "fail_at_step")
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side: {self.padding_side!r} is not 'left' or 'right'")
        if 0 < self.fail_at_step < self.checkpoint_every:
            raise ValueError(f"fail_at_step: {self.fail_at_step} < checkpoint_every ({self.checkpoint_every}) would "
                             "fail again on every restart (the hook fires only in attempts that start at step 0)")
        if self.loss_config.nll_reduction not in ("token_mean", "seq_mean"):
            raise ValueError(f"loss_config.nll_reduction: {self.loss_config.nll_reduction!r} is not "
                             "'token_mean' or 'seq_mean'")
        if self.loss_config.beta <= 0:
            raise ValueError(f"loss_config.beta: must be > 0, got {self.loss_config.beta}")


@dataclasses.dataclass
class GRPOConfig(TrainerBase):
    """One GRPO run. Per step: `prompts_per_step` prompts over all workers, `group_size` rollouts each.

    Defaults are MENLO's judge-RL settings (paper 003 §3.2, verl defaults where the paper is silent).
    """

    # MENLO's values of shared fields (declared and checked in the bases)
    lr: float = 1e-6
    scheduler: str = "constant"
    weight_decay: float = 0.01
    micro_batch_size: int = 8
    max_prompt_length: int = 4096
    max_completion_length: int = 4096
    run_name: str = "grpo"

    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    group_size: int = 8
    prompts_per_step: int = 32
    # optimizer steps on the same rollouts (TRL num_iterations / verl ppo_epochs); >1 makes the clip bind
    num_iterations: int = 1
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    # β of the KL-to-reference term (reference = the base model: LoRA disabled); 0 = no reference forward
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    # bonus on the policy's token entropy, subtracted from the loss (verl entropy_coeff; the paper leaves it 0)
    entropy_coef: float = 0.0
    # token_mean (verl token-mean) | seq_mean_token_mean | seq_mean_token_sum | seq_mean_token_sum_norm (Dr. GRPO)
    loss_agg: str = "token_mean"
    # divide advantages by the group std (GRPO); false = Dr. GRPO
    normalize_std: bool = True
    # stop the run when every group of this many consecutive steps failed (a dead reward service); 0 = never
    max_failed_steps: int = 0
    # rollout samples (prompt, completion, reward) logged to W&B every this many steps; 0 = never
    log_samples_every: int = 0
    # the chat template's enable_thinking (Qwen3): false = non-thinking rollouts (MENLO §5's policy); the judge
    # configs set true (its output format opens with a <think> block); templates without the switch ignore it
    thinking: bool = False
    # what picks the best adapter: reward (mean training reward of G rollouts per prompt, val/reward/mean) or
    # vs_baseline (GRM reward only: one answer per prompt judged against the LoRA-disabled base model's answer in
    # both orders, val/vs_baseline/score = win rate with ties counted half; MENLO §5.2)
    val_metric: str = "reward"

    @property
    def prompts_per_worker(self) -> int:
        return self.prompts_per_step // self.num_workers

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step and worker (read by `train.loop.build_engine`)."""
        return self.prompts_per_worker * self.group_size // self.micro_batch_size

    def _check_own(self) -> None:
        _positive(self, "group_size", "prompts_per_step", "num_iterations")
        _non_negative(self, "kl_coef", "entropy_coef", "max_failed_steps", "log_samples_every", "clip_eps_low",
                      "clip_eps_high")
        if self.group_size < 2:
            raise ValueError(f"group_size: GRPO compares the rollouts of a prompt, needs >= 2, got {self.group_size}")
        if self.prompts_per_step % self.num_workers:
            raise ValueError(f"prompts_per_step: {self.prompts_per_step} does not split evenly over num_workers "
                             f"({self.num_workers})")
        if (self.prompts_per_worker * self.group_size) % self.micro_batch_size:
            raise ValueError(f"micro_batch_size: {self.micro_batch_size} must divide the rollouts per worker and "
                             f"step ({self.prompts_per_worker} prompts x {self.group_size})")
        _one_of(self, "loss_agg", LOSS_AGGS)
        _one_of(self, "kl_kind", KL_KINDS)
        _one_of(self, "val_metric", VAL_METRICS)
        self.rollout._check(self.use_gpu)
