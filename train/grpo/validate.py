"""Periodic validation of a GRPO run on held-out prompts, and the best adapter it selects (Ray Train worker side).

Every `eval_every` steps and after the last one, each worker validates its shard of the validation prompts with
the current policy, by `grpo.val_metric`:

- ``reward`` (judge GRPO): G rollouts per prompt scored with the training reward; the reduced mean reward over all
  scored rollouts is `val/reward/mean` (with every reward component and failure count under `val/`);
- ``vs_baseline`` (policy GRPO against the GRM, MENLO §5.2): one answer per prompt judged by the GRM against the
  baseline's answer in both orders; win / tie / loss rates and mean grades under `val/vs_baseline/`, the score is
  the win rate with ties counted half (`train.grpo.batch.versus_metrics`). The baseline is the initial policy: the
  policy as it is before its first update, whatever it starts from (a fresh LoRA adapter, which leaves the base
  model's outputs unchanged; the SFT adapter of `grpo.init_adapter`; the full model of `finetune: full`). Its
  answers are sampled once per run, before step 1 (`sample_baselines`), with the same per-prompt seeds as every
  validation, and kept (`BaselineAnswers`, also on disk, so a restarted worker judges against the very same
  answers). A mean-margin reward cannot serve here: its group means are 0 by construction.

Every validation generation, the baseline's included, comes from the rollout engine: with `rollout.kind: vllm` the
colocated vLLM engine (the baseline without a LoRA request), never HF `generate` on the training model, which under
ZeRO-3 gathers the sharded weights across nodes for every token; with `rollout.kind: hf`, `generate`.

Validation samples at the rollout temperature with seeds that depend on the prompt only, never on the step, so
successive validations compare policies on the same random draws (common random numbers), and it runs inside a
forked RNG so training samples exactly what it would have without validation.

When the score beats the best so far, rank 0 writes the adapter to `best_dir` (temp name, then rename) with
`best.json` (step, score key, score, every `val/` metric). A resumed run reads the best score back from there, so a
restarted worker never replaces a better adapter with a worse one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch

from train import collectives
from train.grpo.batch import (
    VAL_SCORES,
    improved,
    outcome_sums,
    validation_metrics,
    versus_metrics,
    versus_outcome,
    versus_sums,
)

Metrics = dict[str, float]


def validation_shard(n_rows: int, rank: int, world: int) -> list[tuple[int, bool]]:
    """(row index, counted) for this rank: rows rank, rank + world, ...; every rank gets the same number of entries
    (generation under ZeRO-3 is collective), the padding repeats row 0 and is not counted.

    >>> validation_shard(3, 1, 2)
    [(1, True), (0, False)]
    """
    per_rank = math.ceil(n_rows / world)
    return [(i, True) if (i := rank + world * k) < n_rows else (0, False) for k in range(per_rank)]


def validate(engine, tokenizer, cfg, rows: list[dict], reward_fn, rollout, rank: int, world: int,
             reduce_sums, baselines: BaselineAnswers | None = None, answers: list[dict] | None = None) -> Metrics:
    """`val/` metrics of the current policy by `cfg.val_metric`, reduced over workers (see module docstring).

    `baselines` (vs_baseline) holds the initial policy's answer per validation row index (`sample_baselines`);
    `answers`, when given, receives this rank's judged (policy answer, baseline answer) records (`answer_records`),
    or with val_metric reward every generation with its reward."""
    shard = validation_shard(len(rows), rank, world)
    versus = cfg.val_metric == "vs_baseline"
    if versus:
        if baselines is None:
            raise ValueError("val_metric vs_baseline: validate() needs the baselines cache")
        if _any_rank(bool(missing := sorted({i for i, _ in shard} - set(baselines.answers)))):
            raise RuntimeError(f"val_metric vs_baseline: no baseline answer for validation rows {missing[:10]} on "
                               f"rank {rank} (or another rank): they are sampled from the policy before its first "
                               "update (sample_baselines) and kept under val_baseline/; a run resumed past step 0 "
                               "cannot sample them again")
    outcomes = []
    rollout.sync(engine)
    with torch.random.fork_rng(devices=[]):
        for part, picked, prompts, seed in _batches(tokenizer, cfg, rows, shard):
            if versus:
                texts = _answers(engine, tokenizer, prompts, seed, rollout)
                base = [baselines.answers[i] for i, _ in part]
                scored = reward_fn.versus(picked, texts, base)
                if answers is not None:
                    answers += answer_records([(i, row, text, b, o) for (i, counted), row, text, b, o
                                               in zip(part, picked, texts, base, scored) if counted])
            else:
                torch.manual_seed(seed)
                ids, _ = rollout.generate(engine.module, prompts, cfg.group_size, seed)
                texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
                groups = [texts[g * cfg.group_size:(g + 1) * cfg.group_size] for g in range(len(picked))]
                scored = reward_fn(picked, groups)
                if answers is not None:  # every generation with its reward: the W&B validation table
                    answers += [{"val_index": i, "id": str(row.get("id", i)), "answer": text,
                                 "reward": o.rewards[k] if o.ok else None, "error": o.error}
                                for (i, counted), row, group, o in zip(part, picked, groups, scored) if counted
                                for k, text in enumerate(group)]
            outcomes += [o for o, (_, counted) in zip(scored, part) if counted]
    if versus:
        return versus_metrics(reduce_sums(versus_sums(outcomes)))
    return validation_metrics(reduce_sums(outcome_sums(outcomes)))


def sample_baselines(engine, tokenizer, cfg, rows: list[dict], rollout, rank: int, world: int,
                     baselines: BaselineAnswers, step: int) -> None:
    """The baseline's answers (module docstring): this rank's validation rows answered by the policy as it is now,
    which must be before its first update (`step` 0), with the seeds every validation uses; the rows kept in
    `baselines` already (a restarted worker) are not sampled again. Every rank calls it (ZeRO-3's generate is
    collective).

    Raises:
        RuntimeError: rows without a kept answer after step 0, when the initial policy is gone.
    """
    shard = validation_shard(len(rows), rank, world)
    if not _any_rank(any(i not in baselines.answers for i, _ in shard)):
        return
    if step > 0:
        missing = sorted({i for i, _ in shard} - set(baselines.answers))
        raise RuntimeError(f"val_metric vs_baseline: the run resumes at step {step} but {baselines.dir} lacks the "
                           f"baseline answers of validation rows {missing[:10]} (on rank {rank} or another): the "
                           "initial policy that answers them is gone; start the run afresh")
    rollout.sync(engine)  # the vLLM engine serves the policy of step 0 (its first adapter version)
    with torch.random.fork_rng(devices=[]):
        for part, _, prompts, seed in _batches(tokenizer, cfg, rows, shard):
            # every rank generates when one must: ZeRO-3's generate is collective
            if _any_rank(any(i not in baselines.answers for i, _ in part)):
                texts = _answers(engine, tokenizer, prompts, seed, rollout)
                baselines.add({i: text for (i, _), text in zip(part, texts)})


def _batches(tokenizer, cfg, rows: list[dict], shard: list[tuple[int, bool]]):
    """(shard entries, rows, encoded prompts, seed) per generate call; the seed is a function of the prompts only
    (never of the step), so every validation and the baseline sample with the same draws."""
    from train.sequences import encode_prompt

    batch = max(cfg.prompts_per_worker, 1)
    for start in range(0, len(shard), batch):
        part = shard[start:start + batch]
        picked = [rows[i] for i, _ in part]
        yield (part, picked, [encode_prompt(tokenizer, r, cfg)[0] for r in picked],
               cfg.seed * 1_000_003 + 7_919 * (part[0][0] + 1))


def answer_records(judged: list[tuple]) -> list[dict]:
    """One JSON-able record per judged validation prompt (val index, row, policy answer, baseline answer, outcome):
    what a human rater needs for MENLO Table 7's two-stage comparison (`quorum human export` reads them), with the
    GRM's verdict beside it."""
    records = []
    for index, row, answer, baseline, outcome in judged:
        margin = outcome.components["grm_margin"][0] if outcome.ok else None
        records.append({"val_index": index, "id": str(row.get("id", index)), "dimension": row.get("dimension", ""),
                        "locale": row.get("locale", ""), "prompt_messages": row.get("prompt_messages", ""),
                        "answer": answer, "baseline_answer": baseline, "grm_margin": margin,
                        "grm_outcome": versus_outcome(margin) if margin is not None else "",
                        "error": outcome.error})
    return records


def write_answers(directory: str | Path, step: int, rank: int, records: list[dict]) -> None:
    """`<directory>/step_<step>/rank<rank>.jsonl`, written under a temp name then renamed (never half a file)."""
    out = Path(directory) / f"step_{step:06d}"
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{rank}.jsonl.tmp-{os.getpid()}"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, out / f"rank{rank}.jsonl")


class BaselineAnswers:
    """The base model's validation answers by val row index: in memory, and in ``<dir>/rank<r>.json`` so a
    restarted worker reads them back instead of sampling new ones (all ranks' files are read: any world size)."""

    def __init__(self, directory: str, rank: int):
        self.dir, self.rank = Path(directory), rank
        self.answers: dict[int, str] = {}
        for path in sorted(self.dir.glob("rank*.json")):
            self.answers |= {int(k): v for k, v in json.loads(path.read_text()).items()}
        self._mine: dict[int, str] = {}

    def add(self, answers: dict[int, str]) -> None:
        self.answers |= answers
        self._mine |= answers
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".rank{self.rank}.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({str(k): v for k, v in sorted(self._mine.items())}, ensure_ascii=False))
        os.replace(tmp, self.dir / f"rank{self.rank}.json")


def _any_rank(flag: bool) -> bool:
    return collectives.any_rank(flag)


def _answers(engine, tokenizer, prompts: list[list[int]], seed: int, rollout) -> list[str]:
    """One answer per prompt from the current policy, by the rollout engine, at the rollout's temperature."""
    torch.manual_seed(seed)
    ids, _ = rollout.generate(engine.module, prompts, 1, seed)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


class BestAdapter:
    """The best validation score so far and the adapter that earned it (module docstring)."""

    def __init__(self, best_dir: str, rank: int, val_metric: str = "reward"):
        self.dir, self.rank, self.key = Path(best_dir), rank, VAL_SCORES[val_metric]
        self.score = self._load_score()

    def _load_score(self) -> float | None:
        """Rank 0 reads best.json; all ranks agree on the value (they take the same save decision)."""
        score = -math.inf
        record = self.dir / "best.json"
        if self.rank == 0 and record.is_file():
            saved = json.loads(record.read_text())
            # a best kept under another score (the config changed on resume) is not comparable: start over
            if saved.get("score_key", VAL_SCORES["reward"]) == self.key:
                score = float(saved["score"])
        (best,) = collectives.all_reduce_values([score], "max")
        return None if best == -math.inf else best

    def offer(self, engine, zero_stage: int, metrics: Metrics, step: int, full: bool = False) -> bool:
        """Keep the adapter (`full`: the 16-bit model export, `train.engine.export_model`) if `metrics[self.key]` is
        a new best. Every rank calls it (ZeRO-3 gathers)."""
        from train.engine import export_model, lora_state_dict

        value = metrics[self.key]
        if not improved(value, self.score):
            return False
        tmp = self.dir.with_name(self.dir.name + f".tmp-{os.getpid()}")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            export_model(engine, zero_stage, self.rank, str(tmp))
        else:
            lora = lora_state_dict(engine, zero_stage)
            if self.rank == 0:
                engine.module.save_pretrained(str(tmp), state_dict=lora)
        if self.rank == 0:
            record = {"step": step, "score_key": self.key, "score": value,
                      "metrics": {k: v for k, v in metrics.items() if k.startswith("val/")}}
            (tmp / "best.json").write_text(json.dumps(record, indent=2) + "\n")
            old = self.dir.with_name(self.dir.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if self.dir.exists():
                os.replace(self.dir, old)
            os.replace(tmp, self.dir)
            shutil.rmtree(old, ignore_errors=True)
        self.score = value
        return True
