"""The Ray Train worker function of preference training: LoRA model -> DeepSpeed engine -> steps -> reports.

`train/trainer.py::run_training` builds the `TorchTrainer`; every worker runs `train_loop_per_worker(config)`,
whose only input is `config` (keys: ``train`` = `dataclasses.asdict(TrainConfig)`, ``model_dir``, ``train_rows``,
``eval_rows``, ``total_steps``, ``wandb_dir``). The maths lives elsewhere and is only called here: tokenization and
the batch plan in `train/pairs_data.py`, log-probs in `train/logprobs.py`, losses in `train/losses.py` (called through
`train/preference_loss.py`), the DeepSpeed config and LR schedule in `train/ds_config.py`.

Per optimizer step, rank r runs `grad_accum` micro-batches given by `pairs_data.step_row_indices` (a function of the
step number only), one concatenated forward of chosen + rejected rows each; DPO adds a no-grad forward with the LoRA
adapter disabled as its reference model (no second model copy). A checkpoint (Ray Train merges the workers'
directories into one) holds:
    deepspeed/step_<k>/...   DeepSpeed `save_checkpoint` per rank: LoRA weights, optimizer, LR scheduler (frozen
                             base weights excluded; they are reloaded from `model_dir`)
    rng/rank<r>.pt           each rank's torch RNG state (LoRA dropout), so a resumed run replays the same masks
    adapter/                 rank 0's peft `save_pretrained` of the LoRA adapter
    train_state.json         step and total steps
On start a worker restores all of that from `ray.train.get_checkpoint()` and continues at the saved step, so a run
that failed and resumed ends at the same step, on the same batches, as one that did not.

One loop serves all six losses rather than TRL's `trl.experimental.cpo.CPOTrainer` for cpo/simpo/cpo_simpo: ARPO and
DPO need `compute_preference_loss` anyway, and a single loop keeps batching, checkpoints and resume identical for all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path

import deepspeed
import ray.train
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.tracking import start_worker_run
from train.config import TrainConfig
from train.ds_config import build_ds_config, lr_multiplier, resolve_precision, warmup_steps
from train.grpo_micro import final_hidden
from train.logprobs import chunked_token_logps, sequence_logps
from train.pairs_data import collate_pairs, collate_targets, encode_pair, encode_target, step_row_indices
from train.precision import autocast, worker_precision
from train.preference_loss import compute_preference_loss

Metrics = dict[str, float]


def train_loop_per_worker(config: dict) -> None:
    """Train on this worker's share of the rows and report metrics and checkpoints to Ray Train.

    Args:
        config: See the module docstring; nothing else (no module globals) is read.
    """
    if config.get("secrets") is not None:
        config["secrets"].install()  # the W&B key when the job's run is online (actors.secrets), before wandb.init
    cfg = TrainConfig.from_dict(config["train"])
    cfg.precision = worker_precision(cfg.precision, cfg.use_gpu)
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    total, rows = config["total_steps"], config["train_rows"]
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    engine = build_engine(build_lora_model(config["model_dir"], cfg), cfg, world, total)
    zero3 = cfg.deepspeed.zero_stage == 3
    fingerprint = base_fingerprint(engine.module, gather=zero3)  # after DeepSpeed's dtype cast, if any
    start = restore_checkpoint(engine, rank)
    tracker = _init_wandb(cfg, config, rank)
    sums, tokens, clock = {}, 0, time.perf_counter()
    for step in range(start, total):
        step_sums, step_tokens = train_step(engine, tokenizer, cfg, rows, step, rank, world)
        sums, tokens, done = _add(sums, step_sums), tokens + step_tokens, step + 1
        save = done % cfg.checkpoint_every == 0 or done == total
        if not (save or done % cfg.log_every == 0):
            continue
        metrics = _reduce_means(sums) | _throughput(tokens, clock, world) | _local_phase_means(sums) | _peak_memory(
            engine) | {"step": done, "start_step": start}
        if config["eval_rows"] and (done == total or (cfg.eval_every and done % cfg.eval_every == 0)):
            metrics |= evaluate(engine, tokenizer, cfg, config["eval_rows"], rank, world)
        if done == total:
            metrics["base_drift"] = float((base_fingerprint(engine.module, gather=zero3) - fingerprint).abs().max())
            if world > 1:
                metrics["time/allreduce_s"] = allreduce_seconds(engine)
        _report(engine, cfg, metrics, done, total, rank, save, tracker)
        sums, tokens, clock = {}, 0, time.perf_counter()
        if cfg.fail_at_step and done == cfg.fail_at_step and start == 0 and rank == world - 1:
            raise RuntimeError(f"fail_at_step={done}: injected worker failure (test hook)")
    if tracker is not None:
        tracker.finish()


# ---------------------------------------------------------------------------------------------------------------
# Model and engine


def build_lora_model(model_dir: str, cfg: TrainConfig) -> torch.nn.Module:
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


def build_engine(model: torch.nn.Module, cfg: TrainConfig, world: int, total_steps: int):
    """`deepspeed.initialize` with torch AdamW over the LoRA parameters and a LambdaLR over `lr_multiplier`."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # in scheduler steps: DeepSpeed steps the scheduler at every optimizer step (GRPO: num_iterations per step)
    length = cfg.schedule_steps(total_steps)
    warmup = warmup_steps(length, cfg.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, length, warmup, cfg.scheduler))
    ds_config = build_ds_config(
        cfg.micro_batch_size, cfg.grad_accum, world, cfg.deepspeed.zero_stage,
        resolve_precision(cfg.precision, cfg.use_gpu), cfg.deepspeed.offload_optimizer,
        cfg.deepspeed.offload_params, cfg.max_grad_norm)
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


# ---------------------------------------------------------------------------------------------------------------
# One step


def _collate(tokenizer, cfg: TrainConfig, rows: list[dict], device) -> dict[str, torch.Tensor]:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    limits = (cfg.max_prompt_length, cfg.max_completion_length, cfg.system_instruction)
    if cfg.loss == "sft":
        batch = collate_targets([encode_target(tokenizer, r, *limits) for r in rows], pad_id, cfg.padding_side)
    else:
        batch = collate_pairs([encode_pair(tokenizer, r, *limits) for r in rows], pad_id, cfg.padding_side)
    return {k: v.to(device) for k, v in batch.items()}


def output_head(engine, cfg: TrainConfig):
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


def _logps(engine, batch: dict[str, torch.Tensor], cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs (float32 whatever the logits) and token counts; chunked as `train.grpo_micro`."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")} | {"use_cache": False}
    with autocast(cfg.precision, engine.device):
        if not cfg.logprob_chunk_tokens:
            return sequence_logps(engine(**inputs).logits, batch["input_ids"], batch["loss_mask"])
        hidden = final_hidden(engine, inputs, grad=torch.is_grad_enabled())[:, :-1]
        mask = batch["loss_mask"][:, 1:].bool()
        per_token, _ = chunked_token_logps(hidden, output_head(engine, cfg),
                                           batch["input_ids"][:, 1:].masked_fill(~mask, 0), cfg.logprob_chunk_tokens)
    return (per_token * mask).sum(-1), mask.sum(-1)


def loss_on_batch(engine, cfg: TrainConfig, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Concatenated forward (chosen rows, then rejected rows), then `compute_preference_loss`.

    Returns:
        The scalar loss and the loss's metric dict plus ``logps/chosen`` and ``logps/rejected`` (summed log-probs).
    """
    logps, n_tokens = _logps(engine, batch, cfg)
    if cfg.loss == "sft":
        return compute_preference_loss("sft", {"chosen_logps": logps, "chosen_n_tokens": n_tokens}, cfg.loss_config)
    b = logps.shape[0] // 2
    stats = {"chosen_logps": logps[:b], "chosen_n_tokens": n_tokens[:b],
             "rejected_logps": logps[b:], "rejected_n_tokens": n_tokens[b:]}
    if cfg.loss == "dpo":
        with torch.no_grad(), engine.module.disable_adapter():
            ref, _ = _logps(engine, batch, cfg)
        stats["ref_chosen_logps"], stats["ref_rejected_logps"] = ref[:b], ref[b:]
    loss, metrics = compute_preference_loss(cfg.loss, stats, cfg.loss_config)
    metrics["logps/chosen"], metrics["logps/rejected"] = logps[:b].detach().mean(), logps[b:].detach().mean()
    return loss, metrics


def train_step(engine, tokenizer, cfg: TrainConfig, rows: list[dict], step: int, rank: int, world: int):
    """One optimizer step: `grad_accum` micro-batches through the engine (it scales the loss and steps on the
    accumulation boundary).

    Returns:
        Sums of the micro-batch metrics divided by `grad_accum` (so the step's means, keys as `loss_on_batch` plus
        ``lr``, ``grad_norm`` (pre-clipping) and a ``count`` of 1), and the number of non-padding tokens processed.
    """
    plan = step_row_indices(step, len(rows), cfg.micro_batch_size, cfg.grad_accum, world, rank, cfg.seed)
    sums, tokens, unclipped_norm = {"lr": engine.get_lr()[0], "count": 1.0}, 0, None
    # where the step's wall time goes (seconds per step, summed over micro-batches): forward + loss; backward,
    # which under ZeRO-2 also reduces the gradients (DeepSpeed's hooks fire inside it); the optimizer step, which
    # under ZeRO-2 also all-gathers the updated partitions. Collation and tokenization are the rest.
    phases = dict.fromkeys(("time/forward_s", "time/backward_s", "time/optimizer_s"), 0.0)
    for micro, indices in enumerate(plan):
        batch = _collate(tokenizer, cfg, [rows[i] for i in indices], engine.device)
        started = time.perf_counter()
        loss, metrics = loss_on_batch(engine, cfg, batch)
        forward_done = time.perf_counter()
        engine.backward(loss)
        backward_done = time.perf_counter()
        if micro == len(plan) - 1 and cfg.deepspeed.zero_stage == 0:
            unclipped_norm = _full_grad_norm(engine)
        step_started = time.perf_counter()
        engine.step()
        phases["time/forward_s"] += forward_done - started
        phases["time/backward_s"] += backward_done - forward_done
        phases["time/optimizer_s"] += time.perf_counter() - step_started
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value) / cfg.grad_accum
        tokens += int(batch["attention_mask"].sum())
    sums |= phases
    norm = engine.get_global_grad_norm()
    sums["grad_norm"] = float(norm) if norm is not None else (unclipped_norm or math.nan)
    return sums, tokens


def allreduce_seconds(engine, repeats: int = 5) -> float:
    """Median wall time of one all-reduce of a float32 tensor the size of the trainable (LoRA) parameters on the
    job's process group: what one step's gradient exchange costs on this interconnect (ZeRO-2's reduce-scatter +
    all-gather move the same volume as one all-reduce). Measured apart from the step, since DeepSpeed issues the
    step's collectives from inside backward and step, where they cannot be timed without instrumenting it."""
    numel = sum(p.numel() for p in engine.module.parameters() if p.requires_grad)
    tensor = torch.zeros(numel, dtype=torch.float32, device=engine.device)
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - started)
    return float(sorted(times)[len(times) // 2])


def _full_grad_norm(engine) -> float | None:
    """Pre-clipping global grad norm under ZeRO-0, where DeepSpeed's fp32 path does not record it; the gradients
    are complete (already averaged over workers) between the boundary backward and the step."""
    grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else None


# ---------------------------------------------------------------------------------------------------------------
# Metrics, evaluation, checkpoints


def _add(total: dict, new: dict) -> dict:
    return {k: total.get(k, 0.0) + new.get(k, 0.0) for k in total.keys() | new.keys()}


def _all_reduce(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _local_phase_means(sums: dict[str, float]) -> Metrics:
    """This rank's own `time/*` means per step, not averaged over workers: the throughput clock is this rank's too,
    and ranks drift apart between steps (rank 0 also writes the adapter at a checkpoint), so a rank that runs ahead
    waits for the others inside its backward; averaged, the phases of two clocks could add up to more than a step."""
    return {k: v / sums["count"] for k, v in sums.items() if k.startswith("time/")}


def _reduce_means(sums: dict[str, float]) -> Metrics:
    """Mean over the steps since the last report and over workers (every rank holds the same keys), phase timings
    excepted (see `_local_phase_means`)."""
    keys = sorted(k for k in sums if k != "count" and not k.startswith("time/"))
    totals = _all_reduce([sums[k] for k in keys] + [sums["count"]])
    return {k: v / totals[-1] for k, v in zip(keys, totals[:-1])}


def _throughput(tokens: int, since: float, world: int) -> Metrics:
    (all_tokens,) = _all_reduce([float(tokens)])
    per_s = all_tokens / max(time.perf_counter() - since, 1e-9)
    return {"tokens": all_tokens, "tokens_per_s": per_s, "tokens_per_s_per_gpu": per_s / world}


def _peak_memory(engine) -> Metrics:
    """The largest peak of torch's allocator over the workers since the last report (GiB; a collective), then the
    peak is reset; nothing off-GPU."""
    if engine.device.type != "cuda":
        return {}
    peak = torch.tensor([torch.cuda.max_memory_allocated(engine.device) / 2**30], dtype=torch.float64,
                        device=engine.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    torch.cuda.reset_peak_memory_stats(engine.device)
    return {"gpu/peak_memory_gib": float(peak.item())}


def evaluate(engine, tokenizer, cfg: TrainConfig, rows: list[dict], rank: int, world: int) -> Metrics:
    """Loss metrics on `rows` (rank r takes rows r, r+world, ...), weighted by pairs, prefixed ``eval/``.

    Every rank runs the same number of forwards (ZeRO-3 gathers parameters collectively); a rank whose share is
    shorter repeats a batch with weight 0.
    """
    shard = rows[rank::world]
    n_batches = math.ceil(math.ceil(len(rows) / world) / cfg.micro_batch_size)
    sums: dict[str, float] = {}
    engine.eval()
    with torch.no_grad():
        for j in range(n_batches):
            chunk = shard[j * cfg.micro_batch_size:(j + 1) * cfg.micro_batch_size]
            weight = float(len(chunk))
            _, metrics = loss_on_batch(engine, cfg, _collate(tokenizer, cfg, chunk or rows[:1], engine.device))
            sums = _add(sums, {k: weight * float(v) for k, v in metrics.items()} | {"count": weight})
    engine.train()
    return {f"eval/{k}": v for k, v in _reduce_means(sums).items()}


def lora_state_dict(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights as full CPU tensors; under ZeRO-3 a collective, so every rank must call it."""
    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    gathered = deepspeed.zero.GatheredParameters([p for _, p in named]) if zero_stage == 3 else contextlib.nullcontext()
    with gathered:
        return {n: p.detach().float().cpu().clone() for n, p in named}


def save_checkpoint(engine, cfg: TrainConfig, directory: str, step: int, total: int, rank: int) -> None:
    """Write this rank's part of the checkpoint described in the module docstring into `directory`."""
    engine.save_checkpoint(os.path.join(directory, "deepspeed"), tag=f"step_{step}", client_state={"step": step},
                           exclude_frozen_parameters=True)
    rng = Path(directory) / "rng"
    rng.mkdir(exist_ok=True)
    torch.save({"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if cfg.use_gpu else []},
               rng / f"rank{rank}.pt")
    lora = lora_state_dict(engine, cfg.deepspeed.zero_stage)  # a collective under ZeRO-3: every rank calls it
    if rank == 0:
        engine.module.save_pretrained(os.path.join(directory, "adapter"), state_dict=lora)
        state = {"step": step, "total_steps": total}
        (Path(directory) / "train_state.json").write_text(json.dumps(state) + "\n")


def restore_checkpoint(engine, rank: int) -> int:
    """Load the latest Ray Train checkpoint into the engine and RNG; return the step to continue at (0 if none)."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        # strict=False: the frozen base weights were left out on purpose and already came from model_dir
        path, client_state = engine.load_checkpoint(os.path.join(directory, "deepspeed"), load_module_strict=False)
        if path is None:
            raise RuntimeError(f"no DeepSpeed checkpoint under {directory}/deepspeed")
        rng = torch.load(Path(directory) / "rng" / f"rank{rank}.pt", weights_only=False)
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return int(client_state["step"])


def _report(engine, cfg: TrainConfig, metrics: Metrics, step: int, total: int, rank: int, save: bool,
            tracker) -> None:
    if tracker is not None:
        tracker.log(metrics, step=step)
    if step == total:  # after W&B, which takes numbers only
        metrics = {**metrics, "worker_nodes": worker_nodes()}
    if not save:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(engine, cfg, directory, step, total, rank)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_dir_name=f"checkpoint_{step:06d}")


def worker_nodes() -> list[str]:
    """The Ray node id of every rank, by rank (a collective): where `cpus_per_worker` / `resources_per_worker` /
    `use_gpu` placed the workers, recorded with the run's final metrics (`ray list nodes` maps ids to addresses)."""
    nodes = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    return nodes


def _init_wandb(cfg: TrainConfig, config: dict, rank: int):
    """Rank 0's W&B run (`core.tracking.start_worker_run`); one id per run folder so restarted workers append. The
    key, when online, was installed from `config["secrets"]`."""
    run_id = config.get("wandb_id") or hashlib.sha1(config["wandb_dir"].encode()).hexdigest()[:12]
    return start_worker_run(cfg, run_id=run_id, local_dir=config["wandb_dir"], config=config["train"], rank=rank)
