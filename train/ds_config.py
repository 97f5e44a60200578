"""DeepSpeed engine config and the learning-rate schedule for preference training (pure; no deepspeed import).

    ds_config = build_ds_config(micro_batch_size=4, grad_accum=32, world_size=1, zero_stage=2, precision="bf16")
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_config)

The optimizer (torch AdamW over the LoRA parameters) and the LambdaLR scheduler over `lr_multiplier` are built by
the loop and handed to `deepspeed.initialize`, so the config has no "optimizer"/"scheduler" sections: DeepSpeed's
own Adam needs compiled ops that CPU-only workers may lack, and one schedule function is easier to test.
"""

from __future__ import annotations

import math

ZERO_STAGES = (0, 2, 3)
# bf16-autocast: fp32 weights, gradients and optimizer (DeepSpeed's fp32 path), the forward's matrix products in
# bfloat16 under `torch.autocast` (its backward follows): "auto" on CPUs with native bf16 dot products (AVX512-BF16,
# AMX), 1.45x per training step of SmolLM2 + LoRA on this machine (docs/papers/000-policy-simplification.md, Deviations).
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "bf16-autocast")
SCHEDULERS = ("constant", "linear", "cosine")
# The ZeRO buffers that take GPU memory, written into every config this module builds so that the memory budget
# (train.memory_budget) reads the same numbers DeepSpeed uses (tests/test_ds_config.py parses them with DeepSpeed's
# own DeepSpeedZeroConfig). Elements, not bytes; the values are DeepSpeed's defaults, stated here so they are ours.
ZERO_BUFFERS = {
    # ZeRO-2 and -3: gradients are reduced through a buffer of this many elements (in the weights' dtype, with
    # contiguous_gradients): ZeRO-3 allocates it at initialisation and keeps it, ZeRO-2 for each backward pass
    "reduce_bucket_size": 500_000_000,
    # ZeRO-2: updated partitions are all-gathered in chunks of this many elements where torch lacks
    # all_gather_into_tensor (deepspeed/runtime/utils.py all_gather_dp_groups); with it, straight into the weights
    "allgather_bucket_size": 500_000_000,
    # ZeRO-3: parameters gathered ahead of their use
    "stage3_prefetch_bucket_size": 50_000_000,
    # ZeRO-3: gathered parameters a rank keeps before it releases them, and the reuse distance within which a
    # gathered parameter is not released
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    # ZeRO-3: parameters smaller than this are never partitioned (each rank holds them whole)
    "stage3_param_persistence_threshold": 100_000,
}
STAGE2_KEYS = ("reduce_bucket_size", "allgather_bucket_size")
# ZeRO-2 with overlap_comm double-buffers the reduce bucket (stage_1_and_2.py setup_buckets); off, as DeepSpeed
# leaves it for stage 2, and stated so the budget counts one buffer
STAGE2_OVERLAP_COMM = False
# ZeRO-3's memory_efficient_linear (DeepSpeed's default: on) replaces `torch.nn.functional.linear` for the whole
# process with its own autograd function when `deepspeed.initialize` partitions the model
# (`InsertPostInitMethodToModuleSubClasses._enable_mem_efficient_linear`, never undone). The colocated vLLM rollout
# engine is built afterwards in the same worker process and would run every GEMM through it. Off: torch's own linear;
# what it saves (the activations' copy kept for backward) gradient checkpointing already saves.
ZERO3_MEMORY_EFFICIENT_LINEAR = False


def resolve_precision(precision: str, use_gpu: bool, cpu_bf16: bool = False) -> str:
    """Map "auto" to bf16 on GPU workers, to bf16-autocast on CPU workers whose CPU has native bf16 dot products
    (`cpu_bf16`: AVX512-BF16 or AMX, `actors.engines.hf.weights.cpu_has_native_bf16`) and to fp32 on other CPUs, where bf16
    would be emulated and slower; other values pass through.

    >>> [resolve_precision("auto", use_gpu=False), resolve_precision("auto", False, cpu_bf16=True)]
    ['fp32', 'bf16-autocast']
    >>> resolve_precision("auto", use_gpu=True), resolve_precision("fp32", False, cpu_bf16=True)
    ('bf16', 'fp32')
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {list(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if use_gpu else "bf16-autocast" if cpu_bf16 else "fp32"
    return precision


def build_ds_config(
    micro_batch_size: int,
    grad_accum: int,
    world_size: int,
    zero_stage: int = 2,
    precision: str = "fp32",
    offload_optimizer: bool = False,
    offload_params: bool = False,
    gradient_clipping: float = 1.0,
) -> dict:
    """DeepSpeed JSON config for one run.

    Args:
        micro_batch_size: Pairs per worker per forward (``train_micro_batch_size_per_gpu``).
        grad_accum: Micro-batches per optimizer step and worker.
        world_size: Number of data-parallel workers. Global batch = micro × accum × world.
        zero_stage: 0 (plain data parallel), 2 (optimizer state + gradients sharded) or 3 (+ parameters).
        precision: "fp32", "bf16" or "fp16" (resolve "auto" first with `resolve_precision`).
        offload_optimizer: ZeRO-2/3: keep optimizer state on the host CPU.
        offload_params: ZeRO-3 only: keep parameters on the host CPU.
        gradient_clipping: Max global gradient norm; 0 disables clipping.

    Returns:
        The config dict.

    Raises:
        ValueError: naming the argument that is out of range or inconsistent.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("grad_accum", grad_accum),
                        ("world_size", world_size)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage: {zero_stage} is not one of {list(ZERO_STAGES)}")
    if precision not in ("fp32", "bf16", "fp16", "bf16-autocast"):
        raise ValueError(f"precision: {precision!r} must be fp32, bf16, fp16 or bf16-autocast here (resolve 'auto' "
                         "first)")
    if offload_params and zero_stage != 3:
        raise ValueError("offload_params: parameter offload needs zero_stage 3")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer: optimizer offload needs zero_stage 2 or 3")
    zero: dict = {"stage": zero_stage}
    if zero_stage == 2:
        zero |= {k: ZERO_BUFFERS[k] for k in STAGE2_KEYS} | {"overlap_comm": STAGE2_OVERLAP_COMM}
    elif zero_stage == 3:
        zero |= {k: v for k, v in ZERO_BUFFERS.items() if k != "allgather_bucket_size"}
        zero["memory_efficient_linear"] = ZERO3_MEMORY_EFFICIENT_LINEAR
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload_params:
        zero["offload_param"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch_size * grad_accum * world_size,
        "gradient_clipping": gradient_clipping,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if offload_optimizer:
        # our optimizer is torch AdamW; without this DeepSpeed insists on its compiled DeepSpeedCPUAdam
        config["zero_force_ds_cpu_optimizer"] = False
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def trainer_ds_config(cfg, world_size: int) -> dict:
    """The DeepSpeed config of a trainer config (`train.config.TrainerBase`) over `world_size` workers: what
    `train.engine.build_engine` hands to `deepspeed.initialize` and what the memory budget reads."""
    return build_ds_config(cfg.micro_batch_size, cfg.grad_accum, world_size, cfg.deepspeed.zero_stage,
                           resolve_precision(cfg.precision, cfg.use_gpu), cfg.deepspeed.offload_optimizer,
                           cfg.deepspeed.offload_params, cfg.max_grad_norm)


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """Warm-up length in optimizer steps, rounded up like HF's ``get_warmup_steps``.

    >>> warmup_steps(100, 0.03), warmup_steps(100, 0.0)
    (3, 0)
    """
    return math.ceil(total_steps * warmup_ratio)


def lr_multiplier(step: int, total_steps: int, warmup: int, scheduler: str) -> float:
    """Factor on the peak learning rate at 0-based optimizer step `step` (HF scheduler shapes).

    Linear warm-up from 0 over `warmup` steps, then "constant" (1), "linear" (decay to 0 at `total_steps`) or
    "cosine" (half cosine to 0 at `total_steps`).

    >>> [round(lr_multiplier(s, 10, 2, "linear"), 3) for s in (0, 1, 2, 6, 10)]
    [0.0, 0.5, 1.0, 0.5, 0.0]
    >>> round(lr_multiplier(6, 10, 2, "cosine"), 3), lr_multiplier(9, 10, 2, "constant")
    (0.5, 1.0)
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler: {scheduler!r} is not one of {list(SCHEDULERS)}")
    if step < warmup:
        return step / max(1, warmup)
    if scheduler == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if scheduler == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
