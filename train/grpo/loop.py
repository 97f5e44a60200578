"""The Ray Train worker function of GRPO: sample G rollouts per prompt, reward the groups, clipped-surrogate steps.

`train/grpo/trainer.py::run_grpo` builds the `TorchTrainer`; every worker runs `grpo_loop_per_worker(config)`
(keys: ``train`` = `dataclasses.asdict(GRPOConfig)`, ``model_dir``, ``rows``, ``reward`` (a reward spec),
``total_steps``, ``wandb_dir``, and optionally ``val_rows`` + ``best_dir`` for `train.grpo.validate`). Per
optimizer step, rank r:

1. takes its `prompts_per_worker` prompts of the step (`pairs_data.step_row_indices`: a function of the step
   number, so a resumed run reads the same prompts);
2. samples `group_size` completions per prompt from its *current* policy (`HFRollout` on the model itself, or
   `train.grpo.rollout_vllm.VLLMRollout` with the adapter synced after every step; seeded by step and rank), in calls of
   `rollout.prompts_per_generate` prompts; with `rollout.max_staleness: 1` the next step's rollouts are sampled
   too, with the same policy, while this step's last groups are judged, and their behaviour log-probs taken before
   the update (`train.grpo.staleness`: the order of a step's work);
3. asks the reward callable for one `GroupOutcome` per prompt, each call's groups sent as soon as that call
   returns (`reward.overlap`, `train.grpo.overlap`: the judge works while the next call generates); failed groups
   (reward service down, timed out, no reward for a rollout) are counted and masked out of the loss, never scored 0;
4. runs `grad_accum` micro-batches of rollouts through `advantages.grpo_policy_loss` (group advantages, clip,
   optional KL to the reference = the same model with the LoRA adapter disabled, or with `finetune: full` a frozen
   copy of the initial model), `num_iterations` times; the
   loss is aggregated per micro-batch and DeepSpeed averages micro-batches and workers (so "token_mean" is a
   mean of micro-batch token means, as in TRL's per-device normalisation);
5. reports the step's metrics reduced over workers (every reward component, failures by kind, service latency,
   response length, KL, clip fraction, entropy, tokens/s, staleness) and, every `checkpoint_every` steps, a
   checkpoint (`train/checkpoint.py`; engine and W&B helpers shared with preference training);
6. every `monitor.every` steps, when the reward spec carries a ``monitor`` section (a judge reward), the
   reward-hacking monitors (`train.grpo.monitoring`): ``monitor/*`` metrics and alerts.

Every rank runs the same number of forwards and backwards whatever its groups' fate (a failed group's rollouts
still go through the model with no loss), so DeepSpeed's gradient reduction and ZeRO-3's parameter gathers stay
in step across workers. A step in which no group was scored on any worker makes no update at all
(``updates_skipped``): an optimizer step on zero gradients would still apply weight decay.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import ray.train
import torch
from transformers import AutoTokenizer

from train import collectives
from train.checkpoint import init_wandb, report_step, restore_checkpoint
from train.config import GRPOConfig
from train.cuda_check import require_cuda
from train.engine import build_engine, build_model, build_reference, output_head
from train.grpo.batch import (
    GroupOutcome,
    finish_outcome_metrics,
    micro_batch_slices,
    outcome_advantages,
    outcome_sums,
)
from train.grpo.micro import micro_loss, policy_logps
from train.grpo.monitoring import LoopMonitors
from train.grpo.overlap import InFlight, reward_overlaps, start_rollouts
from train.grpo.reward.build import build_reward
from train.grpo.rollout_hf import HFRollout
from train.grpo.staleness import Batch, StepPipeline
from train.grpo.stats import finish_stats, rank_metrics, step_stat_sums
from train.grpo.validate import BaselineAnswers, BestAdapter, sample_baselines, validate, write_answers
from train.precision import worker_precision
from train.sequences import collate_sequences, encode_prompt, step_row_indices

Metrics = dict[str, float]


def grpo_loop_per_worker(config: dict) -> None:
    """Run GRPO steps on this worker's prompts and report metrics and checkpoints to Ray Train."""
    if config.get("secrets") is not None:
        config["secrets"].install()  # the reward service's token (actors.secrets), before the reward client reads it
    cfg = GRPOConfig.from_dict(config["train"])
    if cfg.use_gpu:  # before any collective or allocation: an old driver fails here, by name
        require_cuda("use_gpu: true")
    cfg.precision = worker_precision(cfg.precision, cfg.use_gpu)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    total, rows = config["total_steps"], config["rows"]
    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    engine = build_engine(build_model(config["model_dir"], cfg), cfg, world, total)
    # finetune full with kl_coef > 0: a frozen copy of the initial model (LoRA: the adapter disabled, no copy)
    reference = build_reference(config["model_dir"], cfg, world, engine.device)
    state: dict = {}
    start = restore_checkpoint(engine, rank, state)
    tracker = init_wandb(cfg, config, rank)
    # reward-hacking monitors (train.grpo.monitoring): on when the reward spec carries a monitor section
    monitors = LoopMonitors.build(config["reward"], rank, tracker)
    reward_fn = build_reward(config["reward"], seed=cfg.seed + rank)
    rollout = make_rollout(tokenizer, cfg, config["model_dir"], rank, world)
    val_rows = config.get("val_rows") or []
    best = BestAdapter(config["best_dir"], rank, cfg.val_metric) if val_rows else None
    # vs_baseline validation: the initial policy's answer per val row, sampled once per run, before step 1
    baselines = BaselineAnswers(str(Path(config["best_dir"]).parent / "val_baseline"), rank) if val_rows else None
    if baselines is not None and cfg.val_metric == "vs_baseline":  # the policy before its first update
        sample_baselines(engine, tokenizer, cfg, val_rows, rollout, rank, world, baselines, start)
    # prompts over max_prompt_length lose the tail of their user turn (fit_prompt): counted once over all rows
    rows_truncated = float(sum(encode_prompt(tokenizer, row, cfg)[1] for row in rows))
    failed_streak = 0
    pipeline = step_pipeline(engine, tokenizer, cfg, rows, reward_fn, rollout, rank, world, total)
    off_policy = int(state.get("off_policy_steps", 0))  # the run's steps trained on an earlier policy's rollouts
    try:
        for step in range(start, total):
            metrics, samples = grpo_step(engine, tokenizer, cfg, pipeline, step, rank, reference, rollout)
            done = step + 1
            off_policy += metrics["grpo/staleness"] > 0
            metrics |= {"step": done, "start_step": start, "prompt/rows_truncated": rows_truncated,
                        "grpo/off_policy_steps": float(off_policy)}
            if monitors is not None:  # a collective at monitored steps: every rank calls it
                metrics |= monitors.step(done, samples, metrics, reduce_sums)
            if best is not None and (done == total or (cfg.eval_every and done % cfg.eval_every == 0)):
                answers: list[dict] = []
                metrics |= validate(engine, tokenizer, cfg, val_rows, reward_fn, rollout, rank, world, reduce_sums,
                                    baselines, answers)
                if monitors is not None:
                    metrics |= monitors.validation(done, answers, lambda text: len(tokenizer(text)["input_ids"]),
                                                   metrics, reduce_sums)
                if cfg.val_metric == "vs_baseline":  # the judged answers of this check, for human raters
                    write_answers(Path(config["best_dir"]).parent / "val_answers", done, rank, answers)
                if cfg.wandb:  # every rank's generations, as one W&B table (a collective: every rank calls it)
                    generations = _gather_records(answers)
                    if tracker is not None:
                        _log_records(tracker, "val/generations", generations, done)
                metrics["val/new_best"] = float(best.offer(engine, cfg.deepspeed.zero_stage, metrics, done,
                                                            full=cfg.finetune == "full"))
            failed_streak = failed_streak + 1 if metrics["reward/groups_failed_fraction"] == 1.0 else 0
            if tracker is not None and cfg.log_samples_every and done % cfg.log_samples_every == 0:
                _log_samples(tracker, samples, done)
            report_step(engine, cfg, metrics, done, total, rank, done % cfg.checkpoint_every == 0 or done == total,
                        tracker, {"off_policy_steps": off_policy})
            if cfg.max_failed_steps and failed_streak >= cfg.max_failed_steps:
                raise RuntimeError(f"max_failed_steps: every reward group failed in {failed_streak} consecutive "
                                   f"steps (last errors: {_error_kinds(metrics)}); is the reward service up?")
    finally:
        reward_fn.close()
        if monitors is not None and monitors.probe is not None:
            monitors.probe.close()
        # after the last collective: a colocated vLLM engine's in-process core tears down the process group it
        # joined when it stops (train.grpo.rollout_vllm.VLLMRollout.close)
        if hasattr(rollout, "close"):
            rollout.close()
    if tracker is not None:
        tracker.finish()


# ---------------------------------------------------------------------------------------------------------------
# Rollouts


def make_rollout(tokenizer, cfg: GRPOConfig, model_dir: str, rank: int, world: int):
    """The rollout engine of `rollout.kind`: both offer `sync(engine)` and `generate(model, prompts, G, seed)`."""
    if cfg.rollout.kind == "vllm":
        from train.grpo.rollout_vllm import VLLMRollout

        return VLLMRollout(tokenizer, cfg, model_dir, tempfile.mkdtemp(prefix="quorum-rollout-"), rank)
    return HFRollout(tokenizer, cfg, synced_gpus=cfg.deepspeed.zero_stage == 3 and world > 1)


# ---------------------------------------------------------------------------------------------------------------
# One step


def step_pipeline(engine, tokenizer, cfg: GRPOConfig, rows: list[dict], reward_fn, rollout, rank: int, world: int,
                  total: int) -> StepPipeline:
    """The order of a step's sync, rollouts, rewards and behaviour log-probs (`train.grpo.staleness`)."""

    def launch(step: int) -> tuple[InFlight, dict]:
        indices = step_row_indices(step, len(rows), cfg.prompts_per_worker, 1, world, rank, cfg.seed)[0]
        batch_rows = [rows[i] for i in indices]
        encoded = [encode_prompt(tokenizer, row, cfg) for row in batch_rows]
        prompts = [ids for ids, _ in encoded]
        seed = cfg.seed * 1_000_003 + step * 1_009 + rank  # resumable, distinct per rank, whenever generated
        torch.manual_seed(seed)
        # rollouts call by call (rollout.prompts_per_generate), each call's groups sent to the reward as it returns
        # (reward.overlap): the same rollouts and outcomes as generate-then-reward, with the judge's time overlapped
        flight = start_rollouts(
            lambda part, first: rollout.generate(engine.module, part, cfg.group_size, seed, first=first),
            lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True), reward_fn, batch_rows, prompts,
            cfg.group_size, cfg.rollout.prompts_per_generate, reward_overlaps(reward_fn))
        return flight, {"rows": batch_rows, "prompts": prompts, "truncated": sum(t for _, t in encoded),
                        "pad_id": rollout.pad_id}

    def behaviour(batch: Batch) -> list[torch.Tensor]:
        return old_logps(engine, cfg, rollout_batch(cfg, batch))

    return StepPipeline(lambda: rollout.sync(engine), launch, behaviour, reward_fn, cfg.rollout.max_staleness, total)


def rollout_batch(cfg: GRPOConfig, batch: Batch) -> dict[str, torch.Tensor]:
    """Prompt + completion of every rollout, left-padded: every completion ends at the last position, so only a
    trailing window needs logits."""
    repeated = [p for p in batch.extra["prompts"] for _ in range(cfg.group_size)]
    return collate_sequences(repeated, batch.flight.completions, batch.extra["pad_id"], "left")


def old_logps(engine, cfg: GRPOConfig, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The current policy's per-token log-probs of every micro-batch, no grad: the PPO ratio's "old" policy."""
    engine.train()  # as in the update's own passes (gradient checkpointing and dropout modes alike)
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    head = output_head(engine, cfg)
    return [policy_logps(engine, batch, s, cfg, no_grad=True, head=head)[0]
            for s in micro_batch_slices(batch["input_ids"].shape[0], cfg.micro_batch_size)]


def grpo_step(engine, tokenizer, cfg: GRPOConfig, pipeline: StepPipeline, step: int, rank: int,
              reference=None, rollout=None) -> tuple[Metrics, list[dict]]:
    """Rollouts -> rewards -> `num_iterations` optimizer steps. Returns the reduced metrics and rank-local samples.
    `reference`: full fine-tuning's frozen reference copy for the KL term (`train.engine.build_reference`)."""
    began = time.perf_counter()
    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(engine.device)
    took = pipeline.take(step)  # sync, this step's rollouts (and with max_staleness 1 the next step's), rewards
    batch, got = took.batch, took.got
    batch_rows, prompts = batch.extra["rows"], batch.extra["prompts"]
    completions, finished, texts = got.completions, got.finished, got.texts
    outcomes: list[GroupOutcome] = got.outcomes
    advantages, valid = outcome_advantages(outcomes, cfg.group_size, cfg.normalize_std)
    if rollout is not None:  # a full-fine-tuning vLLM engine sleeps (level 2) through the update
        rollout.release()
    if _any_worker(bool(valid.any())):
        sums = policy_update(engine, cfg, rollout_batch(cfg, batch), advantages,
                             valid, behaviour=batch.behaviour, reference=reference)
    else:
        # no group scored anywhere: no optimizer step at all (weight decay and Adam state would still move)
        sums = {"lr": engine.get_lr()[0], "grad_norm_max": math.nan, "train_tokens": 0.0, "updates_skipped": 1.0}
    sums |= outcome_sums(outcomes) | _length_sums(completions, finished) | step_stat_sums(
        [o.rewards for o in outcomes if o.ok], advantages, valid, [len(p) for p in prompts],
        [len(c) for c in completions])
    # generation in this step's clock: its own rollouts, or (max_staleness 1) the next step's
    sums["generated_tokens"] = float(took.generated_tokens)
    sums["prompts_truncated"] = float(batch.extra["truncated"])
    sums["old_logprob_s_max"] = sums.get("old_logprob_s_max", 0.0) + took.behaviour_s
    sums["staleness_max"] = float(took.staleness)
    step_s = time.perf_counter() - began
    sums |= {"generate_s_max": took.generate_s, "step_s_max": step_s, "weight_sync_s_max": took.sync_s,
             "reward_s_max": got.reward_wait_s, "reward_span_s_max": got.reward_span_s,
             "reward_hidden_s_max": got.reward_hidden_s}
    mine = {"tokens_per_s": sums["train_tokens"] / max(step_s, 1e-9),
            "generate_tokens_per_s": sums["generated_tokens"] / max(took.generate_s, 1e-9)}
    if cuda:  # this process's torch allocator (DeepSpeed and HF; vLLM's engine process is not counted)
        mine["peak_memory_gib"] = torch.cuda.max_memory_allocated(engine.device) / 2**30
        sums["peak_memory_gib_max"] = mine["peak_memory_gib"]
    sums |= rank_metrics(rank, mine)
    metrics = _finish(reduce_sums(sums))
    samples = [{"prompt_id": str(batch_rows[i // cfg.group_size].get("id", "")), "completion": text,
                "reward": (outcomes[i // cfg.group_size].rewards or [math.nan] * cfg.group_size)[i % cfg.group_size],
                "error": outcomes[i // cfg.group_size].error} for i, text in enumerate(texts)]
    for i, sample in enumerate(samples):  # what the reward-hacking monitors read (train.grpo.monitoring)
        sample |= {"group": i // cfg.group_size, "tokens": len(completions[i])}
    for g, outcome in enumerate(outcomes):
        samples[g * cfg.group_size]["verdicts"] = outcome.verdicts
    return metrics, samples


def policy_update(engine, cfg: GRPOConfig, batch: dict[str, torch.Tensor], advantages: torch.Tensor,
                  valid: torch.Tensor, behaviour: list[torch.Tensor] | None = None, reference=None) -> Metrics:
    """`num_iterations` passes of `grad_accum` micro-batches; the engine steps at each accumulation boundary.

    The ratio's "old" log-probs are `behaviour`'s when the rollouts came from an earlier policy (max_staleness 1:
    computed before the previous update); else this policy's own, computed here when `num_iterations` > 1 (with
    one pass they equal the current log-probs, detached, and `train.grpo.micro.micro_loss` uses those).
    """
    engine.train()  # rollouts ran in eval mode; gradient checkpointing only acts in train mode
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    slices = micro_batch_slices(batch["input_ids"].shape[0], cfg.micro_batch_size)
    clock = time.perf_counter()
    old = behaviour if behaviour is not None else old_logps(engine, cfg, batch) if cfg.num_iterations > 1 else None
    old_s, clock = time.perf_counter() - clock, time.perf_counter()
    ref = reference_logps(engine, cfg, batch, slices, reference) if cfg.kl_coef else None
    sums: Metrics = {"lr": engine.get_lr()[0], "old_logprob_s_max": old_s,
                     "reference_s_max": time.perf_counter() - clock}
    clock = time.perf_counter()
    for _ in range(cfg.num_iterations):
        for j, part in enumerate(slices):
            loss, metrics = micro_loss(engine, cfg, batch, part, advantages[part].to(engine.device),
                                       valid[part].to(engine.device), old[j] if old else None,
                                       ref[j] if ref else None, head=output_head(engine, cfg))
            engine.backward(loss)
            engine.step()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
    sums["update_s_max"] = time.perf_counter() - clock
    norm = engine.get_global_grad_norm()
    sums["grad_norm_max"] = float(norm) if norm is not None else math.nan
    sums["train_tokens"] = float(batch["attention_mask"].sum()) * cfg.num_iterations
    return sums


def reference_logps(engine, cfg: GRPOConfig, batch: dict, slices: list[slice], reference=None) -> list[torch.Tensor]:
    """The reference policy's per-token log-probs of every micro-batch (the KL term): `reference`, the frozen copy
    of full fine-tuning (`train.engine.build_reference`), or the LoRA policy with its adapter disabled."""
    model = reference if reference is not None else engine
    head = output_head(model, cfg)
    return [policy_logps(model, batch, s, cfg, no_grad=True, reference=reference is None, head=head)[0]
            for s in slices]


# ---------------------------------------------------------------------------------------------------------------
# Metrics


def _length_sums(completions: list[list[int]], finished: list[bool]) -> Metrics:
    return {"rollouts": float(len(completions)), "truncated": float(sum(not f for f in finished))}


def _any_worker(flag: bool) -> bool:
    """True when `flag` holds on at least one worker (every rank must take the same update decision)."""
    return collectives.any_rank(flag)


def reduce_sums(sums: Metrics) -> Metrics:
    """All-reduce a metric dict over workers: ``*_max`` keys with max, ``*_min`` with min, the rest summed. Ranks
    may hold different keys (failure kinds, reward components, per-rank figures), so the union of keys is agreed on
    first; a rank without a key adds nothing to it (0, or -inf / inf for an extremum)."""
    keys = sorted(set().union(*collectives.gather_objects(sorted(sums))))
    out = {}
    for op, selected, missing in (
            ("max", [k for k in keys if k.endswith("_max")], -math.inf),
            ("min", [k for k in keys if k.endswith("_min")], math.inf),
            ("sum", [k for k in keys if not k.endswith(("_max", "_min"))], 0.0)):
        if selected:
            out |= dict(zip(selected, collectives.all_reduce_values([sums.get(k, missing) for k in selected], op)))
    return out


def _finish(totals: Metrics) -> Metrics:
    """Reduced sums -> logged metrics (token-weighted loss metrics, per-rollout means, throughput)."""
    world = collectives.world_size()
    tokens, rollouts = totals.get("loss_tokens", 0.0), totals.get("rollouts", 0.0)
    metrics = finish_outcome_metrics(totals)
    for key, value in totals.items():
        if key.endswith("_wsum"):
            metrics[key[:-len("_wsum")]] = value / tokens if tokens else math.nan
    step_s = max(totals["step_s_max"], 1e-9)
    metrics |= finish_stats(totals) | {
        "lr": totals["lr"] / world, "grad_norm": totals["grad_norm_max"],
        "updates_skipped": totals.get("updates_skipped", 0.0) / world,
        "response_length/truncated_fraction": totals["truncated"] / rollouts if rollouts else 0.0,
        "prompt/truncated": totals.get("prompts_truncated", 0.0),
        "tokens": totals["train_tokens"], "tokens_per_s": totals["train_tokens"] / step_s,
        "tokens_per_s_per_gpu": totals["train_tokens"] / step_s / world,
        "generate_tokens_per_s": totals["generated_tokens"] / max(totals["generate_s_max"], 1e-9),
        "time/step_s": step_s,
    }
    # the slowest worker's seconds in each phase (the step waits for it)
    for phase in ("generate", "weight_sync", "reward", "old_logprob", "reference", "update"):
        if f"{phase}_s_max" in totals:
            metrics[f"time/{phase}_s"] = max(totals[f"{phase}_s_max"], 0.0)
    # time/reward_s is the step's wait for rewards after its last rollout; the judge's whole span and the part of
    # it hidden behind generation (reward.overlap) are logged apart, so the time/* phases still add up to the step
    for key in ("reward_span_s", "reward_hidden_s"):
        if f"{key}_max" in totals:
            metrics[f"perf/{key}"] = max(totals[f"{key}_max"], 0.0)
    if "peak_memory_gib_max" in totals:
        metrics["gpu/peak_memory_gib"] = totals["peak_memory_gib_max"]
    # GRPO steps between the policy that sampled this step's rollouts and the one it updates (rollout.max_staleness)
    metrics["grpo/staleness"] = max(totals.get("staleness_max", 0.0), 0.0)
    metrics |= {k: v for k, v in totals.items() if k.startswith("perf/rank")}
    return metrics


def _error_kinds(metrics: Metrics) -> dict[str, float]:
    return {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("reward_service/errors/")}


def _gather_records(records: list[dict], limit: int = 512) -> list[dict]:
    """Every rank's records, in rank order, at most `limit` (a collective)."""
    return [r for part in collectives.gather_objects(records[:limit]) for r in part][:limit]


def _log_records(tracker, name: str, records: list[dict], step: int) -> None:
    import wandb

    columns = list(dict.fromkeys(k for r in records for k in r))
    tracker.log({name: wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in records])}, step=step)


def _log_samples(tracker, samples: list[dict], step: int) -> None:
    import wandb

    columns = ["prompt_id", "completion", "reward", "error"]
    table = wandb.Table(columns=columns, data=[[s[c] for c in columns] for s in samples[:64]])
    tracker.log({"samples/rollouts": table}, step=step)
