"""The stages of paper 000 after the jury: pairs -> train -> evaluation set -> eval generation -> re-judge.

Each `stage_*` function runs one `RunStore` stage (skipped when its output exists with the same chained config
hash) and returns its `StageResult`. The job module (`jobs/policy/simplify.py`) holds the config and calls them
in order; the pure pieces live in `train/preference/pairs.py` and `eval/results.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import pyarrow as pa

from actors.corpus import read_corpus, read_standard
from actors.engines.base import EngineSpec
from actors.jury import JudgeConfig, JuryConfig
from actors.stage_config import ModelConfig, PoolConfig, SamplingConfig
from core.config import ConfigError, Section, dotted, fail, in_range, one_of, positive
from core.corpora import hint_suffix
from core.errors import CorpusError
from core.files import json_object, read_utf8
from core.runstore import RunStore, StageResult, write_table
from core.text import is_blank
from core.tracking import WandbConfig, trainer_tracking
from train.config import TrainConfig
from train.preference.pairs import build_pairs, judge_disagreement, preference_distribution, subsample

# policy -> how the demo references file names that policy's references
REFERENCE_POLICY = {"lexical": "lexical-paraphrasing", "overall": "overall-rewriting"}


@dataclass
class PairsConfig(Section):
    dev_fraction: float = 0.125  # share [0, 1) of sources held out as the dev split (a hash of the source id and seed)
    seed: int = 0  # seed of the train/dev split of the sources
    # policy -> prompt the model is trained and evaluated with (paper 000: the system instruction only)
    prompts: dict[str, str] = field(default_factory=lambda: {
        "lexical": "simplify_lexical_zeroshot", "overall": "simplify_overall_zeroshot"})

    def check(self, where: str = "") -> None:
        in_range(self.dev_fraction, 0, 1, dotted(where, "dev_fraction"), high_open=True)


@dataclass
class TrainStageConfig(Section):
    enabled: bool = True  # train an adapter on the pairs (or references); false = no training stage
    # which policy's pairs train the adapter (one adapter per run; run the job once per policy)
    policy: str = "lexical"
    # the trainer's own config (model, loss, LoRA, DeepSpeed, workers, steps, ...); see train/trainer.py
    trainer: TrainConfig = field(default_factory=TrainConfig)
    # what trainer.loss=sft learns: "pairs" = the chosen candidates (paper 000's SFT_Think), "references" = the
    # sources' human references (its Parallel baseline; no generation or judging then). Preference losses: pairs.
    targets: str = "pairs"
    # Parallel: references per source (paper 000: 1, which one unstated; we take the first); 0 = all
    references_per_source: int = 1
    # train on a seeded random subset of this many training rows (paper 000 Fig. 3: 1k-7k of 8k pairs, one run per
    # size); 0 = all. More than the pairs stage made is an error, never a silent "all"
    max_rows: int = 0
    subsample_seed: int = 0  # seed of the max_rows subset

    def check(self, where: str = "") -> None:
        # references_per_source, max_rows >= 0: check_tree's floor
        one_of(self.targets, ("pairs", "references"), dotted(where, "targets"))
        if self.targets == "references" and self.trainer.loss != "sft":
            fail(dotted(where, "targets"), f"'references' trains on references alone, which needs "
                 f"{dotted(where, 'trainer.loss')}=sft (got {self.trainer.loss!r})")


@dataclass
class EvalConfig(Section):
    enabled: bool = True  # evaluate the vanilla and trained models on the reference set
    # turkcorpus | asset | jsonl (jsonl: rows with id and references; sources come from `sources_path`)
    format: str = "turkcorpus"
    path: str = "../shared/data/turkcorpus"  # the TurkCorpus / ASSET directory, or the jsonl references file
    # the TurkCorpus / ASSET split read: <split>.8turkers.tok.norm (turkcorpus) or asset.<split>.orig (asset)
    split: str = "tune"
    offset: int = 0  # evaluation sources to skip first
    limit: int = 100  # evaluation sources to keep after the offset (0 = all)
    # used when `path` does not exist or is an empty directory (no corpus got yet): self-written demo references
    fallback_path: str = "configs/data/demo_references.jsonl"
    # sources of the fallback references, used with fallback_path
    fallback_sources: str = "configs/data/demo_corpus.jsonl"
    # how the vanilla and trained models decode (paper 000: greedy)
    engine: EngineSpec = field(default_factory=EngineSpec)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_tokens=96))
    pool: PoolConfig = field(default_factory=PoolConfig)
    # more systems to compare: name -> LoRA adapter directory (e.g. an SFT baseline trained elsewhere)
    extra_adapters: dict[str, str] = field(default_factory=dict)
    # baselines with an engine of their own, each decoding with the policy's prompt, e.g. paper 000's GPT-4o row
    # through `kind: openai` (configs/policy_lexical_cluster.yaml)
    extra_systems: list[ModelConfig] = field(default_factory=list)
    n_boot: int = 1000  # bootstrap resamples of sources per confidence interval (>= 1)
    # the jury judges trained vs vanilla outputs pairwise (both orders); empty = no re-judge
    rejudge: list[JudgeConfig] = field(default_factory=list)
    # re-judge only the first N evaluation sources (0 = all): pairwise judging costs two calls per source
    rejudge_limit: int = 0
    # a source whose two outputs are the same text: a tie without asking the judge ("tie"), or judged ("judge")
    rejudge_identical: Literal["tie", "judge"] = "tie"
    # LENS (paper 000 Fig. 2, the overall policy on ASSET) per system, from a local checkpoint: `lens_checkpoint` or
    # QUORUM_LENS_PATH, with the `lens-metric` package installed (not a dependency: it pins its own torch). Off by
    # default because neither can be had here; on, a missing one stops the run at config time
    lens: bool = False
    lens_checkpoint: str = ""  # local LENS checkpoint directory; "" = QUORUM_LENS_PATH

    def check(self, where: str = "") -> None:
        # the evaluation files are checked by the job, only for runs that reach evaluation (`check_data`)
        one_of(self.format, ("turkcorpus", "asset", "jsonl"), dotted(where, "format"))
        positive(self.n_boot, dotted(where, "n_boot"))
        one_of(self.rejudge_identical, ("tie", "judge"), dotted(where, "rejudge_identical"))
        for i, judge in enumerate(self.rejudge):
            if judge.format != "pairwise":
                fail(dotted(where, f"rejudge.{i}.format"), "re-judging compares two systems, use 'pairwise'")
        for name, path in self.extra_adapters.items():
            if not (Path(path) / "adapter_config.json").is_file():
                fail(dotted(where, f"extra_adapters.{name}"), f"{path!r} is not a peft adapter directory")
        if self.lens:
            from eval.metrics.lens import MetricUnavailable, load_metric

            try:
                load_metric("lens", self.lens_checkpoint or None)
            except MetricUnavailable as exc:
                fail(dotted(where, "lens"), str(exc))
        names = ["vanilla", "trained", *self.extra_adapters, *(m.name for m in self.extra_systems)]
        taken = sorted({n for n in names if names.count(n) > 1})
        if taken:
            fail(dotted(where, "extra_systems / extra_adapters"), f"system names {taken} are used twice (vanilla and "
                 "trained are taken)")


    def data_found(self) -> bool:
        """Whether `path` is there with something in it: a missing path and an empty directory (a corpus not got
        yet) are not found; only the default path may be so (`check_data`), and then the demo references stand in."""
        path = Path(self.path)
        return path.exists() and not (path.is_dir() and not any(path.iterdir()))

    def check_data(self) -> None:
        """The evaluation files exist now, not after training. Only the default `path` may be missing or empty (no
        ../shared beside the checkout): the demo references stand in, and the eval_set stage says so. A directory
        holding part of the split's files (an incomplete copy) stops the run, naming the files and the command that
        gets the corpus."""
        if not self.data_found():
            state = "is an empty directory" if Path(self.path).is_dir() else "does not exist"
            if self.path != EvalConfig.path:
                raise ConfigError(f"evaluate.path: {self.path!r} {state}{hint_suffix(self.path)}")
            for key in ("fallback_path", "fallback_sources"):
                if not Path(getattr(self, key)).is_file():
                    raise ConfigError(f"evaluate.{key}: file not found: {getattr(self, key)} (and evaluate.path "
                                      f"{self.path!r} {state})")
            return
        stems = {"turkcorpus": (f"{self.split}.8turkers.tok.norm", f"{self.split}.8turkers.tok.turk.", 8),
                 "asset": (f"asset.{self.split}.orig", f"asset.{self.split}.simp.", 10)}
        if self.format in stems:
            source, refs, n = stems[self.format]
            wanted = [source, *(f"{refs}{k}" for k in range(n))]
            missing = [name for name in wanted if not (Path(self.path) / name).is_file()]
            if missing:
                shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                raise ConfigError(f"evaluate.split: {self.path} lacks {len(missing)} of the {len(wanted)} files "
                                  f"split {self.split!r} reads (evaluate.format={self.format}): {shown}; an "
                                  f"incomplete copy?{hint_suffix(self.path)}")
        if self.format == "jsonl" and not Path(self.path).is_file():
            raise ConfigError(f"evaluate.path: {self.path!r} is not a JSONL file")


# ---------------------------------------------------------------------------------------------------------------
# Pairs


def stage_pairs(store: RunStore, cfg: PairsConfig, verdicts: str = "jury") -> StageResult:
    """Pairs from the best/worst rows of stage `verdicts` ("jury", or "select" for a scalar scorer)."""
    def produce(out_dir: str) -> dict:
        judgments = store.read_stage(verdicts).to_pandas()
        pairs, status = build_pairs(judgments, cfg.prompts, cfg.dev_fraction, cfg.seed)
        write_table(pa.Table.from_pandas(pairs, preserve_index=False), out_dir)
        store.write_text("pairs_status.csv", status.to_csv(index=False))
        store.write_text("preference_distribution.md",
                         preference_distribution(pairs).to_markdown(index=False, floatfmt=".1f") + "\n")
        if judgments["judge"].nunique() > 1:  # e.g. one judge with thinking on and off: paper 000 §4.2
            store.write_text("judge_agreement.md",
                             judge_disagreement(judgments).to_markdown(index=False, floatfmt=".3f") + "\n")
        counts = status["status"].value_counts().to_dict() if len(status) else {}
        return {"rows_out": len(pairs), "train": int((pairs["split"] == "train").sum()),
                "dev": int((pairs["split"] == "dev").sum()), **{f"sources_{k}": int(v) for k, v in counts.items()},
                "invalid_votes": int(status["n_invalid"].sum()) if len(status) else 0}

    return store.run_stage("pairs", {**dataclasses.asdict(cfg), "verdicts": verdicts}, produce)


# ---------------------------------------------------------------------------------------------------------------
# Training


def training_rows(rows: pd.DataFrame, policy: str, split: str) -> list[dict]:
    """Trainer rows of one policy and split: `{prompt_messages, chosen, rejected}` from pairs, or
    `{prompt_messages, target}` from SFT rows (the `sft_data` stage)."""
    mine = rows[(rows["policy"] == policy) & (rows["split"] == split)]
    if "target" in mine:
        return [{"prompt_messages": p, "target": t} for p, t in zip(mine["prompt"], mine["target"])]
    return [{"prompt_messages": p, "chosen": c, "rejected": r}
            for p, c, r in zip(mine["prompt"], mine["chosen"], mine["rejected"])]


def stage_train(store: RunStore, cfg: TrainStageConfig, wandb_cfg: WandbConfig) -> StageResult:
    """LoRA training on the pairs, or on the `sft_data` stage's rows when the loss is SFT."""
    data_stage = "sft_data" if cfg.trainer.loss == "sft" else "pairs"

    def produce(out_dir: str) -> dict:
        from train.preference.trainer import train_stage

        pairs = store.read_stage(data_stage).to_pandas()
        train_rows, dev_rows = training_rows(pairs, cfg.policy, "train"), training_rows(pairs, cfg.policy, "dev")
        available = len(train_rows)
        try:
            train_rows = subsample(train_rows, cfg.max_rows, cfg.subsample_seed)
        except ValueError as exc:
            raise ConfigError(f"train.max_rows: {exc} for policy {cfg.policy!r}") from None
        # the job run's W&B project, entity, tags, group and (resolved) mode; the key reaches the workers by name
        trainer = dataclasses.replace(cfg.trainer, run_name=f"train-{cfg.policy}",
                                      **trainer_tracking(wandb_cfg, store.job, store.run_id))
        summary = train_stage(trainer, train_rows, dev_rows, out_dir=out_dir, wandb_dir=store.path,
                              where="train.trainer", extra={"policy": cfg.policy})
        return {"data": data_stage, "train_pairs": summary.pop("train_rows"), "train_pairs_available": available,
                "dev_pairs": summary.pop("eval_rows"), **summary}

    key = {**dataclasses.asdict(cfg), "wandb": wandb_cfg.on}
    return store.run_stage("train", key, produce)


def adapter_dir(store: RunStore) -> str:
    return f"{store.stage_path('train')}/run/adapter"


# ---------------------------------------------------------------------------------------------------------------
# Evaluation set and systems


def load_eval_set(cfg: EvalConfig, policy: str) -> pd.DataFrame:
    """id, source, references of the evaluation sentences (the fallback demo set when `path` is missing)."""
    window = {"offset": cfg.offset, "limit": cfg.limit or None}
    if not cfg.data_found():
        frame = demo_eval_set(cfg.fallback_path, cfg.fallback_sources, policy)
        return frame.iloc[cfg.offset : cfg.offset + cfg.limit if cfg.limit else None].reset_index(drop=True)
    if cfg.format == "jsonl":  # rows with id, text and a list of references
        frame = read_corpus(cfg.path, fmt="jsonl", text_column="text", id_column="id", **window)
        if "references" not in frame:
            raise CorpusError(f"{cfg.path}: no 'references' column; columns are {list(frame.columns)}")
        return frame[["id", "source", "references"]]
    return read_standard(cfg.format, cfg.path, split=cfg.split, **window)[["id", "source", "references"]]


def demo_eval_set(refs_path: str, sources_path: str, policy: str) -> pd.DataFrame:
    """The demo corpus with its self-written references for `policy` (each reference is tagged with a policy)."""
    sources = read_corpus(sources_path, fmt="jsonl", text_column="text", id_column="id")
    text = dict(zip(sources["id"], sources["source"]))
    wanted = REFERENCE_POLICY.get(policy, policy)
    rows = []
    # "\n" only: str.splitlines would also split a JSON string at a raw U+2028 (valid JSON); "\r" is whitespace
    for lineno, line in enumerate(read_utf8(Path(refs_path), CorpusError).split("\n"), start=1):
        if not line.strip():
            continue
        record = json_object(line, f"{refs_path}: line {lineno}", CorpusError)
        refs, tags = record.get("references"), record.get("policies", [])
        if record.get("id") not in text:
            raise CorpusError(f"{refs_path}: line {lineno}: id {record.get('id')!r} is not in {sources_path}")
        if not isinstance(refs, list) or not refs or not isinstance(tags, list) or len(tags) != len(refs):
            raise CorpusError(f"{refs_path}: line {lineno}: needs 'references' and 'policies' lists of equal length")
        if not all(isinstance(r, str) and not is_blank(r) for r in refs):
            raise CorpusError(f"{refs_path}: line {lineno}: every reference must be a non-empty string, got {refs!r}")
        kept = [r for r, tag in zip(refs, tags) if tag == wanted]
        if not kept:
            raise CorpusError(f"{refs_path}: line {lineno}: no reference tagged {wanted!r}")
        rows.append({"id": record["id"], "source": text[record["id"]], "references": kept})
    return pd.DataFrame(rows, columns=["id", "source", "references"])


def eval_systems(cfg: EvalConfig, store: RunStore, trained: bool) -> list[ModelConfig]:
    """The vanilla model, the trained adapter (if the run trained one), any extra adapters and extra systems."""
    systems = [("vanilla", "")]
    if trained:
        systems.append(("trained", adapter_dir(store)))
    systems += sorted(cfg.extra_adapters.items())
    return [ModelConfig(name=name, engine=dataclasses.replace(cfg.engine, adapter=path), sampling=cfg.sampling,
                        pool=cfg.pool) for name, path in systems] + list(cfg.extra_systems)


def first_sources(batch: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
    """The rows of `batch` whose source id is in `ids` (the re-judged subset)."""
    return batch[batch["id"].isin(ids)]


def rejudge_config(cfg: EvalConfig, seed: int) -> JuryConfig:
    return JuryConfig(judges=cfg.rejudge, aggregate="majority", seed=seed, both_orders=True,
                      identical_pairs=cfg.rejudge_identical)


def stage_eval_set(store: RunStore, cfg: EvalConfig, policy: str) -> StageResult:
    def produce(out_dir: str) -> dict:
        frame = load_eval_set(cfg, policy)
        write_table(pa.Table.from_pandas(frame, preserve_index=False), out_dir)
        found = cfg.data_found()
        used = cfg.path if found else cfg.fallback_path
        summary = {"rows_out": len(frame), "data": used, "references_per_source": round(
            float(frame["references"].map(len).mean()), 2) if len(frame) else 0}
        if not found:
            # only the default path may be missing (EvalConfig.check_data); the scores are on the demo set
            summary["warning"] = f"evaluate.path {cfg.path} not found or empty: scored on the demo references {used}"
        return summary

    key = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("rejudge", "rejudge_limit", "rejudge_identical", "pool",
                                                                       "n_boot")}
    return store.run_stage("eval_set", {**key, "policy": policy,
                                        "found": cfg.data_found()}, produce)


# ---------------------------------------------------------------------------------------------------------------
# Results


def stage_results(store: RunStore, cfg: EvalConfig, seed: int) -> StageResult:
    def produce(out_dir: str) -> dict:
        table = build_results(store, cfg, seed)
        write_table(pa.Table.from_pandas(table, preserve_index=False), out_dir)
        return {"rows_out": len(table), "systems": list(table["system"])}

    return store.run_stage("results", {"n_boot": cfg.n_boot, "seed": seed}, produce)


def build_results(store: RunStore, cfg: EvalConfig, seed: int) -> pd.DataFrame:
    """SARI (+CI, paired gain over vanilla), BLEU, FKGL, compression per system; win rate vs vanilla if re-judged."""
    from eval.results import outcome_for, results_table, winrate_with_ci

    eval_set = store.read_stage("eval_set").to_pandas()
    outputs = store.read_stage("eval_generate").to_pandas()
    outputs = outputs.assign(system=outputs["model"], output=outputs["candidate"].fillna(""))
    references = {i: list(r) for i, r in zip(eval_set["id"], eval_set["references"])}
    table = results_table(outputs[["id", "system", "source", "output"]], references, "vanilla", cfg.n_boot, seed)
    if cfg.lens:
        from eval.metrics.lens import score_lens
        from eval.results import add_learned_metric

        lens = functools.partial(score_lens, model_path=cfg.lens_checkpoint or None)
        table = add_learned_metric(table, outputs[["id", "system", "source", "output"]], references, "lens", lens,
                                   cfg.n_boot, seed)
    if cfg.rejudge and store.manifest["stages"].get("rejudge", {}).get("status") == "complete":
        judged = store.read_stage("rejudge").to_pandas()
        for i, system in enumerate(table["system"]):
            if system == "vanilla":
                continue
            mine = judged[judged["model_a"].isin([system, "vanilla"]) & judged["model_b"].isin([system, "vanilla"])]
            outcomes = [outcome_for(w, a, b, system) for w, a, b in zip(mine["winner"], mine["model_a"],
                                                                        mine["model_b"])]
            stats = winrate_with_ci(outcomes, list(mine["id"]), cfg.n_boot, seed)
            for key in ("win_rate", "win_rate_lo", "win_rate_hi", "n_missing"):
                table.loc[i, "vs_vanilla_" + key] = stats[key]
    return table


def cost_table(manifest: dict) -> pd.DataFrame:
    """Seconds, tokens and actor-seconds per stage, from the manifest (the cost accounting of a run)."""
    rows = []
    for name, entry in manifest["stages"].items():
        summary = entry.get("summary", {})
        rows.append({"stage": name, "seconds": entry.get("seconds"), "rows": entry.get("rows"),
                     "prompt_tokens": summary.get("prompt_tokens", 0),
                     "completion_tokens": summary.get("completion_tokens", 0),
                     "actor_seconds": summary.get("actor_seconds", 0.0)})
    table = pd.DataFrame(rows)
    total = {"stage": "total", **{c: table[c].sum() for c in table.columns if c != "stage"}}
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)
