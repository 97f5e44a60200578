"""Judge training with GRPO (paper 003 §4): a pairwise MENLO judge learns to grade A/B responses like the gold.

Local (local Ray, SmolLM2-135M as the judge being trained, 2 Ray Train workers on CPU; the demo measured 9 min 2 s
for 3 steps and 2 validations on 2 cores shared with a training job, about half of each step sampling):

    quorum run configs/judge_grpo_demo.yaml
    python -m jobs.judge.grpo configs/judge_grpo_demo.yaml grpo.max_steps=2 run.id=short

On a cluster (the paper's settings: G = 8, 32 prompts per step, lr 1e-6, 4096-token prompts and answers):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \\
        quorum run configs/judge_grpo_cluster.yaml run.root=/shared/runs data.path=/shared/menlo/train.jsonl

Stages (under <run.root>/judge_grpo/<run-id>/, skipped when already complete):
rows (MENLO-format pairs -> one judge prompt per pair and shown order, rendered by `eval.judging.menlo_data.build_items`
with the same template and rubrics as the judge evaluation; gold grades follow the shown order) -> train (GRPO on
Ray Train + DeepSpeed + LoRA; reward = `train.grpo.reward.judge_training`, every term logged as ``reward/<term>``) -> summary.md.
The adapter (train/run/adapter) can be served as the GRM: `quorum serve configs/grm.yaml judge.adapter=...`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass, field

import pandas as pd

from actors.ray_capacity import ensure_all_fit
from core.config import ConfigError, require_file
from core.jobrun import JobSections, open_run
from core.ray_env import init_ray
from eval.judging.menlo_data import DIMENSIONS, Protocol, build_items, load_rubrics, read_menlo_jsonl
from eval.prompts import TemplateName
from jobs.entry import entry
from jobs.grpo_stages import (
    GRPOData,
    adapter_dir,
    file_sha,
    report,
    stage_rows,
    stage_train,
    train_val_rows,
    validate_grpo,
)
from train.config import GRPOConfig
from train.grpo.reward.judge_training import JudgeRewardConfig
from train.trainer import workers_ask

log = logging.getLogger("quorum.judge_grpo")
JOB = "judge_grpo"


@dataclass
class DataConfig(GRPOData):
    """MENLO pairs (rows = judge prompts); all four dimensions by default: the paper trains one multi-task judge."""

    # both A/B orders of every pair, gold grades swapped with them (paper 003 §3.1, after J1)
    both_orders: bool = True


@dataclass
class PromptConfig:
    """How a training pair becomes the judge's prompt: protocol, template, rubrics and the shown order."""

    # pairwise (paper 003's main judge) or pointwise (Table 19's pointwise RL: one response per prompt, rewarded on
    # its single grade; set template: menlo_pointwise)
    mode: str = "pairwise"
    # judge template with the variables of configs/prompts/menlo_pairwise.yaml (pointwise: menlo_pointwise.yaml)
    template: TemplateName = "menlo_pairwise"
    rubrics: str = "configs/data/menlo_rubrics.yaml"  # MENLO rubrics YAML (dimension -> question, criteria)
    # the dimension's graded rubric (true) or only the five labels (false: a much shorter prompt)
    rubric: bool = True
    # picks each pair's one shown order when data.both_orders is false
    seed: int = 0


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    reward: JudgeRewardConfig = field(default_factory=JudgeRewardConfig)
    # the judge's MENLO output opens with a <think> block: Qwen3's thinking mode (the configs repeat it)
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(thinking=True))

    def validate(self) -> None:
        # reward, wandb and grpo check themselves (core.config.check_tree); here: the data and prompt files
        self.validate_inputs()
        self.run.require_local()

    def validate_inputs(self) -> None:
        """The data and prompt sections (judge_sft shares them)."""
        self.data.validate_data()
        require_file(self.prompt.rubrics, "prompt.rubrics")
        for dim in self.data.dimensions:
            if dim not in DIMENSIONS:
                raise ConfigError(f"data.dimensions: {dim!r} is not one of {list(DIMENSIONS)}")
        if self.prompt.mode not in ("pairwise", "pointwise"):
            raise ConfigError(f"prompt.mode: {self.prompt.mode!r} is not 'pairwise' or 'pointwise'")
        self.protocol().check("prompt")

    def protocol(self) -> Protocol:
        return Protocol(name="grpo", mode=self.prompt.mode, rubric=self.prompt.rubric,
                        both_orders=self.data.both_orders, template=self.prompt.template)


def judge_rows(cfg: Config) -> pd.DataFrame:
    """Training rows (`role` train) and, with data.val_splits, validation rows (`role` val)."""
    return train_val_rows(cfg.data, functools.partial(judge_rows_of, cfg))


def judge_rows_of(cfg: Config, splits: list[str], limit: int) -> pd.DataFrame:
    """One row per judge prompt: the pair's messages in one shown order and the gold grades of the SHOWN A and B."""
    pairs = read_menlo_jsonl(cfg.data.path)
    pairs = pairs[pairs["split"].isin(splits)]
    if cfg.data.dimensions:
        pairs = pairs[pairs["dimension"].isin(cfg.data.dimensions)]
    pairs = pairs.head(limit or None).reset_index(drop=True)
    if pairs.empty:
        raise ConfigError(f"data: no pairs left in {cfg.data.path} for splits {splits} and dimensions "
                          f"{cfg.data.dimensions or 'all'}")
    items = build_items(pairs, pd.DataFrame(), [cfg.protocol()], load_rubrics(cfg.prompt.rubrics), cfg.prompt.seed)
    # pairwise units are shown orders (AB / BA: gold follows the shown A and B); pointwise units are the judged
    # response (a / b: its gold in gold_a, none in gold_b)
    second = items["unit"].isin(["BA", "b"])
    pointwise = cfg.prompt.mode == "pointwise"
    return pd.DataFrame({
        "id": items["item_id"], "pair_id": items["pair_id"], "order": items["unit"], "mode": cfg.prompt.mode,
        "dimension": items["dimension"], "locale": items["locale"], "prompt_messages": items["messages_json"],
        "gold_a": items["gold_b"].where(second, items["gold_a"]).astype(float),
        "gold_b": float("nan") if pointwise else items["gold_a"].where(second, items["gold_b"]).astype(float),
    })


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    # bad data fails before the run directory (and its manifest) exists
    validate_grpo(cfg.grpo, int((judge_rows(cfg)["role"] == "train").sum()))
    init_ray(cfg.ray)
    # the worker group fits the cluster (or its autoscaler's limits), before the run directory exists
    ensure_all_fit([workers_ask(cfg.grpo, "grpo")])
    run = open_run(JOB, cfg, config_path)
    store, tracker = run.store, run.start_tracking(JOB, cfg.wandb)
    rows_key = {"data": dataclasses.asdict(cfg.data), "prompt": dataclasses.asdict(cfg.prompt),
                "data_sha": file_sha(cfg.data.path), "rubrics_sha": file_sha(cfg.prompt.rubrics)}
    results = [stage_rows(store, rows_key, lambda: judge_rows(cfg))]
    validate_grpo(cfg.grpo, results[0].summary["train_rows"])
    spec = {"kind": "judge", "config": dataclasses.asdict(cfg.reward)}
    results.append(stage_train(store, cfg.grpo, cfg.wandb, {"grpo": dataclasses.asdict(cfg.grpo), "reward": spec},
                               lambda: contextlib.nullcontext((spec, {}))))
    table = report(store, tracker, results, "Judge GRPO (MENLO reward)")
    best = results[-1].summary.get("best_adapter")
    if cfg.grpo.finetune == "full":  # the 16-bit export (train/run/model; best_model on each new best)
        store.finish({"model": adapter_dir(store).removesuffix("adapter") + "model",
                      **({"best_model": best} if best else {})})
    else:
        store.finish({"adapter": adapter_dir(store), **({"best_adapter": best} if best else {})})
    tracker.finish()
    return table


if __name__ == "__main__":
    entry("jobs.judge.grpo")
