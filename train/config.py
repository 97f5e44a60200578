"""The trainers' configs: one family. `TrainConfig` (preference / SFT training) and `GRPOConfig` (GRPO) are built
from the same sections (`train.config_sections`), so every shared field is declared, documented and validated once.

A trainer config is flat in YAML (`trainer.lr`, `grpo.num_workers`, ...), so the shared sections are dataclass
bases rather than nested keys: each base declares its fields and checks them in `_check_<section>(where)`, and
`check(where)` runs every base's check, then the trainer's own (`core.config.Section`: `check_tree` calls it with the
key the job nests the trainer under, so an error names e.g. `train.trainer.lora.r`). A trainer whose paper sets other defaults (GRPO: MENLO's lr, batch
and lengths) restates only the default, never the field's type or its check.

    cfg = load_config(GRPOConfig, None, ["group_size=4"])   # via core.config, like every job section
    cfg.validate()                                        # ConfigError naming the first bad field
    GRPOConfig.from_dict(dataclasses.asdict(cfg)) == cfg  # how a config travels to the Ray Train workers
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from core.config import dotted, fail, one_of, positive
from train.config_sections import (
    CheckpointFields,
    DeepSpeedSection,
    LoraSection,
    ModelFields,
    OptimiserFields,
    PreferenceLossConfig,
    RolloutSection,
    TrackingFields,
    WorkerFields,
)
from train.memory_budget import WorkerPlan, grpo_plan, problems, train_plan

# the sections are declared in train.config_sections; callers import them from here with the trainers
__all__ = ["DeepSpeedSection", "GRPOConfig", "LoraSection", "RolloutSection", "TrainConfig", "TrainerBase"]

LOSSES = ("dpo", "cpo", "simpo", "cpo_simpo", "arpo", "sft")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3")
VAL_METRICS = ("reward", "vs_baseline")


@dataclasses.dataclass
class TrainerBase(TrackingFields, CheckpointFields, WorkerFields, OptimiserFields, ModelFields):
    """What every trainer config has; `check` checks the shared sections, then the trainer's `_check_own`."""

    def check(self, where: str = "") -> None:
        """Raise ConfigError naming the first field that is out of range or inconsistent."""
        self._check_model(where)
        self._check_optimiser(where)
        self._check_workers(where)
        self._check_checkpoints(where)
        self._check_tracking(where)
        self._check_own(where)

    def _check_own(self, where: str) -> None:
        """The trainer's own fields; the shared ones are checked already."""

    def memory_plan(self) -> WorkerPlan | None:
        """The GPU memory budget's inputs (`train.memory_budget`); None where it cannot be checked."""
        return None

    def _check_memory(self, where: str) -> None:
        """Refuse a GPU config whose worker cannot fit the card it names (`gpu_type`)."""
        plan = self.memory_plan()
        found = problems(plan) if plan is not None else []
        if found:
            (key, message), *more = found
            fail(dotted(where, key), message + "".join(f"; and {dotted(where, k)}: {m}" for k, m in more))

    @property
    def optimizer_steps_per_step(self) -> int:
        """DeepSpeed optimizer steps (and LR-scheduler steps) per training step of the run plan."""
        return 1

    def schedule_steps(self, total_steps: int) -> int:
        """Length of the learning-rate schedule in scheduler steps: DeepSpeed steps the scheduler once per
        optimizer step, so a run of `total_steps` training steps is `total_steps x optimizer_steps_per_step` long."""
        return total_steps * self.optimizer_steps_per_step

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
    grad_accum: int = 32  # micro-batches per optimizer step on each worker (>= 1)
    # side the batch's sequences are padded on: right | left
    padding_side: str = "right"
    log_every: int = 1  # report training metrics every this many optimizer steps (>= 1)
    # TEST HOOK: the last rank raises after finishing this step, only in an attempt that started from step 0
    fail_at_step: int = 0

    @property
    def global_batch_size(self) -> int:
        """Pairs per optimizer step over all workers."""
        return self.micro_batch_size * self.grad_accum * self.num_workers

    def _check_own(self, where: str) -> None:
        one_of(self.loss, LOSSES, dotted(where, "loss"))
        for name in ("grad_accum", "log_every"):
            positive(getattr(self, name), dotted(where, name))
        one_of(self.padding_side, ("left", "right"), dotted(where, "padding_side"))
        if 0 < self.fail_at_step < self.checkpoint_every:
            fail(dotted(where, "fail_at_step"), f"{self.fail_at_step} < checkpoint_every ({self.checkpoint_every}) would "
                 "fail again on every restart (the hook fires only in attempts that start at step 0)")
        one_of(self.loss_config.nll_reduction, ("token_mean", "seq_mean", "sum"),
               dotted(where, "loss_config.nll_reduction"))
        positive(self.loss_config.beta, dotted(where, "loss_config.beta"))
        self._check_memory(where)

    def memory_plan(self) -> WorkerPlan | None:
        """The update phase alone (`train.memory_budget.train_plan`); None where it cannot be checked."""
        return train_plan(self)


@dataclasses.dataclass
class GRPOConfig(TrainerBase):
    """One GRPO run. Per step: `prompts_per_step` prompts over all workers, `group_size` rollouts each.

    Defaults are MENLO's judge-RL settings (paper 003 §3.2, verl defaults where the paper is silent).
    """

    # MENLO's values of shared fields (declared and checked in the bases)
    lr: float = 1e-6
    scheduler: str = "constant"  # constant | linear | cosine (verl's default: constant)
    weight_decay: float = 0.01  # AdamW decoupled weight decay (verl's default 0.01)
    # rollouts per forward/backward on one worker; must divide the worker's rollouts per step
    micro_batch_size: int = 8
    max_prompt_length: int = 4096  # prompt token budget (MENLO: 4,096); longer prompts lose their user turn's tail
    max_completion_length: int = 4096  # most new tokens per rollout (MENLO: 4,096 for the judge)
    run_name: str = "grpo"  # the run's folder under storage_path (<storage_path>/<run_name>); non-empty

    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    group_size: int = 8  # rollouts G sampled per prompt, the group its advantages compare (MENLO: 8; >= 2)
    prompts_per_step: int = 32  # prompts per training step over all workers (MENLO batch size 32); splits evenly
    # optimizer steps on the same rollouts (TRL num_iterations / verl ppo_epochs); >1 makes the clip bind
    num_iterations: int = 1
    clip_eps_low: float = 0.2  # ε_low: the ratio is clipped below at 1 - ε_low (verl clip_ratio 0.2)
    clip_eps_high: float = 0.2  # ε_high: clipped above at 1 + ε_high; > ε_low is DAPO's clip-higher
    # β of the KL-to-reference term (reference = the initial policy: LoRA disabled, or with finetune full a frozen
    # copy of the model partitioned like the policy); 0 = no reference forward and no reference copy
    kl_coef: float = 0.0
    kl_kind: str = "k3"  # KL estimator (Schulman): k1 = -log r | k2 = (log r)^2 / 2 | k3 = (r - 1) - log r
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
    # vs_baseline (GRM reward only: one answer per prompt judged against the initial policy's answer, sampled
    # before the first update, in both orders, val/vs_baseline/score = win rate with ties counted half; MENLO §5.2)
    val_metric: str = "reward"

    @property
    def prompts_per_worker(self) -> int:
        return self.prompts_per_step // self.num_workers

    @property
    def optimizer_steps_per_step(self) -> int:
        """`num_iterations` optimizer steps on each GRPO step's rollouts (`train.grpo.loop.policy_update`)."""
        return self.num_iterations

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step and worker (read by `train.engine.build_engine`)."""
        return self.prompts_per_worker * self.group_size // self.micro_batch_size

    def _check_own(self, where: str) -> None:
        # kl_coef, entropy_coef, clip_eps_*, max_failed_steps, log_samples_every >= 0: check_tree's floor
        for name in ("prompts_per_step", "num_iterations"):
            positive(getattr(self, name), dotted(where, name))
        if self.group_size < 2:
            fail(dotted(where, "group_size"), f"GRPO compares the rollouts of a prompt, needs >= 2, got {self.group_size}")
        if self.prompts_per_step % self.num_workers:
            fail(dotted(where, "prompts_per_step"), f"{self.prompts_per_step} does not split evenly over num_workers "
                                                 f"({self.num_workers})")
        if (self.prompts_per_worker * self.group_size) % self.micro_batch_size:
            fail(dotted(where, "micro_batch_size"), f"{self.micro_batch_size} must divide the rollouts per worker and "
                 f"step ({self.prompts_per_worker} prompts x {self.group_size})")
        one_of(self.loss_agg, LOSS_AGGS, dotted(where, "loss_agg"))
        one_of(self.kl_kind, KL_KINDS, dotted(where, "kl_kind"))
        one_of(self.val_metric, VAL_METRICS, dotted(where, "val_metric"))
        if self.rollout.kind == "vllm" and not self.use_gpu and not self.rollout.vllm_cpu:
            fail(dotted(where, "rollout.kind"), "vllm rollouts run on each worker's GPU; set use_gpu: true (or kind: "
                 "hf; `quorum rehearse` runs them on vLLM's CPU build)")
        self._check_memory(where)

    def memory_plan(self) -> WorkerPlan | None:
        """Rollout engine and training (`train.memory_budget.grpo_plan`); None where it cannot be checked."""
        return grpo_plan(self)
