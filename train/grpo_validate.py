"""Periodic validation of a GRPO run on held-out prompts, and the best adapter it selects (Ray Train worker side).

Every `eval_every` steps and after the last one, each worker samples G rollouts for its shard of the validation
prompts with the current policy and scores them with the training reward; the reduced mean reward over all scored
rollouts is `val/reward/mean` (with every reward component and failure count under `val/`). Validation samples at
the rollout temperature (the quantity GRPO maximises) with seeds that depend on the prompt only, never on the
step, so successive validations compare policies on the same random draws (common random numbers), and they run
inside a forked RNG so training samples exactly what it would have without validation.

When `val/reward/mean` beats the best so far, rank 0 writes the adapter to `best_dir` (temp name, then rename) with
`best.json` (step, score, every `val/` metric). A resumed run reads the best score back from there, so a restarted
worker never replaces a better adapter with a worse one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from train.grpo_batch import VAL_SCORE, improved, outcome_sums, validation_metrics

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
             reduce_sums) -> Metrics:
    """Mean reward of G rollouts per validation prompt, reduced over workers (see module docstring)."""
    from train.pairs_data import encode_prompt

    shard = validation_shard(len(rows), rank, world)
    batch = max(cfg.prompts_per_worker, 1)
    outcomes = []
    rollout.sync(engine)
    with torch.random.fork_rng(devices=[]):
        for start in range(0, len(shard), batch):
            part = shard[start:start + batch]
            picked = [rows[i] for i, _ in part]
            seed = cfg.seed * 1_000_003 + 7_919 * (part[0][0] + 1)  # a function of the prompts only
            torch.manual_seed(seed)
            ids, _ = rollout.generate(engine.module, [encode_prompt(tokenizer, r, cfg) for r in picked],
                                      cfg.group_size, seed)
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            groups = [texts[g * cfg.group_size:(g + 1) * cfg.group_size] for g in range(len(picked))]
            scored = reward_fn(picked, groups)
            outcomes += [o for o, (_, counted) in zip(scored, part) if counted]
    return validation_metrics(reduce_sums(outcome_sums(outcomes)))


class BestAdapter:
    """The best validation score so far and the adapter that earned it (module docstring)."""

    def __init__(self, best_dir: str, rank: int):
        self.dir, self.rank = Path(best_dir), rank
        self.score = self._load_score()

    def _load_score(self) -> float | None:
        """Rank 0 reads best.json; all ranks agree on the value (they take the same save decision)."""
        score = -math.inf
        record = self.dir / "best.json"
        if self.rank == 0 and record.is_file():
            score = float(json.loads(record.read_text())["score"])
        tensor = torch.tensor([score], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return None if tensor.item() == -math.inf else tensor.item()

    def offer(self, engine, zero_stage: int, metrics: Metrics, step: int) -> bool:
        """Keep the adapter if `metrics[VAL_SCORE]` is a new best. Every rank calls it (ZeRO-3 gathers)."""
        from train.loop import lora_state_dict

        value = metrics[VAL_SCORE]
        if not improved(value, self.score):
            return False
        lora = lora_state_dict(engine, zero_stage)
        if self.rank == 0:
            tmp = self.dir.with_name(self.dir.name + f".tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            engine.module.save_pretrained(str(tmp), state_dict=lora)
            record = {"step": step, "score_key": VAL_SCORE, "score": value,
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
