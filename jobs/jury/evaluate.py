"""Jury meta-evaluation (paper 001): SynthSimpliEval + human-rated sets -> LLM jury -> agreement report.

Local (embedded default: local Ray, SmolLM2-135M as writer, simplifiers and jury; measured 7 min 51 s on 2 CPU cores
shared with other work at load average ~5; the jury stage is ~75% of it, ~2.5 CPU-s of prompt prefill per judgment):

    quorum run configs/jury_eval_demo.yaml
    python -m jobs.jury.evaluate configs/jury_eval_demo.yaml synth.n=6 simpeval.limit=12 run.id=small

On a cluster (vLLM judges and simplifiers on GPUs, API judges through OpenAI-compatible endpoints):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \
        quorum run configs/jury_eval_cluster.yaml run.root=s3://bucket/runs

Stages (each a Parquet dataset under <run.root>/jury_eval/<run-id>/, skipped when already complete):
human (SimpEval + ASSET pairs; a malformed ratings file stops the run here, exit code 2) -> prompts (seeded
domain x noun pairs) -> complex (writer) -> simplify (every simplifier) -> pairs -> jury -> metrics -> scores
(one row per pair: every judge, the jury mean, the metrics, human scores) -> stats (every statistic with its
source-clustered bootstrap CI). Then report.md and report.html (tables + plots) are written and logged to W&B.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from actors.jury import JudgeConfig, JuryConfig
from actors.ratings import read_asset_ratings, read_simpeval
from actors.stage_config import LIGHT_CPU, ModelConfig, SamplingConfig, check_unique_names, engine_secrets
from core.config import ConfigError, positive, require_file
from core.jobrun import JobSections, open_run, record_stages
from core.ray_env import init_ray
from core.runstore import RunStore
from eval.judging import jury_meta as meta
from eval.judging import synth_bench as bench
from eval.prompts import TemplateName
from jobs.entry import entry
from jobs.frames import model_key, stage_frame, to_dataset
from jobs.jury.report import write_report

log = logging.getLogger("quorum.jury_eval")
JOB = "jury_eval"


@dataclass
class SimplifierConfig(ModelConfig):
    # parameter count in billions: the expected-trend check correlates scores with it (paper: 1, 3, 8, 70)
    size_b: float = 1.0
    # prompt template with exactly one variable, filled with the complex sentence
    template: TemplateName = "synth_simplify"


@dataclass
class SynthConfig:
    enabled: bool = True  # build and judge the SynthSimpliEval set (writer -> complex sentences -> every simplifier)
    # synthetic complex sentences (paper: 200)
    n: int = 12
    # seed of the (domain, noun) draw; stratified = domains spread evenly, uniform = any grid cell
    seed: int = 0
    # how (domain, noun) pairs are drawn: stratified (domains spread evenly) | uniform (any grid cell)
    strategy: Literal["stratified", "uniform"] = "stratified"
    # the knowledge domains, one per line (paper 001 App. D.1: 20), the prompt's {subject}
    domains_path: str = "configs/data/synth_domains.txt"
    # the concept nouns, one per line (paper 001 App. D.2: 739), the prompt's {seed_noun}
    nouns_path: str = "configs/data/synth_nouns.txt"
    template: TemplateName = "synth_complex"  # the writer's prompt template (variables subject, seed_noun)
    writer: ModelConfig = field(default_factory=lambda: ModelConfig(
        name="writer", sampling=SamplingConfig(temperature=0.7, max_tokens=64)))
    # the simplifier models of the expected-trend check (unique names), each with its size_b
    simplifiers: list[SimplifierConfig] = field(default_factory=lambda: [SimplifierConfig(name="simplifier")])
    # printed in the report next to the sizes (say here when `size_b` is a stand-in, not a parameter count)
    size_note: str = ""


@dataclass
class SimpEvalConfig:
    enabled: bool = True  # judge the SimpEval 2022 human-rated pairs (agreement with human scores)
    # the SimpEval 2022 CSV (system outputs with three 0-100 ratings each)
    path: str = "../shared/data/simpeval/simpeval_2022.csv"
    # first pairs in file order (0 = all 360)
    limit: int = 0
    # human score = mean of the 3 raw 0-100 ratings, or of the file's per-rater z-scores
    rating: Literal["raw", "zscore"] = "raw"


@dataclass
class AssetRatingsConfig:
    enabled: bool = True  # judge the ASSET human-rated pairs (agreement with human scores)
    path: str = "../shared/data/asset/human_ratings.csv"  # ASSET's human_ratings.csv
    # first (sentence, simplification) pairs in file order (0 = all 100)
    limit: int = 0


@dataclass
class ReportConfig:
    # automatic metrics per pair (eval.judging.jury_meta.PAIR_METRICS); bertscore is against the source
    metrics: list[str] = field(default_factory=lambda: ["fkgl", "compression_ratio", "levenshtein", "bertscore",
                                                        "sari", "bleu"])
    # bootstrap resamples (of source sentences) per confidence interval; 0 = no CIs
    n_boot: int = 1000
    seed: int = 0  # seed of the bootstrap resampling


@dataclass
class Config(JobSections):
    # synthSimpliEval: synthetic complex sentences, simplified by models of known sizes
    synth: SynthConfig = field(default_factory=SynthConfig)
    simpeval: SimpEvalConfig = field(default_factory=SimpEvalConfig)  # the SimpEval 2022 human ratings
    asset: AssetRatingsConfig = field(default_factory=AssetRatingsConfig)  # the ASSET human ratings
    jury: JuryConfig = field(default_factory=JuryConfig)  # the LLM jury whose scores are meta-evaluated
    # paper 001 App. E: judges scored like the jury's (expected trend, human agreement, the full matrix) but left out
    # of the jury mean and the inter-judge ICC, e.g. the base judge at other temperatures or with other prompts
    ablations: list[JudgeConfig] = field(default_factory=list)
    report: ReportConfig = field(default_factory=ReportConfig)  # per-pair metrics and bootstrap CIs of the report

    def validate(self) -> None:
        if not (self.synth.enabled or self.simpeval.enabled or self.asset.enabled):
            raise ConfigError("synth, simpeval, asset: at least one set must be enabled")
        if self.synth.enabled:
            require_file(self.synth.domains_path, "synth.domains_path")
            require_file(self.synth.nouns_path, "synth.nouns_path")
            positive(self.synth.n, "synth.n")
            check_unique_names(self.synth.simplifiers, "synth.simplifiers")
            for i, simp in enumerate(self.synth.simplifiers):
                positive(simp.size_b, f"synth.simplifiers.{i}.size_b")
                if len(bench.template_variables(simp.template)) != 1:
                    raise ConfigError(f"synth.simplifiers.{i}.template: {simp.template!r} must have exactly one "
                                      "variable (the complex sentence)")
        for key, part in (("simpeval", self.simpeval), ("asset", self.asset)):
            if part.enabled:
                require_file(part.path, f"{key}.path")
        self._check_local_cpus()
        bad = [j.name for j in self.jury.judges + self.ablations if j.format != "score"]
        if bad:
            raise ConfigError(f"jury.judges / ablations: this job rates single pairs; judges {bad} must use format "
                              "'score'")
        if self.ablations:
            self.ablation_jury().check("ablations")
            clash = sorted({j.name for j in self.jury.judges} & {j.name for j in self.ablations})
            if clash:
                raise ConfigError(f"ablations: names {clash} are already jury judges; every scorer needs its own name")
        unknown = sorted(set(self.report.metrics) - set(meta.PAIR_METRICS))
        if unknown:
            raise ConfigError(f"report.metrics: unknown {unknown}; expected some of {list(meta.PAIR_METRICS)}")
        for variant in sorted({"lens", "lens_salsa"} & set(self.report.metrics)):
            # a learned metric needs its local checkpoint and package now, not after the jury has run
            from eval.metrics.lens import MetricUnavailable, load_metric

            try:
                load_metric(variant)
            except MetricUnavailable as exc:
                raise ConfigError(f"report.metrics: {variant}: {exc}") from None


    def ablation_jury(self) -> JuryConfig:
        """The ablation judges as a panel of their own (run in a stage after the jury, never averaged into it)."""
        return dataclasses.replace(self.jury, judges=self.ablations)

    def _check_local_cpus(self) -> None:
        """All judge pools run at once (one Ray Data plan); with the light pre/post tasks beside them they must fit
        a local cluster of `ray.num_cpus`, or the jury stage waits forever for a CPU that never frees up."""
        if self.ray.address or not self.ray.num_cpus:
            return
        for key, judges in (("jury.judges", self.jury.judges), ("ablations", self.ablations)):
            pools = sum(j.pool.min_actors * j.pool.num_cpus for j in judges)
            if pools + LIGHT_CPU > self.ray.num_cpus:
                raise ConfigError(f"{key}: the judge pools ask for {pools:g} CPUs together, plus {LIGHT_CPU} for "
                                  f"Ray Data's tasks, but ray.num_cpus is {self.ray.num_cpus}; lower pool.num_cpus")


# ---------------------------------------------------------------------------------------------------------------
# Stages


def chat_plan(ds, model: ModelConfig, template: str, variables: dict[str, str], cache: str, post):
    """rows -> rendered `template` requests -> ChatWorker pool of `model` -> post (actors.generate's pattern)."""
    from actors.chat_worker import ChatWorker

    rendered = ds.map_batches(bench.render_requests, batch_format="pandas", num_cpus=LIGHT_CPU, fn_kwargs={
        "template": template, "variables": variables, "model": model.name,
        "sampling_json": model.sampling.to_json()})
    completed = rendered.map_batches(
        ChatWorker, batch_format="pandas",
        fn_constructor_kwargs={"spec": dataclasses.asdict(model.engine), "secrets": engine_secrets(model.engine),
                               "cache_dir": cache},
        **model.pool.map_batches_kwargs())
    return completed.map_batches(post, batch_format="pandas", num_cpus=LIGHT_CPU)


def load_human(cfg: Config) -> pd.DataFrame:
    parts = []
    if cfg.simpeval.enabled:
        parts.append(bench.simpeval_pairs(read_simpeval(cfg.simpeval.path), cfg.simpeval.limit, cfg.simpeval.rating))
    if cfg.asset.enabled:
        parts.append(bench.asset_pairs(read_asset_ratings(cfg.asset.path), cfg.asset.limit))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in
                             ["set", "id", "model", "source", "candidate", "generation_error", "references"]})
    return pd.concat(parts, ignore_index=True)


def run_generation(cfg: Config, store: RunStore, cache: str) -> list:
    from actors.generate import finalize_candidates, summarize_generation

    synth = cfg.synth

    def prompts() -> pd.DataFrame:
        if not synth.enabled:
            return pd.DataFrame(columns=["id", "domain", "seed_noun", "pair_seed"])
        domains, nouns = bench.read_word_list(synth.domains_path), bench.read_word_list(synth.nouns_path)
        return bench.sample_prompt_pairs(domains, nouns, synth.n, synth.seed, synth.strategy)

    def complex_() -> pd.DataFrame:
        rows = store.read_stage("prompts").to_pandas()
        if rows.empty:
            return rows.assign(source="", generation_error="", completion="", model="")
        init_ray(cfg.ray)
        ds = to_dataset(rows, synth.writer.pool.batch_size)
        return chat_plan(ds, synth.writer, synth.template, {"subject": "domain", "seed_noun": "seed_noun"},
                         cache, bench.finalize_complex).to_pandas().sort_values("id", ignore_index=True)

    def simplify() -> pd.DataFrame:
        sources = store.read_stage("complex").to_pandas()
        sources = sources[sources["generation_error"] == ""][["id", "domain", "seed_noun", "source"]]
        if sources.empty:
            return pd.DataFrame(columns=["id", "model", "source", "candidate", "generation_error", "size_b"])
        init_ray(cfg.ray)
        frames = []
        for simp in synth.simplifiers:
            (var,) = bench.template_variables(simp.template)
            plan = chat_plan(to_dataset(sources, simp.pool.batch_size), simp, simp.template, {var: "source"}, cache,
                             finalize_candidates)
            frames.append(plan.to_pandas().assign(size_b=simp.size_b))
        return pd.concat(frames, ignore_index=True).sort_values(["id", "model"], ignore_index=True)

    gen_key = {"template": synth.template, "writer": model_key([synth.writer])}
    simp_key = model_key(synth.simplifiers)
    return [
        stage_frame(cfg, store, "prompts", {k: v for k, v in dataclasses.asdict(synth).items()
                                             if k not in ("writer", "simplifiers", "size_note")}, prompts),
        stage_frame(cfg, store, "complex", gen_key, complex_,
                    lambda df, s: summarize_generation(df, s) if "completion_tokens" in df else {"rows_out": 0}),
        stage_frame(cfg, store, "simplify", simp_key, simplify,
                    lambda df, s: summarize_generation(df, s) if "completion_tokens" in df else {"rows_out": 0}),
    ]


def build_pairs(store: RunStore) -> pd.DataFrame:
    """Synthetic candidates and human-rated pairs in one table (failed generations kept, marked)."""
    simplified = store.read_stage("simplify").to_pandas()
    synth = pd.DataFrame({
        "set": bench.SYNTH, "id": simplified["id"], "model": simplified["model"], "source": simplified["source"],
        "candidate": simplified["candidate"].fillna(""), "generation_error": simplified["generation_error"],
        "size_b": simplified["size_b"].astype(float), "references": [[] for _ in range(len(simplified))]})
    human = store.read_stage("human").to_pandas()
    if "references" in human:
        human["references"] = human["references"].map(list)
    return pd.concat([synth, human], ignore_index=True)


def run_jury(cfg: Config, store: RunStore, cache: str, stage: str = "jury", jury: JuryConfig | None = None):
    """The panel's judgments of every pair (`stage` "ablations": the ablation judges', same rows and columns)."""
    from actors.chat_worker import chat_actor_restarts
    from actors.jury import build_jury_dataset, summarize_jury

    jury = jury or cfg.jury

    restarts = {"actor_restarts": 0}

    def judge() -> pd.DataFrame:
        pairs = store.read_stage("pairs").to_pandas()
        items = pairs[["id", "set", "model", "source", "candidate", "generation_error"]].rename(
            columns={"set": "policy"})
        if not (items["generation_error"] == "").any():
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in JURY_EMPTY.items()})
        init_ray(cfg.ray)
        block = min(j.pool.batch_size for j in jury.judges)
        before = chat_actor_restarts()
        judged = build_jury_dataset(to_dataset(items, block), jury, cache).to_pandas()
        # judge actors Ray restarted during the stage (a node lost, a worker killed): their batches were retried
        restarts["actor_restarts"] = chat_actor_restarts() - before
        return judged

    def summarize(df: pd.DataFrame, seconds: float) -> dict:
        return {**summarize_jury(df, seconds), **restarts}

    key = {"judges": model_key(jury.judges), "seed": jury.seed}
    return stage_frame(cfg, store, stage, key, judge, summarize)


JURY_EMPTY = {"id": "object", "policy": "object", "model": "object", "judge": "object", "score": "float64",
              "format": "object", "parse_error": "object", "engine_error": "object", "attempts": "int64",
              "cached": "bool", "prompt_tokens": "int64", "completion_tokens": "int64", "worker_seconds": "float64"}


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    load_human(cfg)  # a malformed ratings file fails before the run directory (and its manifest) exists
    run = open_run(JOB, cfg, config_path)
    store, cache = run.store, run.cache_dir
    judges = [j.name for j in cfg.jury.judges]
    ablations = [j.name for j in cfg.ablations]
    metrics = list(cfg.report.metrics)
    boot = meta.Bootstrap(cfg.report.n_boot, cfg.report.seed)
    # the human sets first: a malformed ratings file fails the run before any model is loaded
    results = [stage_frame(cfg, store, "human", {"simpeval": dataclasses.asdict(cfg.simpeval),
                                                 "asset": dataclasses.asdict(cfg.asset)}, lambda: load_human(cfg))]
    tracker = run.start_tracking(JOB, cfg.wandb)
    try:
        results += run_generation(cfg, store, cache)
        results.append(stage_frame(cfg, store, "pairs", {}, lambda: build_pairs(store)))
        results.append(run_jury(cfg, store, cache))
        if ablations:
            results.append(run_jury(cfg, store, cache, "ablations", cfg.ablation_jury()))
        results.append(stage_frame(cfg, store, "metrics", metrics,
                                   lambda: meta.pair_metrics(store.read_stage("pairs").to_pandas(), metrics)))
        results.append(stage_frame(cfg, store, "scores", {"aggregate": cfg.jury.aggregate, "judges": judges,
                                                          "ablations": ablations},
                                   lambda: meta.wide_scores(
                                       store.read_stage("pairs").to_pandas(), store.read_stage("jury").to_pandas(),
                                       judges, cfg.jury.aggregate, store.read_stage("metrics").to_pandas(),
                                       store.read_stage("ablations").to_pandas() if ablations else None)))
        results.append(stage_frame(cfg, store, "stats", {**dataclasses.asdict(cfg.report), "ablations": ablations},
                                   lambda: meta.meta_evaluate(store.read_stage("scores").to_pandas(), judges,
                                                              meta.metric_columns(metrics), boot, ablations)))
        record_stages(results, tracker)
        stats = write_report(cfg, store, tracker, boot)
        store.finish({"stats_rows": len(stats)})
    finally:
        tracker.finish()
    return stats


if __name__ == "__main__":
    entry("jobs.jury.evaluate")
