"""Does one GRPO worker fit its GPU? The memory of a colocated worker (rollout engine + DeepSpeed training), from
the model's shape and the config, before any work (pure: no torch, ray, vllm or deepspeed). A preference / SFT
worker (`train_plan`) has the update phase alone.

A worker's GPU goes through two phases every step, and both must fit (all figures GiB, worst case: every sequence
of a micro-batch at `max_prompt_length + max_completion_length`, since one batch can hit it):

- rollout: DeepSpeed's resident state (its shard of the frozen weights, the LoRA weights, gradients and AdamW
  state, ZeRO-3's reduce bucket and unpartitioned small parameters, the CUDA context) stays while the vLLM engine
  holds its `rollout.gpu_memory_utilization` share of the card. vLLM refuses to start when less than that share of
  the card is free (vLLM 0.32 `vllm/v1/worker/utils.py` `request_memory`: `free_memory < ceil(total_memory *
  gpu_memory_utilization)` raises, measured by `cudaMemGetInfo` after `gc.collect()` and `empty_cache()`,
  `gpu_worker.py` `init_device`), a strict comparison of bytes this budget can only estimate: the resident state
  plus the share must leave `VLLM_START_MARGIN_GIB` free. The share must hold the engine's bf16 weights, one LoRA
  slot of the adapter's rank, its activation / CUDA-graph reserve and the KV cache of at least one full sequence
  (vLLM refuses a `max_model_len` its KV cache cannot hold).
- update: the resident state plus what a training micro-batch adds (ZeRO-3's gathered parameters, ZeRO-2's reduce
  bucket, the activations - saved layer inputs and one layer's recomputation under gradient checkpointing, every layer's
  otherwise - the attention mask, and the logits of the completion window, or one chunk of them with
  `logprob_chunk_tokens`, and then under ZeRO-3 the copy of the output head's weight the chunks project with,
  `train.engine.output_head`), while the rollout engine holds only what vLLM's sleep mode leaves on the GPU
  (`train.grpo.rollout_vllm` sleeps it between rollouts: weights and KV cache released), or its whole share without
  sleep mode (`WorkerPlan.sleep_level` 0).

DeepSpeed's part is computed from the ZeRO section of the DeepSpeed config the worker builds (`train.ds_config.
trainer_ds_config`; DeepSpeed 0.19.8 semantics, `deepspeed/runtime/zero/`):

- ZeRO-3 allocates its reduce bucket, `reduce_bucket_size` elements in the gradients' dtype, once at initialisation
  and keeps it (`stage3.py`, `bucket.buffer = torch.empty(self.reduce_bucket_size, ...)` after the optimizer
  states); parameters under `stage3_param_persistence_threshold` elements are never partitioned (each rank holds them
  whole); gathered parameters stay at most `stage3_max_live_parameters` (prefetch stops there:
  `partitioned_param_coordinator.py`, `min(max_n_available_params - n_available_params, prefetch_bucket_sz)`) and are
  kept while reused within `stage3_max_reuse_distance` elements, plus the one parameter being fetched, so the update
  counts the larger of the two plus the largest parameter. `estimate_zero3_model_states_mem_needs` (`stage3.py`)
  counts `4 * largest_layer_params` for the gathered layer, and no bucket: it estimates model states only.
- ZeRO-2 allocates the reduce bucket (twice with `overlap_comm`) at each backward pass and releases it at the end of
  it (`stage_1_and_2.py` `setup_buckets`, `_release_ipg_buffers`): update phase only. Its `allgather_bucket_size`
  takes no memory where torch has `all_gather_into_tensor` (`runtime/utils.py` `all_gather_dp_groups` gathers into
  the weights' own flat buffer; every torch this project pins has it).

The constants are reserves, not measurements of one machine; `python -m bench.gpu_check` prints the peak memory of
a real update step next to `update_step_gib` for the same shape.

    shape = model_shape("hf:Qwen/Qwen3-4B")
    problems(WorkerPlan(shape=shape, gpu_type="A10G", ...))   # [(dotted key, message), ...]; [] = fits
"""

from __future__ import annotations

import dataclasses
import math

from train.model_shape import ModelShape, model_shape

GIB = 1024**3
# total memory as the driver reports it (nvidia-smi MiB); keys are the names Ray gives the accelerators
GPU_MEMORY_MIB = {"A10G": 23028, "L4": 23034, "A100-40G": 40960, "A100-80G": 81920, "H100": 81559, "H200": 143771}
# Ray advertises A100s as "A100" only (ray.util.accelerators: the -40G / -80G labels are never auto-detected)
RAY_ACCELERATOR_TYPE = {"A100-40G": "A100", "A100-80G": "A100"}
# CUDA context, NCCL buffers and allocator fragmentation of the training process
TRAIN_RESERVE_GIB = 1.0
# vLLM besides weights, LoRA slot and KV cache: its profile run's activations, sampler and CUDA graphs
VLLM_RESERVE_GIB = 2.0
# what a sleeping vLLM engine keeps on the GPU (its CUDA graphs and context; weights and KV cache are released)
VLLM_ASLEEP_GIB = 1.0
# the sleep level of the colocated rollout engine (train.grpo.rollout_vllm.SLEEP_LEVEL; a test keeps them equal)
ROLLOUT_SLEEP_LEVEL = 1
# what vLLM's start-up check (free bytes >= ceil(util x total), no tolerance) needs beyond this budget's estimate:
# the allocator segments that still hold live blocks after its empty_cache(), NCCL's and the CUDA runtime's own
# buffers, and memory nvidia-smi reports that cudaMemGetInfo does not (a reserve, not a measurement)
VLLM_START_MARGIN_GIB = 0.5


# vLLM's max_lora_rank choices (actors.engines.vllm_sync.VLLM_LORA_RANK_SLOTS, a module that imports vLLM where it runs;
# a test keeps the two equal)
VLLM_LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(r: int) -> int:
    """The LoRA slot the rollout engine asks vLLM for (`actors.engines.vllm_sync.lora_rank_slot`): the smallest slot that
    holds rank r (the largest slot for a rank vLLM refuses, which the engine reports itself)."""
    return next((slot for slot in VLLM_LORA_RANK_SLOTS if r <= slot), VLLM_LORA_RANK_SLOTS[-1])


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """Everything the budget depends on; one per trainer config (`train.config.TrainerBase.memory_plan`)."""

    shape: ModelShape
    gpu_type: str
    num_workers: int
    # bf16 | fp16 (2-byte weights) or fp32 | bf16-autocast (fp32 weights)
    precision: str
    zero_stage: int
    offload_optimizer: bool
    offload_params: bool
    # LoRA rank and target modules; lora_r 0 = full fine-tuning
    lora_r: int
    lora_targets: list[str] | str
    micro_batch_size: int
    max_prompt_length: int
    max_completion_length: int
    gradient_checkpointing: bool
    # rollouts per worker and step (prompts_per_worker x group_size): HF generate samples them in one batch
    rollouts_per_worker: int
    # vllm | hf | none: a trainer without rollouts (preference / SFT: `train_plan`), whose only phase is the update
    # and whose log-probs cover the whole sequence, not a completion window
    rollout_kind: str
    gpu_memory_utilization: float
    sleep_level: int
    # 0 = the full logits of the completion window
    logprob_chunk_tokens: int
    # the `zero_optimization` section of the DeepSpeed config the worker builds (`train.ds_config.trainer_ds_config`);
    # None = build_ds_config's for zero_stage, precision and offload
    zero_config: dict | None = None
    # full fine-tuning with a KL term: a frozen reference copy of the model, partitioned like the policy
    # (`train.engine.build_reference`)
    reference: bool = False

    def zero(self) -> dict:
        if self.zero_config is not None:
            return self.zero_config
        from train.ds_config import build_ds_config

        return build_ds_config(1, 1, self.num_workers, self.zero_stage, self.precision, self.offload_optimizer,
                               self.offload_params)["zero_optimization"]


@dataclasses.dataclass
class Budget:
    """GiB per part; `rollout_gib` and `update_gib` are the two phases' totals against `gpu_gib`."""

    gpu_gib: float
    parts: dict[str, float]
    vllm_need_gib: float
    rollout_gib: float
    update_gib: float


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def logits_gib(tokens_window: int, vocab: int, act_bytes: int, chunk_tokens: int, micro_batch: int) -> float:
    """Logits memory of one micro-batch's log-probs.

    Full (chunk 0): the (b, W, V) logits and their gradient in the activation dtype, plus the float32 rows that
    `train.logprobs.token_logps` / `token_entropy` work on one at a time (three (W, V) buffers). Chunked: one chunk
    of at most `chunk_tokens` tokens at a time, in the activation dtype, its float32 copy, softmax and gradient.

    >>> round(logits_gib(4097, 151936, 2, 0, 8), 2)   # 18.55 for the logits and their gradient, 6.96 for the rows
    25.51
    >>> round(logits_gib(4097, 151936, 2, 1024, 8), 2)
    2.03
    """
    if chunk_tokens:
        return _gib(min(chunk_tokens, micro_batch * tokens_window) * vocab * (act_bytes + 12))
    return _gib(micro_batch * tokens_window * vocab * 2 * act_bytes + 3 * tokens_window * vocab * 4)


def budget(plan: WorkerPlan) -> Budget:
    """The memory of both phases (see the module docstring)."""
    shape, world = plan.shape, plan.num_workers
    gpu = GPU_MEMORY_MIB[plan.gpu_type] / 1024
    weight_bytes = 2 if plan.precision in ("bf16", "fp16") else 4
    act_bytes = 2 if plan.precision != "fp32" else 4
    trainable = shape.lora_params(plan.lora_r, plan.lora_targets) if plan.lora_r else shape.n_params
    frozen = shape.n_params - trainable if not plan.lora_r else shape.n_params
    # AdamW: m and v in fp32, plus an fp32 master copy when the weights are 2-byte (DeepSpeed's bf16/fp16 paths)
    optimizer_bytes = 8 + (4 if weight_bytes == 2 else 0)
    zero = plan.zero()
    zero3, sharded = zero["stage"] == 3, zero["stage"] >= 2
    lora_persistent = shape.persistent_params(zero.get("stage3_param_persistence_threshold", 0), plan.lora_r,
                                              plan.lora_targets) if zero3 else 0
    parts = {
        "frozen_weights": 0.0 if plan.offload_params else _gib(frozen * weight_bytes) / (world if zero3 else 1),
        "trainable_weights": 0.0 if plan.offload_params else _gib(trainable * weight_bytes) / (world if zero3 else 1),
        "gradients": _gib(trainable * weight_bytes) / (world if sharded else 1),
        "optimizer": 0.0 if plan.offload_optimizer else _gib(trainable * optimizer_bytes) / (
            world if zero["stage"] else 1),
        "train_reserve": TRAIN_RESERVE_GIB,
        # ZeRO-3: the reduce bucket, allocated at initialisation and kept; the small parameters no rank partitions
        "zero3_reduce_bucket": _gib(zero["reduce_bucket_size"] * weight_bytes) if zero3 else 0.0,
        "zero3_persistent": _gib(lora_persistent * weight_bytes) * (1 - 1 / world)
        if zero3 and not plan.offload_params else 0.0,
        **_full_finetune_resident(plan, weight_bytes, zero3),
    }
    resident = sum(parts.values())
    seq = plan.max_prompt_length + plan.max_completion_length
    tokens = plan.micro_batch_size * seq
    per_layer = shape.layer_activation_elements() * act_bytes
    if plan.gradient_checkpointing:
        activations = tokens * (shape.layers * shape.hidden * act_bytes + 2 * per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    total_params = shape.n_params + (shape.lora_params(plan.lora_r, plan.lora_targets) if plan.lora_r else 0)
    live = max(zero.get("stage3_max_live_parameters", 0), zero.get("stage3_max_reuse_distance", 0))
    update = {
        # ZeRO-3: gathered parameters up to the live / reuse limit, plus the one being fetched
        "zero3_gathered": _gib(min(total_params, live + shape.largest_param()) * weight_bytes) if zero3 else 0.0,
        # ZeRO-2: the reduce bucket(s) of the backward pass, in the gradients' (the weights') dtype
        "zero2_reduce_bucket": _gib(zero["reduce_bucket_size"] * weight_bytes * (2 if zero.get("overlap_comm") else 1))
        if zero["stage"] == 2 else 0.0,
        "activations": _gib(activations),
        # HF builds a (b, 1, T, T) mask in the activation dtype for padded batches (SDPA)
        "attention_mask": _gib(plan.micro_batch_size * seq * seq * act_bytes),
        "logits": logits_gib(seq if plan.rollout_kind == "none" else plan.max_completion_length + 1, shape.vocab,
                             act_bytes, plan.logprob_chunk_tokens, plan.micro_batch_size),
        # ZeRO-3 with chunked log-probs: the output head's weight, gathered once and copied for the whole update
        # (`train.engine.output_head`), beside ZeRO's own gathered parameters; a trainable head (full fine-tuning,
        # `train.logprobs.GatheredChunkedLogps`) is gathered in forward and backward, with its full gradient
        "zero3_head_copy": _gib(shape.vocab * shape.hidden * weight_bytes) * (1 if plan.lora_r else 2)
        if zero3 and plan.logprob_chunk_tokens else 0.0,
    }
    vllm = plan.rollout_kind == "vllm"
    vllm_parts = {
        "vllm_weights": _gib(shape.n_params * 2),
        "vllm_lora_slot": _gib(shape.lora_params(lora_rank_slot(plan.lora_r), plan.lora_targets) * 2)
        if plan.lora_r else 0.0,
        "vllm_kv_one_sequence": _gib(seq * shape.kv_bytes_per_token(2)),
        "vllm_reserve": VLLM_RESERVE_GIB,
    } if vllm else {}
    share = plan.gpu_memory_utilization * gpu if vllm else 0.0
    held = (VLLM_ASLEEP_GIB if plan.sleep_level else share) if vllm else 0.0
    if vllm:  # full fine-tuning's weight sync gathers one parameter at a time while the engine's weights are awake
        rollout = resident + share + (_gib(shape.largest_param() * weight_bytes) if not plan.lora_r and zero3 else 0.0)
    elif plan.rollout_kind == "none":  # no rollout phase: between updates DeepSpeed holds its resident state only
        rollout = resident
    else:  # HF generate on the training model: ZeRO-3 gathers, plus the KV cache of every rollout at once
        rollout = resident + update["zero3_gathered"] + _gib(
            plan.rollouts_per_worker * seq * shape.kv_bytes_per_token(act_bytes))
    parts |= update | vllm_parts | ({"vllm_during_update": held} if vllm else {})
    return Budget(gpu_gib=gpu, parts=parts, vllm_need_gib=sum(vllm_parts.values()), rollout_gib=rollout,
                  update_gib=resident + sum(update.values()) + held)


def checkpoint_gib(shape: ModelShape, precision: str) -> float:
    """One full-fine-tuning checkpoint (DeepSpeed's, all ranks together): the weights in their dtype, the fp32 master
    copy where they are 2-byte, and AdamW's two fp32 moments. Qwen3-4B at bf16: 14 bytes a parameter, 52.4 GiB.

    >>> round(checkpoint_gib(model_shape("hf:Qwen/Qwen3-4B"), "bf16"), 1)
    52.4
    """
    weight_bytes = 2 if precision in ("bf16", "fp16") else 4
    return _gib(shape.n_params * (weight_bytes + (4 if weight_bytes == 2 else 0) + 8))


def _full_finetune_resident(plan: WorkerPlan, weight_bytes: int, zero3: bool) -> dict[str, float]:
    """Full fine-tuning's resident part beyond the policy's own state: the frozen reference copy of a KL term, in
    the weights' dtype, partitioned like the policy under ZeRO-3 (offloaded with its parameters)."""
    if not plan.reference or plan.offload_params:
        return {}
    return {"reference_weights": _gib(plan.shape.n_params * weight_bytes) / (plan.num_workers if zero3 else 1)}


RESIDENT_PARTS = ["frozen_weights", "trainable_weights", "gradients", "optimizer", "train_reserve",
                  "zero3_reduce_bucket", "zero3_persistent", "reference_weights"]


def _fmt(parts: dict[str, float], names: list[str]) -> str:
    return ", ".join(f"{n} {parts[n]:.2f}" for n in names if parts.get(n))


def problems(plan: WorkerPlan) -> list[tuple[str, str]]:
    """(dotted key relative to the trainer section, message) for each phase that cannot fit; [] when both fit."""
    b = budget(plan)
    gpu, found = b.gpu_gib, []
    where = f"{plan.gpu_type} ({gpu:.1f} GiB)"
    if plan.rollout_kind == "vllm":
        share = plan.gpu_memory_utilization * gpu
        if share < b.vllm_need_gib:
            low = math.ceil(b.vllm_need_gib / gpu * 100) / 100
            found.append(("rollout.gpu_memory_utilization", (
                f"{plan.gpu_memory_utilization} of {where} is {share:.1f} GiB, less than the rollout engine needs: "
                f"{b.vllm_need_gib:.1f} GiB ({_fmt(b.parts, ['vllm_weights', 'vllm_lora_slot', 'vllm_kv_one_sequence', 'vllm_reserve'])}); "
                f"raise it to at least {low:.2f}, name a bigger gpu_type, or train a smaller model")))
    vllm = plan.rollout_kind == "vllm"
    margin = VLLM_START_MARGIN_GIB if vllm else 0.0
    if plan.rollout_kind != "none" and b.rollout_gib + margin > gpu:
        resident = b.rollout_gib - plan.gpu_memory_utilization * gpu
        high = math.floor((gpu - margin - resident) / gpu * 100) / 100
        key = "rollout.gpu_memory_utilization" if vllm else "micro_batch_size"
        start = (f"; vLLM starts only when {plan.gpu_memory_utilization} of the card is free, and the two must leave "
                 f"{margin:.2f} GiB for what that check counts beyond this estimate (have {gpu - b.rollout_gib:.2f})"
                 if vllm else "")
        found.append((key, (
            f"the rollout phase needs {b.rollout_gib:.2f} GiB of {where}: DeepSpeed keeps {resident:.2f} GiB ("
            f"{_fmt(b.parts, RESIDENT_PARTS)}) resident while the rollout engine "
            + (f"holds its {plan.gpu_memory_utilization * gpu:.2f} GiB share{start}; "
               f"lower rollout.gpu_memory_utilization to at most {high:.2f}, " if vllm
               else "runs; lower prompts_per_step or group_size, ")
            + "shard with deepspeed.zero_stage 3 or offload, or name a bigger gpu_type")))
    if b.update_gib > gpu:
        if not plan.logprob_chunk_tokens and b.parts["logits"] > b.parts["activations"]:
            key = "logprob_chunk_tokens"
        else:
            key = "micro_batch_size"
        found.append((key, (
            f"a training micro-batch needs {b.update_gib:.1f} GiB of {where} "
            f"({_fmt(b.parts, [*RESIDENT_PARTS, 'zero3_gathered', 'zero3_head_copy', 'zero2_reduce_bucket', 'activations', 'attention_mask', 'logits', 'vllm_during_update'])}) "
            f"at {plan.micro_batch_size} x {plan.max_prompt_length + plan.max_completion_length} tokens; lower "
            "micro_batch_size, chunk the log-probs (logprob_chunk_tokens), set gradient_checkpointing: true, "
            "deepspeed.zero_stage: 3 or offload, or name a bigger gpu_type")))
    return found


def update_step_gib(plan: WorkerPlan) -> float:
    """The update phase's total without the rollout engine (what a training-only step peaks at)."""
    b = budget(plan)
    return b.update_gib - b.parts.get("vllm_during_update", 0.0)


def grpo_plan(cfg) -> WorkerPlan | None:
    """The plan of a `train.config.GRPOConfig`; None off-GPU, without a `gpu_type`, or for a model whose shape
    neither a local config.json nor `train.model_shape.KNOWN_MODELS` gives."""
    return _plan(cfg, reference=cfg.finetune == "full" and cfg.kl_coef > 0, micro_batch_size=cfg.micro_batch_size,
                 rollouts_per_worker=cfg.prompts_per_worker * cfg.group_size, rollout_kind=cfg.rollout.kind,
                 gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, sleep_level=ROLLOUT_SLEEP_LEVEL)


def train_plan(cfg) -> WorkerPlan | None:
    """The plan of a preference / SFT trainer (`train.config.TrainConfig`): the update phase only (no rollout
    engine). A row is one sequence of `max_prompt_length + max_completion_length` tokens (SFT) or two (a preference
    pair: chosen and rejected go through one forward, `train.preference.loop.loss_on_batch`), its log-probs over the
    whole sequence; DPO under full fine-tuning adds the frozen reference copy. None as `grpo_plan`."""
    return _plan(cfg, reference=cfg.finetune == "full" and cfg.loss == "dpo",
                 micro_batch_size=cfg.micro_batch_size * (1 if cfg.loss == "sft" else 2), rollouts_per_worker=0,
                 rollout_kind="none", gpu_memory_utilization=0.0, sleep_level=0)


def _plan(cfg, **own) -> WorkerPlan | None:
    from train.ds_config import trainer_ds_config

    shape = model_shape(cfg.model) if cfg.use_gpu and cfg.gpu_type else None
    if shape is None:
        return None
    return WorkerPlan(
        shape=shape, gpu_type=cfg.gpu_type, num_workers=cfg.num_workers,
        precision="bf16" if cfg.precision == "auto" else cfg.precision, zero_stage=cfg.deepspeed.zero_stage,
        offload_optimizer=cfg.deepspeed.offload_optimizer, offload_params=cfg.deepspeed.offload_params,
        lora_r=0 if cfg.finetune == "full" else cfg.lora.r, lora_targets=cfg.lora.target_modules,
        max_prompt_length=cfg.max_prompt_length, max_completion_length=cfg.max_completion_length,
        gradient_checkpointing=cfg.gradient_checkpointing, logprob_chunk_tokens=cfg.logprob_chunk_tokens,
        zero_config=trainer_ds_config(cfg, cfg.num_workers)["zero_optimization"], **own)
