"""CRAFT planner self-training (paper 002 §5.1.2, Algorithm 1): SFT, then rounds of sampled actions -> Eq. 1 scores ->
best/worst pairs -> SimPO + NLL (CPO-SimPO) on Ray Train + DeepSpeed with LoRA, until the dev score stops improving.

Local (SmolLM2-135M planner and reviser on CPU; a few short texts, one round of a few steps):

    quorum run configs/craft_selftrain_demo.yaml
    python -m jobs.craft.selftrain configs/craft_selftrain_demo.yaml rounds.max_rounds=2 run.id=two

On a cluster (the paper's scale: configs/craft_selftrain_cluster.yaml documents models and GPUs):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \\
        quorum run configs/craft_selftrain_demo.yaml run.root=/shared/runs planner.engine.kind=vllm \\
        rounds.trainer.use_gpu=true sft.trainer.use_gpu=true

Stages (under <run.root>/craft_selftrain/<run-id>/): instances -> sft_data -> sft -> dev_0 -> r1_candidates ->
r1_pairs -> r1_train -> r1_dev -> r2_... Each round's adapter is `<stage>/run/adapter` of its `r<r>_train` stage
and its dev score is in the manifest (`stages.r<r>_dev.summary.dev_score`, and `rounds` at the top level);
`rounds.md` tabulates them. Running the same config again reuses every finished stage (no retraining).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from actors.engines.base import EngineSpec
from actors.stage_config import PoolConfig
from core.config import ConfigError, Section, dotted, fail, in_range, one_of, positive, require_file
from core.corpora import hint_suffix
from core.jobrun import JobSections, open_run, record_stages
from core.ray_env import init_ray
from core.tracking import trainer_tracking
from eval.craft.agent import AgentConfig
from eval.craft.quality import QualityConfig
from eval.craft.selftrain import ScoreWeights, stop_decision
from eval.prompts import load_template, prompt_path
from jobs.craft.revise import check_two_engines
from jobs.craft.selftrain_stages import (
    adapter_of,
    stage_candidates,
    stage_dev,
    stage_instances,
    stage_pairs,
    stage_sft_data,
    stage_train,
)
from jobs.entry import entry
from train.config import LoraSection, TrainConfig
from train.config_sections import PreferenceLossConfig

log = logging.getLogger("quorum.craft_selftrain")
JOB = "craft_selftrain"


@dataclass
class DataConfig(Section):
    # D_r: raw texts to constrain. The paper draws 2k CNN/DailyMail texts of 350-1,000 words per round.
    # format "cord": CORD files (level 0 only by default, so the C1-C4 test rows stay unseen; C0 is itself the
    # paper's Table 4 test domain: docs/papers/002-craft.md, Deviations); format "text": plain .txt files or
    # {text|article} JSONL (eval.craft.instances.read_raw_texts), e.g. CNN/DailyMail stories
    path: str = "../shared/data/cord"
    format: str = "cord"  # cord (CORD constraint files) | text (plain .txt files or {text|article} JSONL)
    # CORD levels read when format is cord (0-4; default [0], so the C1-C4 test rows stay unseen)
    levels: list[int] = field(default_factory=lambda: [0])
    # the paper's length filter (whitespace words; 0 = no bound); texts outside it are skipped and counted
    min_words: int = 350
    max_words: int = 1000  # upper bound of the length filter in whitespace words (paper 1,000); 0 = no bound
    # keep the first N sentences of each text (0 = all): a CPU demo cannot revise 600-word texts
    max_sentences: int = 0
    # texts sampled from the pool per round (paper 2,000) and held out as the fixed dev set
    train_texts: int = 2000
    dev_texts: int = 10  # texts held out as the fixed dev set (>= 1)
    # M ~ U{0..max_constraints} per instance (paper: C0-C3 in training)
    max_constraints: int = 3
    # count bounds leave slack x the reference count of room, rounded outward to round_to (CORD: multiples of 20)
    slack: float = 0.1
    round_to: int = 20  # count bounds are rounded outward to a multiple of this (CORD: 20)
    seed: int = 0  # seeds the dev/pool split, the dev constraints and each round's text sample and constraints

    def check(self, where: str = "") -> None:
        if not Path(self.path).exists():
            fail(dotted(where, "path"), f"{self.path!r} does not exist{hint_suffix(self.path)}")
        one_of(self.format, ("cord", "text"), dotted(where, "format"))
        if self.max_words and self.max_words < self.min_words:
            fail(dotted(where, "max_words"), f"{self.max_words} is below min_words {self.min_words}")
        if not self.levels or any(lv not in range(5) for lv in self.levels):
            fail(dotted(where, "levels"), f"expected CORD levels among 0-4, got {self.levels}")
        for name in ("train_texts", "dev_texts", "round_to"):
            positive(getattr(self, name), dotted(where, name))
        in_range(self.max_constraints, 0, 4, dotted(where, "max_constraints"))
        in_range(self.slack, 0, 1, dotted(where, "slack"))


@dataclass
class SftConfig(Section):
    # run the SFT stage first and start round 1 from its adapter; false = rounds start from the base model
    enabled: bool = True
    # oracle: one demo step per instance built from its predefined calls (no GPT-4o teacher here);
    # jsonl: {prompt_messages, target} rows from `path` (e.g. steps of agent runs)
    source: str = "oracle"
    path: str = ""  # JSONL of {prompt_messages, target} rows for source jsonl (required then)
    # the LoRA of App. D.6 / the authors' yaml: r 16, alpha 16, dropout 0.05 on q/k/v/o
    trainer: TrainConfig = field(default_factory=lambda: TrainConfig(
        loss="sft", lr=1e-4, lora=LoraSection(r=16, alpha=16, dropout=0.05), run_name="craft-sft"))

    def check(self, where: str = "") -> None:
        one_of(self.source, ("oracle", "jsonl"), dotted(where, "source"))
        # an empty path with source jsonl loads (the cluster config ships without one) and is refused when the job
        # starts, before any work (`require_sft_path`)
        if self.source == "jsonl" and self.path:
            require_file(self.path, dotted(where, "path"))
        if self.trainer.loss != "sft":
            fail(dotted(where, "trainer.loss"), f"SFT trains with 'sft', got {self.trainer.loss!r}")


@dataclass
class PlannerConfig(Section):
    # the base model; the job sets `adapter` to each round's LoRA
    engine: EngineSpec = field(default_factory=EngineSpec)
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(batch_size=4))

    def check(self, where: str = "") -> None:
        if self.engine.adapter:
            fail(dotted(where, "engine.adapter"), "the job sets the planner's adapter (SFT, then each round's); "
                 "leave it empty")


@dataclass
class RoundsConfig(Section):
    # Algorithm 1 "while pi_p keeps improving"; the paper shows 4 iterations
    max_rounds: int = 4
    # candidate actions per state (paper: "multiple", number not given; MCTS width 3) and their temperature (the
    # authors' code: 0.7)
    k: int = 4
    temperature: float = 0.7  # sampling temperature of the k candidate actions, in (0, 2] (the authors' code: 0.7)
    # H_i: i ~ U{0..max_history_steps} planner steps before the sampled one (paper: at most 5 steps in all)
    max_history_steps: int = 4
    # a state whose best and worst S_a differ by this or less gives no pair (the paper is silent on ties); -1 pairs
    # tied candidates too (not for training a planner: tests/test_craft_selftrain_job.py uses it to get pairs from
    # any CPU's numbers)
    min_margin: float = 0.0
    # stop after `patience` rounds without a dev-score gain above `min_delta` (paper: "no further measurable
    # improvement", no rule)
    patience: int = 1
    min_delta: float = 0.0  # a dev-score gain must exceed this to count as an improvement
    # what the stop rule and the best round read: mean S_a of greedy dev actions, or its tool-F1 part alone (the
    # quantity of the paper's Fig. 8, right), or its constraint accuracy
    dev_metric: str = "dev_score"
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # Eq. 2: SimPO (beta 2.5, gamma 1.375, Meng et al.'s Llama-3-8B-Instruct values) + NLL on w (weight 1)
    trainer: TrainConfig = field(default_factory=lambda: TrainConfig(
        loss="cpo_simpo", loss_config=PreferenceLossConfig(beta=2.5, simpo_gamma=1.375, cpo_alpha=1.0),
        lr=1e-6, scheduler="cosine", warmup_ratio=0.1, lora=LoraSection(r=16, alpha=16, dropout=0.05),
        micro_batch_size=1, grad_accum=8, run_name="craft-round"))

    def check(self, where: str = "") -> None:
        for name in ("max_rounds", "patience"):
            positive(getattr(self, name), dotted(where, name))
        if self.k < 2:
            fail(dotted(where, "k"), f"best/worst pairs need at least 2 candidates, got {self.k}")
        in_range(self.temperature, 0, 2, dotted(where, "temperature"), low_open=True)
        one_of(self.dev_metric, ("dev_score", "dev_tool_f1", "dev_accuracy"), dotted(where, "dev_metric"))
        if self.trainer.loss == "sft":
            fail(dotted(where, "trainer.loss"), "rounds train on preference pairs; use cpo_simpo (Eq. 2)")


@dataclass
class Config(JobSections):
    # D_r: the raw texts, their length filter, the dev set and the constraints sampled on them
    data: DataConfig = field(default_factory=DataConfig)
    sft: SftConfig = field(default_factory=SftConfig)  # the SFT warm start of the planner before the rounds
    # the planner being trained: its base engine and actor pool
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    # the vanilla reviser of footnote 2 (no adapter)
    reviser: EngineSpec = field(default_factory=EngineSpec)
    agent: AgentConfig = field(default_factory=AgentConfig)
    # S_r of Eq. 1: App. D.3 (normalised PPL and BARTScore; SOME not built) or the difflib proxy
    quality: QualityConfig = field(default_factory=QualityConfig)
    # the self-training rounds: candidates, scored pairs, the preference trainer and the stop rule
    rounds: RoundsConfig = field(default_factory=RoundsConfig)

    def validate(self) -> None:
        self.run.require_local("(each round's adapter is the next round's planner)")
        # the planner always carries an adapter (SFT, then each round's), so it never shares the reviser's engine
        check_two_engines(dataclasses.replace(self.planner.engine, adapter="(each round's)"), self.reviser, "planner.engine",
                          "reviser")
        for key, trainer in (("sft.trainer", self.sft.trainer), ("rounds.trainer", self.rounds.trainer)):
            if trainer.model != self.planner.engine.model:
                raise ConfigError(f"{key}.model: {trainer.model!r} differs from planner.engine.model "
                                  f"{self.planner.engine.model!r} (the adapter is trained on the planner)")
        if self.sft.enabled and self.sft.trainer.lora != self.rounds.trainer.lora:
            raise ConfigError("rounds.trainer.lora: round 1 continues the SFT adapter, so it must equal "
                              f"sft.trainer.lora ({self.sft.trainer.lora} vs {self.rounds.trainer.lora})")


def planner_messages(cfg: Config):
    template = load_template(prompt_path(cfg.agent.planner_prompt))
    return lambda instruction, text: template.render(examples="", instruction=instruction, text=text)


def _trainer(trainer: TrainConfig, cfg: Config, run_name: str, run_id: str, init_adapter: str = "") -> TrainConfig:
    return dataclasses.replace(trainer, run_name=run_name, init_adapter=init_adapter,
                               **trainer_tracking(cfg.wandb, JOB, run_id))


def require_sft_path(sft: SftConfig) -> None:
    """SFT on trajectories needs their file: refused before any work (exit 2), naming ``sft.path``."""
    if sft.enabled and sft.source == "jsonl" and not sft.path:
        raise ConfigError("sft.path: source 'jsonl' needs a file of {prompt_messages, target} rows (the GPT-4o "
                          "trajectories D_s); pass sft.path=...")


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    require_sft_path(cfg.sft)
    run = open_run(JOB, cfg, config_path)
    store, tracker = run.store, run.start_tracking(JOB, cfg.wandb)
    results = [stage_instances(store, cfg.data)]
    init_ray(cfg.ray)
    adapter = ""
    if cfg.sft.enabled:
        results.append(stage_sft_data(store, cfg, planner_messages(cfg)))
        rows = store.read_stage("sft_data").to_pylist()
        results.append(stage_train(store, "sft", _trainer(cfg.sft.trainer, cfg, "craft-sft", store.run_id), rows,
                                   {"where": "sft.trainer"}, store.path))
        adapter = adapter_of(store, "sft")
    dev = stage_dev(store, cfg, 0, adapter, run.cache_dir)
    results.append(dev)
    rounds = [{"round": 0, "adapter": adapter, "pairs": None, **_dev_numbers(dev.summary)}]
    stop_reason = "max_rounds"
    for r in range(1, cfg.rounds.max_rounds + 1):
        results.append(stage_candidates(store, cfg, r, adapter, run.cache_dir))
        results.append(stage_pairs(store, cfg, r))
        pairs = [{k: row[k] for k in ("prompt_messages", "chosen", "rejected")}
                 for row in store.read_stage(f"r{r}_pairs").to_pylist()]
        trainer = _trainer(cfg.rounds.trainer, cfg, f"craft-r{r}", store.run_id, init_adapter=adapter)
        if len(pairs) < trainer.global_batch_size:
            # no honest way to train on fewer pairs than one batch: the round ends the run, said so in the manifest
            stop_reason = f"round {r}: {len(pairs)} pairs, fewer than one global batch ({trainer.global_batch_size})"
            log.warning("stopping: %s", stop_reason)
            break
        results.append(stage_train(store, f"r{r}_train", trainer, pairs, {"where": "rounds.trainer", "round": r},
                                   store.path))
        adapter = adapter_of(store, f"r{r}_train")
        dev = stage_dev(store, cfg, r, adapter, run.cache_dir)
        results.append(dev)
        rounds.append({"round": r, "adapter": adapter, "pairs": len(pairs), **_dev_numbers(dev.summary)})
        decision = stop_decision([x[cfg.rounds.dev_metric] for x in rounds], cfg.rounds.patience, cfg.rounds.min_delta)
        if decision.stop:
            stop_reason = decision.reason
            break
    best = stop_decision([x[cfg.rounds.dev_metric] for x in rounds], cfg.rounds.patience,
                         cfg.rounds.min_delta).best_round
    table = pd.DataFrame(rounds)
    store.write_text("rounds.md", "# CRAFT planner self-training (paper 002, Algorithm 1)\n\n"
                     + table.to_markdown(index=False, floatfmt=".2f") + f"\n\nStop: {stop_reason}. Best planner: "
                     f"round {best} (`{rounds[best]['adapter'] or 'base model'}`).\n")
    record_stages(results, tracker)
    store.finish({"rounds": rounds, "best_round": best, "best_adapter": rounds[best]["adapter"],
                  "stop_reason": stop_reason})
    tracker.finish()
    return table


def _dev_numbers(summary: dict) -> dict:
    return {k: summary.get(k) for k in ("dev_score", "dev_tool_f1", "dev_accuracy", "dev_quality", "dev_rows")}


if __name__ == "__main__":
    entry("jobs.craft.selftrain")
