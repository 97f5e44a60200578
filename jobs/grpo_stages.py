"""Stages shared by the GRPO jobs (`jobs/judge/grpo.py`, `jobs/policy/grpo.py`): rows -> train -> summary.

    rows   one Parquet row per training prompt: id, prompt_messages (JSON), plus what the reward reads
    train  `train.grpo.trainer.run_grpo` on Ray Train; the stage holds one row of final metrics and, under
           train/run/, the adapter (train/run/adapter), Ray Train's checkpoints and the workers' W&B files

Both are skipped on resume when their config hash is unchanged, like every stage (`core/runstore.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.config import ConfigError, fail, require_file
from core.jobrun import record_stages
from core.runstore import RunStore, StageResult, write_table
from core.tracking import Tracker, WandbConfig, trainer_tracking
from eval.judging.menlo_data import SPLITS
from train.config import GRPOConfig
from train.grpo.monitoring import read_alerts

log = logging.getLogger("quorum.grpo")

# final metrics shown in summary.md, in this order (those present)
SUMMARY_KEYS = ("step", "reward/mean", "reward/std_within_group", "reward/groups", "reward/groups_failed",
                "reward/groups_failed_fraction", "reward_service/latency_s_mean", "reward_service/retries",
                "response_length/mean", "response_length/truncated_fraction", "prompt/rows_truncated", "kl",
                "approx_kl", "clip_fraction", "entropy", "loss", "grad_norm", "updates_skipped", "tokens_per_s",
                "generate_tokens_per_s", "time/step_s")
SAMPLES = ("random", "head")


@dataclass
class GRPOData:
    """The `data` section both GRPO jobs start from: MENLO-format pairs, training and held-out splits."""

    # MENLO-format JSONL (fields: eval/judging/menlo_data.py)
    path: str = "configs/data/menlo_grpo_train.jsonl"
    splits: list[str] = field(default_factory=lambda: ["train"])  # values of the rows' `split` field trained on
    # held-out rows validated every grpo.eval_every steps (best adapter kept); [] = no validation
    val_splits: list[str] = field(default_factory=list)
    # keep the first N validation rows (0 = all)
    val_limit: int = 0
    # [] = all four dimensions
    dimensions: list[str] = field(default_factory=list)
    # keep the first N rows after filtering (0 = all)
    limit: int = 0

    def validate_data(self) -> None:
        """The file exists, the splits are known and held out; the job checks its own dimensions."""
        require_file(self.path, "data.path")
        check_splits(self.splits, self.val_splits, SPLITS)
        # limit, val_limit >= 0: check_tree's floor


def train_val_rows(data: GRPOData, rows_of: Callable[[list[str], int], pd.DataFrame]) -> pd.DataFrame:
    """`rows_of(splits, limit)` for the training splits (`role` train) and, with data.val_splits, the held-out ones
    (`role` val)."""
    frames = [rows_of(data.splits, data.limit).assign(role="train")]
    if data.val_splits:
        frames.append(rows_of(data.val_splits, data.val_limit).assign(role="val"))
    return pd.concat(frames, ignore_index=True)


def validate_grpo(grpo: GRPOConfig, n_rows: int) -> None:
    """One global batch needs `prompts_per_step` training prompts (checked once the rows are read)."""
    if n_rows < grpo.prompts_per_step:
        fail("grpo.prompts_per_step", f"{grpo.prompts_per_step} is more than the {n_rows} training prompts")


def check_splits(splits: list[str], val_splits: list[str], known: tuple[str, ...]) -> None:
    """data.splits must be non-empty, data.val_splits disjoint from it, both made of known split names."""
    for name, chosen in (("splits", splits), ("val_splits", val_splits)):
        for split in chosen:
            if split not in known:
                raise ConfigError(f"data.{name}: {split!r} is not one of {list(known)}")
    if not splits:
        raise ConfigError("data.splits: need at least one training split")
    shared = sorted(set(splits) & set(val_splits))
    if shared:
        raise ConfigError(f"data.val_splits: {shared} are training splits too; validation prompts must be held out")


def limit_rows(frame: pd.DataFrame, limit: int, how: str, seed: int, key: str) -> pd.DataFrame:
    """At most `limit` rows (0 = all): a seeded random sample (``random``, MENLO's "randomly sample 3,000 prompts")
    or the first ones (``head``). The sample ranks rows by a hash of (seed, row[key]), so it does not depend on the
    file's order and adding rows to the file moves few of the chosen ones; the kept rows keep their file order."""
    if not limit or len(frame) <= limit:
        return frame
    if how == "head":
        return frame.head(limit)
    ranks = frame[key].map(lambda value: hashlib.sha256(f"{seed}|{value}".encode()).hexdigest())
    return frame.loc[ranks.sort_values(kind="stable").index[:limit].sort_values()]


def stage_rows(store: RunStore, key: object, build: Callable[[], pd.DataFrame]) -> StageResult:
    """The prompts, as built by `build` (a frame with at least id, prompt_messages and role: train | val)."""
    def produce(out_dir: str) -> dict:
        frame = build()
        write_table(pa.Table.from_pandas(frame, preserve_index=False), out_dir)
        summary = {"rows": len(frame), "train_rows": int((frame["role"] == "train").sum()),
                   "val_rows": int((frame["role"] == "val").sum())}
        for column in ("dimension", "locale"):
            if column in frame:
                summary[f"{column}s"] = int(frame[column].nunique())
        return summary

    return store.run_stage("rows", key, produce)


def stage_train(store: RunStore, grpo: GRPOConfig, wandb_cfg: WandbConfig, key: object,
                reward: Callable[[], AbstractContextManager[tuple[dict, dict[str, str]]]]) -> StageResult:
    """GRPO on the `rows` stage. `reward()` is entered only when the stage really runs and yields the reward spec
    and the secret worker environment (policy_grpo starts the Serve GRM there and stops it on exit)."""
    def produce(out_dir: str) -> dict:
        from train.grpo.trainer import run_grpo

        rows = store.read_stage("rows").to_pylist()
        train_rows = [r for r in rows if r["role"] == "train"]
        val_rows = [r for r in rows if r["role"] == "val"]
        # the job run's W&B project, entity, tags, group and (resolved) mode; the key reaches the workers by name
        trainer = dataclasses.replace(grpo, run_name=f"grpo-{store.job}",
                                      **trainer_tracking(wandb_cfg, store.job, store.run_id))
        started = time.time()
        alerts_path = f"{out_dir}/run/monitor_alerts.jsonl"
        with reward() as (spec, secret_env):
            if spec.get("monitor") and "://" not in out_dir:  # rank 0 appends each crossed threshold there
                spec = {**spec, "monitor": {**spec["monitor"], "alerts_path": alerts_path}}
            # W&B writes where the run ends up: the stage's own folder is renamed when it completes
            result = run_grpo(trainer, train_rows, spec, run_dir=f"{out_dir}/run", secret_env=secret_env,
                              val_rows=val_rows, wandb_dir=store.path)
        seconds = time.time() - started
        metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
        write_table(pa.Table.from_pylist([metrics]), out_dir)
        return {"steps": metrics.get("step"), "reward_mean": _finite(metrics.get("reward/mean")),
                "groups_failed": metrics.get("reward/groups_failed"), "seconds": round(seconds, 3),
                "actor_seconds": round(seconds * trainer.num_workers, 3),
                "val_reward_mean": _finite(metrics.get("val/reward/mean")),
                "val_vs_baseline_score": _finite(metrics.get("val/vs_baseline/score")),
                "prompt_rows_truncated": metrics.get("prompt/rows_truncated"),
                "best_step": result.best.get("step"), "best_score_key": result.best.get("score_key"),
                "best_score": result.best.get("score"), "best_adapter": result.best_adapter_dir or result.best_model_dir,
                "worker_nodes": result.metrics.get("worker_nodes", []),
                # the reward-hacking monitors' last values and every alert they raised (train.grpo.monitoring)
                **({"monitor": {k: v for k, v in metrics.items() if k.startswith("monitor/")},
                    "monitor_alerts": read_alerts(alerts_path)} if spec.get("monitor") else {})}

    return store.run_stage("train", key, produce)


def adapter_dir(store: RunStore) -> str:
    return f"{store.stage_path('train')}/run/adapter"


def best_adapter_dir(store: RunStore) -> str:
    return f"{store.stage_path('train')}/run/best_adapter"


def report(store: RunStore, tracker: Tracker, results: list[StageResult], title: str) -> pd.DataFrame:
    """summary.md (final step metrics + stage costs), W&B summary and table; returns the metrics table."""
    record_stages(results, tracker)
    # not read_stage: the stage folder also holds the Ray Train run (adapter, checkpoints), which is no Parquet
    final = pq.read_table(f"{store.stage_path('train')}/part-00000.parquet", filesystem=store.fs).to_pylist()[0]
    table = pd.DataFrame([{"metric": k, "value": final[k]} for k in SUMMARY_KEYS if k in final]
                         + [{"metric": k, "value": v} for k, v in sorted(final.items())
                            if k.startswith(("reward/", "reward_service/errors/", "val/")) and k not in SUMMARY_KEYS])
    stages = pd.DataFrame([{"stage": r.name, "skipped": r.skipped, "rows": r.rows, "seconds": round(r.seconds, 1)}
                           for r in results])
    train = next((r.summary for r in results if r.name == "train"), {})
    best = (f"Best adapter by {train['best_score_key']}: `{best_adapter_dir(store)}` (step {train['best_step']}, "
            f"{train['best_score']:.4g})\n\n" if train.get("best_step") is not None else "")
    markdown = (f"# {title}\n\nAdapter (last step): `{adapter_dir(store)}`\n\n{best}"
                "## Final step (reduced over workers)\n\n"
                f"{table.to_markdown(index=False, floatfmt='.4g')}\n\n"
                f"## Stages\n\n{stages.to_markdown(index=False)}\n")
    store.write_text("summary.md", markdown)
    print("\n" + markdown)
    tracker.table("final_metrics", table)
    return table


def file_sha(path: str) -> str:
    """Content hash of an input file: edited data re-runs the stages that read it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
