"""The Ray Train worker function of preference training: LoRA model -> DeepSpeed engine -> steps -> reports.

`train/preference/trainer.py::run_training` builds the `TorchTrainer`; every worker runs
`train_loop_per_worker(config)`, whose only input is `config` (keys: ``train`` = `dataclasses.asdict(TrainConfig)`,
``model_dir``, ``train_rows``, ``eval_rows``, ``total_steps``, ``wandb_dir``). The maths lives elsewhere and is only
called here: tokenization and the batch plan in `train/sequences.py`, log-probs in `train/logprobs.py`, losses in
`train/preference/losses.py` (called through `train/preference/objective.py`), the DeepSpeed config and LR schedule
in `train/ds_config.py`.

Per optimizer step, rank r runs `grad_accum` micro-batches given by `pairs_data.step_row_indices` (a function of the
step number only), one concatenated forward of chosen + rejected rows each; DPO adds a no-grad forward with the LoRA
adapter disabled as its reference model (no second model copy). The model and engine come from `train/engine.py`,
checkpoints (DeepSpeed state, RNG, adapter) from `train/checkpoint.py`: on start a worker restores the latest and
continues at the saved step, so a run that failed and resumed ends at the same step, on the same batches, as one
that did not.

One loop serves all six losses rather than TRL's `trl.experimental.cpo.CPOTrainer` for cpo/simpo/cpo_simpo: ARPO and
DPO need `compute_preference_loss` anyway, and a single loop keeps batching, checkpoints and resume identical for all.
"""

from __future__ import annotations

import math
import time

import ray.train
import torch
from transformers import AutoTokenizer

from train import collectives
from train.checkpoint import init_wandb, report_step, restore_checkpoint
from train.config import TrainConfig
from train.cuda_check import require_cuda
from train.engine import base_fingerprint, build_engine, build_model, build_reference, output_head
from train.logprobs import chunked_token_logps, final_hidden, sequence_logps
from train.precision import autocast, worker_precision
from train.preference.objective import compute_preference_loss
from train.sequences import collate_pairs, collate_targets, encode_pair, encode_target, step_row_indices

Metrics = dict[str, float]


def train_loop_per_worker(config: dict) -> None:
    """Train on this worker's share of the rows and report metrics and checkpoints to Ray Train.

    Args:
        config: See the module docstring; nothing else (no module globals) is read.
    """
    if config.get("secrets") is not None:
        config["secrets"].install()  # the W&B key when the job's run is online (actors.secrets), before wandb.init
    cfg = TrainConfig.from_dict(config["train"])
    if cfg.use_gpu:  # before any collective or allocation: an old driver fails here, by name
        require_cuda("use_gpu: true")
    cfg.precision = worker_precision(cfg.precision, cfg.use_gpu)
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    total, rows = config["total_steps"], config["train_rows"]
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    engine = build_engine(build_model(config["model_dir"], cfg), cfg, world, total)
    # DPO under finetune full: a frozen copy of the initial model (LoRA: the adapter disabled, no copy)
    reference = build_reference(config["model_dir"], cfg, world, engine.device)
    zero3 = cfg.deepspeed.zero_stage == 3
    fingerprint = base_fingerprint(engine.module, gather=zero3)  # after DeepSpeed's dtype cast, if any
    start = restore_checkpoint(engine, rank)
    tracker = init_wandb(cfg, config, rank)
    sums, tokens, clock = {}, 0, time.perf_counter()
    for step in range(start, total):
        step_sums, step_tokens = train_step(engine, tokenizer, cfg, rows, step, rank, world, reference)
        sums, tokens, done = _add(sums, step_sums), tokens + step_tokens, step + 1
        save = done % cfg.checkpoint_every == 0 or done == total
        if not (save or done % cfg.log_every == 0):
            continue
        metrics = _reduce_means(sums) | _throughput(tokens, clock, world) | _local_phase_means(sums) | _peak_memory(
            engine) | {"step": done, "start_step": start}
        if config["eval_rows"] and (done == total or (cfg.eval_every and done % cfg.eval_every == 0)):
            metrics |= evaluate(engine, tokenizer, cfg, config["eval_rows"], rank, world, reference)
        if done == total:
            if fingerprint.numel():  # finetune full has no frozen weights to watch
                metrics["base_drift"] = float((base_fingerprint(engine.module, gather=zero3) - fingerprint).abs().max())
            if world > 1:
                metrics["time/allreduce_s"] = allreduce_seconds(engine)
        report_step(engine, cfg, metrics, done, total, rank, save, tracker)
        sums, tokens, clock = {}, 0, time.perf_counter()
        if cfg.fail_at_step and done == cfg.fail_at_step and start == 0 and rank == world - 1:
            # The controller registers a checkpoint once every rank's report is processed; a rank that raises
            # right after its report can beat that, and the restart would then find no checkpoint. Wait for it.
            ray.train.get_all_reported_checkpoints()
            raise RuntimeError(f"fail_at_step={done}: injected worker failure (test hook)")
    if tracker is not None:
        tracker.finish()


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


def _logps(engine, batch: dict[str, torch.Tensor], cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs (float32 whatever the logits) and token counts; chunked as `train.grpo.micro`."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")} | {"use_cache": False}
    with autocast(cfg.precision, engine.device):
        if not cfg.logprob_chunk_tokens:
            return sequence_logps(engine(**inputs).logits, batch["input_ids"], batch["loss_mask"])
        hidden = final_hidden(engine, inputs, grad=torch.is_grad_enabled())[:, :-1]
        mask = batch["loss_mask"][:, 1:].bool()
        per_token, _ = chunked_token_logps(hidden, output_head(engine, cfg),
                                           batch["input_ids"][:, 1:].masked_fill(~mask, 0), cfg.logprob_chunk_tokens)
    return (per_token * mask).sum(-1), mask.sum(-1)


def loss_on_batch(engine, cfg: TrainConfig, batch: dict[str, torch.Tensor],
                  reference=None) -> tuple[torch.Tensor, dict]:
    """Concatenated forward (chosen rows, then rejected rows), then `compute_preference_loss`. DPO's reference is
    `reference` (full fine-tuning's frozen copy, `train.engine.build_reference`) or the policy with its LoRA
    adapter disabled.

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
        if reference is not None:
            with torch.no_grad():
                ref, _ = _logps(reference, batch, cfg)
        else:
            with torch.no_grad(), engine.module.disable_adapter():
                ref, _ = _logps(engine, batch, cfg)
        stats["ref_chosen_logps"], stats["ref_rejected_logps"] = ref[:b], ref[b:]
    loss, metrics = compute_preference_loss(cfg.loss, stats, cfg.loss_config)
    metrics["logps/chosen"], metrics["logps/rejected"] = logps[:b].detach().mean(), logps[b:].detach().mean()
    return loss, metrics


def train_step(engine, tokenizer, cfg: TrainConfig, rows: list[dict], step: int, rank: int, world: int,
               reference=None):
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
        loss, metrics = loss_on_batch(engine, cfg, batch, reference)
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
    tensor = torch.zeros(numel, dtype=torch.float32, device=collectives.collective_device())
    times = []
    for _ in range(repeats):
        collectives.barrier()
        started = time.perf_counter()
        collectives.all_reduce_(tensor)
        times.append(time.perf_counter() - started)
    return float(sorted(times)[len(times) // 2])


def _full_grad_norm(engine) -> float | None:
    """Pre-clipping global grad norm under ZeRO-0, where DeepSpeed's fp32 path does not record it; the gradients
    are complete (already averaged over workers) between the boundary backward and the step."""
    grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else None


# ---------------------------------------------------------------------------------------------------------------
# Metrics and evaluation


def _add(total: dict, new: dict) -> dict:
    return {k: total.get(k, 0.0) + new.get(k, 0.0) for k in total.keys() | new.keys()}


def _all_reduce(values: list[float]) -> list[float]:
    return collectives.all_reduce_values(values)


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
    (peak,) = collectives.all_reduce_values([torch.cuda.max_memory_allocated(engine.device) / 2**30], "max")
    torch.cuda.reset_peak_memory_stats(engine.device)
    return {"gpu/peak_memory_gib": peak}


def evaluate(engine, tokenizer, cfg: TrainConfig, rows: list[dict], rank: int, world: int,
             reference=None) -> Metrics:
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
            _, metrics = loss_on_batch(engine, cfg, _collate(tokenizer, cfg, chunk or rows[:1], engine.device),
                                       reference)
            sums = _add(sums, {k: weight * float(v) for k, v in metrics.items()} | {"count": weight})
    engine.train()
    return {f"eval/{k}": v for k, v in _reduce_means(sums).items()}


