"""The model and DeepSpeed engine of every trainer's Ray Train worker (preference training: `train.preference.loop`; GRPO:
`train.grpo.loop`): the LoRA policy on its frozen base, `deepspeed.initialize`, the output head for chunked
log-probs, and the trainable weights as plain tensors (checkpoints, the vLLM rollout engine's adapter sync).
"""

from __future__ import annotations

import contextlib

import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from train.config import TrainerBase
from train.ds_config import lr_multiplier, trainer_ds_config, warmup_steps


def build_lora_model(model_dir: str, cfg: TrainerBase) -> torch.nn.Module:
    """Load the base model in fp32 and wrap it with a freshly initialised LoRA adapter (seeded by ``cfg.seed``), or
    with ``cfg.init_adapter`` loaded trainable.

    Args:
        model_dir: HF model directory.
        cfg: Run config (``lora`` section, ``seed``, ``gradient_checkpointing``).

    Returns:
        The peft model; only the LoRA parameters require grad.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if cfg.init_adapter:
        # SFT -> RL (paper 003): continue training the given adapter (its shape was checked against `cfg.lora`)
        from peft import PeftModel

        return PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
    lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return get_peft_model(model, lora)


def skip_cpu_shm_allreduce() -> None:
    """Keep DeepSpeed's CPU backend on plain gloo instead of its shared-memory allreduce op.

    DeepSpeed JIT-compiles that op on the first `init_distributed` of every fresh machine (minutes on 2 cores), and a
    build killed half way leaves a lock in ~/.cache/torch_extensions that makes every later run wait forever. Setting
    the module attribute also skips DeepSpeed's probe of every op (compiler subprocesses); the shm op is its only reader.
    """
    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False


def build_engine(model: torch.nn.Module, cfg: TrainerBase, world: int, total_steps: int):
    """`deepspeed.initialize` with torch AdamW over the LoRA parameters and a LambdaLR over `lr_multiplier`."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # in scheduler steps: DeepSpeed steps the scheduler at every optimizer step (GRPO: num_iterations per step)
    length = cfg.schedule_steps(total_steps)
    warmup = warmup_steps(length, cfg.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, length, warmup, cfg.scheduler))
    ds_config = trainer_ds_config(cfg, world)  # the config the memory budget read (train.memory_budget)
    if not cfg.use_gpu:
        skip_cpu_shm_allreduce()
    # Ray Train's TorchConfig already created the process group (gloo on CPU); DeepSpeed adopts it
    deepspeed.init_distributed(dist_backend="nccl" if cfg.use_gpu else "gloo")
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def base_fingerprint(model: torch.nn.Module, gather: bool) -> torch.Tensor:
    """Per frozen parameter (sum, sum of squares) in float64: any change to the base weights shows up here.

    Args:
        model: The peft model (or the engine's module).
        gather: True under ZeRO-3, where parameters are partitioned and must be gathered (a collective).

    Returns:
        Shape: (n_frozen_params, 2).
    """
    frozen = [p for p in model.parameters() if not p.requires_grad]
    gathered = deepspeed.zero.GatheredParameters(frozen) if gather else contextlib.nullcontext()
    with gathered:
        return torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                            for p in frozen])


def output_head(engine, cfg: TrainerBase):
    """The output projection for chunked log-probs. Under ZeRO-3 its weight is gathered once, here, and copied:
    the partitioned module would gather at every chunk, a collective whose count differs between ranks (their
    batches differ in length), and the copy outlives the gather for the chunks recomputed in backward. LoRA
    leaves the head frozen, so no gradient is lost; a trainable head is refused."""
    head = engine.module.get_output_embeddings()
    if not cfg.logprob_chunk_tokens or cfg.deepspeed.zero_stage != 3:
        return head
    params = list(head.parameters())
    if any(p.requires_grad for p in params):
        raise ValueError("logprob_chunk_tokens: under ZeRO-3 the output head must be frozen; set it to 0")
    with deepspeed.zero.GatheredParameters(params):
        weight = head.weight.detach().clone()
        bias = head.bias.detach().clone() if getattr(head, "bias", None) is not None else None
    return lambda hidden: torch.nn.functional.linear(hidden, weight, bias)


def lora_state_dict(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights as full CPU tensors; under ZeRO-3 a collective, so every rank must call it."""
    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    gathered = deepspeed.zero.GatheredParameters([p for _, p in named]) if zero_stage == 3 else contextlib.nullcontext()
    with gathered:
        return {n: p.detach().float().cpu().clone() for n, p in named}
