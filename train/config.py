"""The trainers' configs: one family. `TrainConfig` (preference / SFT training) and `GRPOConfig` (GRPO) are built
from the same sections, so every shared field is declared, documented and validated once, here.

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
import json
import os
import typing
from typing import Any

from core.config import Section, check_custom_resources, dotted, fail, in_range, one_of, positive
from train.ds_config import PRECISIONS, SCHEDULERS, ZERO_STAGES
from train.memory_budget import GPU_MEMORY_MIB, WorkerPlan, grpo_plan, problems
from train.preference_loss import PreferenceLossConfig

LOSSES = ("dpo", "cpo", "simpo", "cpo_simpo", "arpo", "sft")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3")
ROLLOUT_KINDS = ("hf", "vllm")
VAL_METRICS = ("reward", "vs_baseline")


# ---------------------------------------------------------------------------------------------------------------
# Nested sections


@dataclasses.dataclass
class LoraSection(Section):
    """LoRA adapter (paper 000: r=16, alpha=32; dropout and target modules not stated)."""

    r: int = 16  # LoRA rank (paper 000: 16); an init_adapter must have the same
    alpha: int = 32  # LoRA scaling α (update scaled by alpha / r; paper 000: 32)
    # the authors' training code disables LoRA dropout (paper 000 does not state it)
    dropout: float = 0.0
    # module names, or "all-linear" (peft's shorthand for every linear layer but the output head)
    target_modules: list[str] | str = dataclasses.field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                                                 "o_proj"])

    def check(self, where: str = "") -> None:
        positive(self.r, dotted(where, "r"))
        positive(self.alpha, dotted(where, "alpha"))
        in_range(self.dropout, 0, 1, dotted(where, "dropout"), high_open=True)
        if not self.target_modules or (isinstance(self.target_modules, str) and self.target_modules != "all-linear"):
            fail(dotted(where, "target_modules"), f"expected a non-empty list or 'all-linear', got {self.target_modules!r}")


@dataclasses.dataclass
class DeepSpeedSection(Section):
    """DeepSpeed ZeRO stage and host offload (see `train.ds_config.build_ds_config`)."""

    zero_stage: int = 2  # 0 (plain data parallel) | 2 (optimizer state + gradients sharded) | 3 (+ parameters)
    offload_optimizer: bool = False  # keep optimizer state on the host CPU (ZeRO-2/3 only)
    offload_params: bool = False  # keep parameters on the host CPU (ZeRO-3 only)

    def check(self, where: str = "") -> None:
        one_of(self.zero_stage, ZERO_STAGES, dotted(where, "zero_stage"))
        if self.offload_params and self.zero_stage != 3:
            fail(dotted(where, "offload_params"), f"needs {dotted(where, 'zero_stage')} 3")
        if self.offload_optimizer and self.zero_stage == 0:
            fail(dotted(where, "offload_optimizer"), f"needs {dotted(where, 'zero_stage')} 2 or 3")


@dataclasses.dataclass
class RolloutSection(Section):
    """How each GRPO worker samples its rollouts from its current policy."""

    # hf: `generate` on the worker's own (LoRA) policy (train.hf_rollout.HFRollout); vllm: a vLLM engine colocated
    # on each worker's GPU that receives the LoRA adapter after every optimizer step (train.vllm_rollout)
    kind: str = "hf"
    temperature: float = 1.0  # rollout sampling temperature (> 0: GRPO needs varied rollouts)
    top_p: float = 1.0  # rollout nucleus mass in (0, 1]; 1 = no nucleus filter
    # 0 = no top-k cut
    top_k: int = 0
    # vllm: share of the worker's GPU memory for the rollout engine (weights + KV cache); DeepSpeed gets the rest
    gpu_memory_utilization: float = 0.3
    # prompts per generate call (0 = all of a worker's prompts in one); each call's groups go to the judge as it
    # returns (reward.overlap): smaller calls hide more judging, in smaller batches (docs/throughput.md)
    prompts_per_generate: int = 0

    def check(self, where: str = "") -> None:
        one_of(self.kind, ROLLOUT_KINDS, dotted(where, "kind"))
        in_range(self.gpu_memory_utilization, 0, 1, dotted(where, "gpu_memory_utilization"), low_open=True,
                 high_open=True)
        positive(self.temperature, dotted(where, "temperature"))  # GRPO samples
        in_range(self.top_p, 0, 1, dotted(where, "top_p"), low_open=True)
        if self.top_k < 0:  # 0 = no cut here (check_tree lets every top_k be -1, the engines' "off")
            fail(dotted(where, "top_k"), f"must be >= 0, got {self.top_k}")
        if isinstance(self.prompts_per_generate, bool) or not isinstance(self.prompts_per_generate, int):
            fail(dotted(where, "prompts_per_generate"), f"expected a whole number >= 0, got {self.prompts_per_generate!r}")


# ---------------------------------------------------------------------------------------------------------------
# Flat sections every trainer has (bases; a dataclass lists the last base's fields first)


@dataclasses.dataclass
class ModelFields(Section):
    model: str = "smollm2-135m"  # base model: a local HF model dir, "smollm2-135m" (embedded) or "hf:<repo id>"
    lora: LoraSection = dataclasses.field(default_factory=LoraSection)
    deepspeed: DeepSpeedSection = dataclasses.field(default_factory=DeepSpeedSection)
    # system turn added to rows whose prompt_messages have none
    system_instruction: str = ""
    # prompt token budget: longer prompts lose the tail of their last user turn (GRPO) or their first tokens (pairs)
    max_prompt_length: int = 256
    # completion token budget: pairs keep their first this many tokens; GRPO rollouts stop here
    max_completion_length: int = 128
    # per-token log-probs from the final hidden states one chunk of this many tokens at a time, each chunk's logits
    # recomputed in backward (train.logprobs.chunked_token_logps), instead of the full (b, T, V) logits (GRPO: of the
    # completion window); 0 = full logits. Values and gradients are the same either way
    logprob_chunk_tokens: int = 1024
    # a peft LoRA adapter directory training starts from instead of a fresh LoRA (paper 003's SFT -> RL: a judge_sft
    # run's train/run/adapter); its r, alpha and target modules must equal `lora`'s. "" = a fresh adapter
    init_adapter: str = ""

    def _check_model(self, where: str) -> None:
        # lora and deepspeed are nested sections: check_tree checks them under their own keys
        if not self.model:
            fail(dotted(where, "model"), "must be non-empty")
        for name in ("max_prompt_length", "max_completion_length"):
            positive(getattr(self, name), dotted(where, name))
        if self.init_adapter:
            self._check_init_adapter(where)

    def _check_init_adapter(self, where: str) -> None:
        """The adapter must exist and have `lora`'s shape: the rollout engine, checkpoints and the vLLM LoRA slot are
        all sized from `lora`, so a silently different adapter would break them later."""
        path = os.path.join(self.init_adapter, "adapter_config.json")
        if not os.path.isfile(path):
            fail(dotted(where, "init_adapter"), f"{self.init_adapter!r} is not a peft adapter directory (no "
                                             "adapter_config.json)")
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        for name, saved_name, ours in (("r", "r", self.lora.r), ("alpha", "lora_alpha", self.lora.alpha)):
            if saved.get(saved_name) != ours:
                fail(dotted(where, f"lora.{name}"), f"{ours} differs from the init_adapter's {saved.get(saved_name)}; "
                                                 "set it to the adapter's")
        if sorted(saved.get("target_modules") or []) != sorted(self.lora.target_modules):
            fail(dotted(where, "lora.target_modules"), f"{self.lora.target_modules} differs from the init_adapter's "
                                                    f"{sorted(saved.get('target_modules') or [])}")


@dataclasses.dataclass
class OptimiserFields:
    """AdamW and the learning-rate schedule (`train.ds_config`)."""

    lr: float = 1e-4  # peak AdamW learning rate (> 0)
    warmup_ratio: float = 0.0  # share [0, 1) of the schedule's steps spent in linear warmup; 0 = none
    # constant | linear | cosine
    scheduler: str = "linear"
    weight_decay: float = 0.0  # AdamW decoupled weight decay; 0 = none
    max_grad_norm: float = 1.0  # gradient-norm clip (DeepSpeed gradient_clipping); 0 = no clipping
    epochs: int = 1  # full passes over the training rows (unless max_steps > 0)
    # optimizer steps of the run: > 0 overrides epochs (cycling the data as needed); 0 = epochs decide
    max_steps: int = 0
    seed: int = 0  # seeds the fresh LoRA init, the row order of each epoch and (GRPO) rollout and reward sampling

    def _check_optimiser(self, where: str) -> None:
        # max_steps, weight_decay, max_grad_norm >= 0: check_tree's floor for every number
        for name in ("lr", "epochs"):
            positive(getattr(self, name), dotted(where, name))
        in_range(self.warmup_ratio, 0, 1, dotted(where, "warmup_ratio"), high_open=True)
        one_of(self.scheduler, SCHEDULERS, dotted(where, "scheduler"))


@dataclasses.dataclass
class WorkerFields:
    """The Ray Train worker group and its numerics."""

    # rows (pairs, rollouts) per forward/backward on one worker
    micro_batch_size: int = 4
    num_workers: int = 1  # Ray Train workers (data-parallel ranks, one DeepSpeed process each)
    use_gpu: bool = False  # one GPU per worker (NCCL); false = CPU workers (gloo); vllm rollouts need true
    cpus_per_worker: int = 1  # Ray CPUs per worker, also its OMP_NUM_THREADS
    # custom Ray resources per training worker on top of its CPUs/GPU, e.g. {gpu_slot: 1}: the workers are placed
    # only on nodes that advertise them (ScalingConfig.resources_per_worker)
    resources_per_worker: dict[str, float] = dataclasses.field(default_factory=dict)
    # auto (bf16 on GPU; bf16-autocast on CPUs with native bf16, else fp32) | fp32 | bf16 | fp16 | bf16-autocast
    # (fp32 weights and optimizer, bf16 matrix products: train.ds_config.PRECISIONS)
    precision: str = "auto"
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, more compute)
    # the GPU model of the workers' nodes ("" = not named): A10G | L4 | A100-40G | A100-80G | H100 | H200
    # (train.memory_budget.GPU_MEMORY_MIB). GRPO refuses a config whose memory budget does not fit it, and with
    # use_gpu the workers are placed only on nodes of that type (ScalingConfig.accelerator_type)
    gpu_type: str = ""
    # extra environment variables for the workers (never secrets: core.config refuses secret-looking names)
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)

    def _check_workers(self, where: str) -> None:
        for name in ("micro_batch_size", "num_workers", "cpus_per_worker"):
            positive(getattr(self, name), dotted(where, name))
        check_custom_resources(self.resources_per_worker, dotted(where, "resources_per_worker"))
        one_of(self.precision, PRECISIONS, dotted(where, "precision"))
        if self.gpu_type:
            one_of(self.gpu_type, tuple(GPU_MEMORY_MIB), dotted(where, "gpu_type"))


@dataclasses.dataclass
class CheckpointFields:
    """Ray Train checkpoints, restarts and the run's storage folder."""

    checkpoint_every: int = 50  # save a Ray Train checkpoint every this many steps (and after the last one)
    keep_checkpoints: int = 2  # newest checkpoints kept on storage (Ray CheckpointConfig.num_to_keep; >= 1)
    # restarts of the worker group from the latest checkpoint after a failure (Ray FailureConfig); 0 = none
    max_failures: int = 0
    # Ray Train storage (checkpoints) of the run, <storage_path>/<run_name>; "" = <run_dir>/ray
    storage_path: str = ""
    run_name: str = "train"  # the run's folder under storage_path (<storage_path>/<run_name>); non-empty
    # evaluate (GRPO: validate, keeping the best adapter) every this many steps; 0 = only after the last step
    eval_every: int = 0

    def _check_checkpoints(self, where: str) -> None:
        for name in ("checkpoint_every", "keep_checkpoints"):
            positive(getattr(self, name), dotted(where, name))
        if not self.run_name:
            fail(dotted(where, "run_name"), "must be non-empty")


@dataclasses.dataclass
class TrackingFields:
    """W&B on rank 0 (`core.tracking.worker_wandb_init`). A job sets all of these from its `wandb` section
    (`core.tracking.trainer_tracking`): the trainer's run joins the job run's group, online when the job's is."""

    wandb: bool = False  # log the trainer's metrics to W&B from rank 0
    wandb_project: str = "quorum"  # W&B project of the trainer's run
    wandb_entity: str = ""  # W&B team or user; "" = the API key's default entity
    # auto (online when the worker has WANDB_API_KEY) | online | offline | disabled; a job passes its resolved mode
    wandb_mode: str = "auto"
    # "" = no group; a job passes its run's name (<job>/<run id>)
    wandb_group: str = ""
    wandb_tags: list[str] = dataclasses.field(default_factory=list)  # W&B tags of the trainer's run

    def _check_tracking(self, where: str) -> None:
        one_of(self.wandb_mode, ("auto", "online", "offline", "disabled"), dotted(where, "wandb_mode"))


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
        one_of(self.loss_config.nll_reduction, ("token_mean", "seq_mean"), dotted(where, "loss_config.nll_reduction"))
        positive(self.loss_config.beta, dotted(where, "loss_config.beta"))


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
    # β of the KL-to-reference term (reference = the base model: LoRA disabled); 0 = no reference forward
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
    # vs_baseline (GRM reward only: one answer per prompt judged against the LoRA-disabled base model's answer in
    # both orders, val/vs_baseline/score = win rate with ties counted half; MENLO §5.2)
    val_metric: str = "reward"

    @property
    def prompts_per_worker(self) -> int:
        return self.prompts_per_step // self.num_workers

    @property
    def optimizer_steps_per_step(self) -> int:
        """`num_iterations` optimizer steps on each GRPO step's rollouts (`train.grpo_loop.policy_update`)."""
        return self.num_iterations

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step and worker (read by `train.loop.build_engine`)."""
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
        if self.rollout.kind == "vllm" and not self.use_gpu:
            fail(dotted(where, "rollout.kind"), "vllm rollouts run on each worker's GPU; set use_gpu: true (or kind: hf)")
        self._check_memory(where)

    def memory_plan(self) -> WorkerPlan | None:
        """The GPU memory budget's inputs (`train.memory_budget.grpo_plan`); None where it cannot be checked."""
        return grpo_plan(self)

    def _check_memory(self, where: str) -> None:
        """Refuse a GPU config whose worker cannot fit the card it names (rollout engine + training)."""
        plan = self.memory_plan()
        found = problems(plan) if plan is not None else []
        if found:
            (key, message), *more = found
            fail(dotted(where, key), message + "".join(f"; and {dotted(where, k)}: {m}" for k, m in more))
