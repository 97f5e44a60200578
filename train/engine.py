"""The model and DeepSpeed engine of every trainer's Ray Train worker (preference training: `train.preference.loop`; GRPO:
`train.grpo.loop`): the policy (`finetune: lora`, a LoRA adapter on its frozen base, or `finetune: full`, every
parameter), `deepspeed.initialize`, the frozen reference copy full fine-tuning needs for a KL or DPO term, the output
head for chunked log-probs, and the trainable weights as plain tensors (checkpoints, the vLLM rollout engine's sync).
"""

from __future__ import annotations

import contextlib

import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from train import collectives
from train.config import TrainerBase
from train.ds_config import lr_multiplier, trainer_ds_config, warmup_steps


def build_model(model_dir: str, cfg: TrainerBase) -> torch.nn.Module:
    """The policy `cfg.finetune` trains: `build_lora_model`, or (full) the whole model in fp32, every parameter
    trainable (DeepSpeed casts it to the run's precision and keeps fp32 master weights in its optimizer)."""
    if cfg.finetune == "lora":
        return build_lora_model(model_dir, cfg)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if cfg.gradient_checkpointing:
        # the embeddings train too, so the checkpointed layers' inputs require grad without a hook
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class ReferenceModel:
    """A frozen model held whole on this rank (the reference of full fine-tuning under ZeRO-0/2, whose policy
    weights are whole on every rank too): what `train.grpo.micro.policy_logps` and the preference loop call as an
    engine (a forward, `.module`, `.device`)."""

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.module, self.device = module.to(device), device

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True):  # the reference stays in eval mode (no dropout)
        return self


def build_reference(model_dir: str, cfg: TrainerBase, world: int, device: torch.device):
    """The frozen reference policy of full fine-tuning (the initial model), or None where none is needed.

    With LoRA the reference is the policy with its adapter disabled (no copy); `finetune: full` needs a copy, built
    only when a term reads it (GRPO `kl_coef` > 0, the DPO loss). Under ZeRO-3 the copy is partitioned like the
    policy: `deepspeed.initialize` without an optimizer (ZeRO-3 inference, the reference model of OpenRLHF and
    verl), with the policy's precision and parameter offload; otherwise each rank holds it whole in the policy's
    dtype, as ZeRO-0/2 hold the policy's weights.
    """
    needs = getattr(cfg, "kl_coef", 0.0) > 0 or getattr(cfg, "loss", "") == "dpo"
    if cfg.finetune != "full" or not needs:
        return None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.requires_grad_(False)
    model.eval()
    ds = trainer_ds_config(cfg, world)
    if cfg.deepspeed.zero_stage == 3:
        config = {k: v for k, v in ds.items() if k in ("train_micro_batch_size_per_gpu", "bf16", "fp16")}
        zero = {k: v for k, v in ds["zero_optimization"].items() if k != "offload_optimizer"}
        config |= {"train_batch_size": ds["train_micro_batch_size_per_gpu"] * world, "gradient_accumulation_steps": 1,
                   "zero_optimization": zero, "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()
        return engine
    dtype = torch.bfloat16 if "bf16" in ds else torch.float16 if "fp16" in ds else torch.float32
    return ReferenceModel(model.to(dtype), device)


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
    adopt_collective_timeout(cfg.collective_timeout_s)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    require_torch_linear()
    return engine


def adopt_collective_timeout(timeout_s: float) -> None:
    """Give DeepSpeed's data-parallel group the run's collective timeout (`collective_timeout_s`, which Ray Train's
    TorchConfig gave the world group).

    Without an `mpu`, DeepSpeed reduces gradients and gathers ZeRO partitions over a clone of the world group that
    it creates on first use with a bare `new_group` (`deepspeed.utils.groups._clone_world_group`), which takes the
    backend's default timeout: NCCL's 10 minutes, not the configured one, so a rank that waits longer for its
    rewards than that would fail the step although the reward wait was checked against `collective_timeout_s`.
    The clone is made here first, under the configured timeout, and DeepSpeed then uses it (it only creates one
    when none exists). Private attribute of the pinned DeepSpeed; tests/test_engine_process.py reads the timeout
    DeepSpeed's engine ends up with."""
    from deepspeed.utils import groups

    if groups._WORLD_GROUP is None:
        groups._WORLD_GROUP = collectives.world_clone(timeout_s)


def require_torch_linear() -> None:
    """Refuse a process whose `torch.nn.functional.linear` is no longer torch's own: ZeRO-3's
    memory_efficient_linear replaces it process-wide and for good (`train.ds_config.ZERO3_MEMORY_EFFICIENT_LINEAR`
    says why it is off), and the colocated vLLM engine built next in this process would run every GEMM through it."""
    if torch.nn.functional.linear is not torch._C._nn.linear:
        raise RuntimeError(f"torch.nn.functional.linear is {torch.nn.functional.linear!r}, not torch's own: "
                           "DeepSpeed's ZeRO-3 memory_efficient_linear replaced it for this whole process "
                           "(train/ds_config.py keeps it off)")


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
                            for p in frozen]) if frozen else torch.zeros(0, 2, dtype=torch.float64)


class GatheringHead:
    """The partitioned output head of ZeRO-3 when it trains (full fine-tuning; in most models it is the tied input
    embedding), for chunked log-probs. A gathered copy would take no gradient, and calling the partitioned module
    per chunk would make one collective per chunk, a count that differs between ranks (their batches differ in
    length). So the weight is gathered once for the projection's forward and once for its backward, and the
    parameter itself enters autograd (`train.logprobs.GatheredChunkedLogps`): its gradient reaches ZeRO-3's
    reduce-scatter as the model's own projection's does, once the tied parameter's gradient is complete."""

    def __init__(self, module: torch.nn.Module):
        if getattr(module, "bias", None) is not None:
            raise ValueError("logprob_chunk_tokens: a trainable output head with a bias is not supported under "
                             "ZeRO-3; set logprob_chunk_tokens: 0")
        self.module = module

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.module(hidden)

    def parameters(self):
        return self.module.parameters()

    def chunked_logps(self, hidden: torch.Tensor, labels: torch.Tensor, chunk_tokens: int, with_entropy: bool):
        from train.logprobs import GatheredChunkedLogps

        weight = self.module.weight

        def gather():
            return deepspeed.zero.GatheredParameters([weight])

        with gather():
            logps, entropy = GatheredChunkedLogps.apply(hidden, weight, labels, chunk_tokens, with_entropy, gather)
        return logps, entropy if with_entropy else None


def output_head(engine, cfg: TrainerBase):
    """The output projection for chunked log-probs. Under ZeRO-3 a frozen head's weight is gathered once, here, and
    copied: the partitioned module would gather at every chunk, a collective whose count differs between ranks
    (their batches differ in length), and the copy outlives the gather for the chunks recomputed in backward. A
    trainable head (full fine-tuning) must receive its gradient: `GatheringHead`."""
    head = engine.module.get_output_embeddings()
    if not cfg.logprob_chunk_tokens or cfg.deepspeed.zero_stage != 3:
        return head
    params = list(head.parameters())
    if any(p.requires_grad for p in params):
        return GatheringHead(head)
    with deepspeed.zero.GatheredParameters(params):
        weight = head.weight.detach().clone()
        bias = head.bias.detach().clone() if getattr(head, "bias", None) is not None else None
    return lambda hidden: torch.nn.functional.linear(hidden, weight, bias)


def full_state_dict(engine, zero_stage: int, rank: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Every weight of the model as CPU tensors of `dtype` on rank 0 ({} elsewhere). Under ZeRO-3 a collective: each
    parameter is gathered alone (`GatheredParameters` on every rank), so no rank ever holds more than one gathered
    parameter beyond its shard. Tied weights appear once (`named_parameters` yields a shared parameter once)."""
    out = {}
    for name, param in engine.module.named_parameters():
        gathered = deepspeed.zero.GatheredParameters([param]) if zero_stage == 3 else contextlib.nullcontext()
        with gathered:
            if rank == 0:
                out[name] = param.detach().to("cpu", dtype).clone()
    return out


def export_model(engine, zero_stage: int, rank: int, target: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """The 16-bit Hugging Face export of full fine-tuning (`save_pretrained` with the tokenizer and a config naming
    `dtype`): what `quorum serve`, `judge_eval` and `quorum eval` load as an engine's `model`. Every rank calls it
    (ZeRO-3 gathers); rank 0 writes."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    state = full_state_dict(engine, zero_stage, rank, dtype)
    if rank != 0:
        return
    engine.module.save_pretrained(target, state_dict=state)
    AutoTokenizer.from_pretrained(engine.module.name_or_path).save_pretrained(target)
    config = Path(target) / "config.json"
    saved = json.loads(config.read_text())
    name = str(dtype).removeprefix("torch.")
    saved |= {key: name for key in ("dtype", "torch_dtype") if key in saved} or {"dtype": name}
    config.write_text(json.dumps(saved, indent=2) + "\n")


def lora_state_dict(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights as full CPU tensors; under ZeRO-3 a collective, so every rank must call it."""
    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    gathered = deepspeed.zero.GatheredParameters([p for _, p in named]) if zero_stage == 3 else contextlib.nullcontext()
    with gathered:
        return {n: p.detach().float().cpu().clone() for n, p in named}
