"""Judge evaluation on MENLO-format data (paper 003 §3): judge protocols x judges -> metrics table + HTML report.

Local (local Ray, SmolLM2-135M judge, the self-written fixture):

    quorum run configs/judge_eval_demo.yaml
    python -m jobs.judge.evaluate configs/judge_eval_demo.yaml data.limit=8 run.id=small

On a cluster (vLLM judges on GPUs, API judges through OpenAI-compatible endpoints, MENLO from a local copy):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \
        quorum run configs/judge_eval_cluster.yaml data.path=/data/menlo/menlo.jsonl run.root=s3://bucket/runs

Data: a MENLO-format JSONL file (`data.path`), one response pair per line with pair_id, dimension (fluency | tone
| localized_tone | localized_factuality), locale, prompt, response_a, response_b, gold_a, gold_b (1-5) and
optionally template_id, question_type, split (train | val | test), prompt_en; the full table is in
eval/judging/menlo_data.py. Pairs whose split is in `data.eval_splits` are judged; few-shot exemplars come from
`data.exemplar_splits`. A malformed line stops the run before any model is loaded (exit code 2, naming file, line
and field). `configs/data/menlo_fixture.jsonl` is a small self-written set (32 test pairs in 5 locales x 4 dimensions,
plus 8 train pairs as few-shot exemplars).

Protocols (`protocols[i]`): pointwise, few-shot pointwise (3 graded exemplars) and pairwise (both A/B orders),
each with the dimension's rubric or only the five labels; all answer in MENLO's format and are read with the shared
parser (eval.judging.parse), as the GRM service and the RL reward read them.

Stages (Parquet under <run.root>/judge_eval/<run-id>/, reused when complete and unchanged): data (validated pairs,
role = eval | exemplar) -> items (one rendered judge call per protocol x pair x response/order) -> judgments
(every judge's answers, parsed; failures kept) -> metrics (eval.judging.metrics: macro-F1, accuracy, preference
accuracy, Krippendorff's alpha, position-bias rate, parse-failure and format-violation rates, per dimension and
locale, bootstrap 95% CIs over pairs). Then metrics.md, report.html (tables + plots) and W&B (offline by default).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from actors.menlo import MenloJudgeConfig
from actors.stage_config import LIGHT_CPU, SamplingConfig, check_unique_names
from core.config import ConfigError, require_file
from core.jobrun import JobSections, open_run, record_stages
from core.ray_env import init_ray
from core.runstore import RunStore
from eval.judging import menlo_data as md
from eval.judging import metrics as jm
from eval.judging import report as rep
from eval.judging.jury_meta import Bootstrap
from jobs.entry import entry
from jobs.frames import model_key, stage_frame, to_dataset

log = logging.getLogger("quorum.judge_eval")
JOB = "judge_eval"


@dataclass
class DataConfig:
    """The MENLO-format pairs to judge, their rubrics, filters and exemplar pool."""

    path: str = "configs/data/menlo_fixture.jsonl"  # MENLO-format JSONL of graded response pairs (eval/judging/menlo_data.py)
    rubrics_path: str = "configs/data/menlo_rubrics.yaml"  # MENLO rubrics YAML (dimension -> question, criteria)
    # splits whose pairs are judged, and splits few-shot exemplars are drawn from (never the judged pair's group)
    eval_splits: list[str] = field(default_factory=lambda: ["test"])
    # splits few-shot exemplars are drawn from (never the judged pair's group)
    exemplar_splits: list[str] = field(default_factory=lambda: ["train"])
    # keep only these dimensions / locales ([] = all)
    dimensions: list[str] = field(default_factory=list)
    locales: list[str] = field(default_factory=list)  # keep only these locales ([] = all)
    # first N judged pairs in file order after the filters (0 = all)
    limit: int = 0
    # exemplar picks and the A/B order of single-order pairwise protocols
    seed: int = 0


@dataclass
class ReportConfig:
    """Confidence intervals, failure handling and agreement statistics of the report."""

    # bootstrap resamples of pairs per CI (paper: 5000); 0 = no CIs
    n_boot: int = 1000
    seed: int = 0  # seed of the bootstrap resampling
    # an unparseable grade: counted as a wrong answer, or left out (always counted in the parse-failure rate)
    failures: Literal["count_wrong", "exclude"] = "count_wrong"
    # Krippendorff's alpha level of measurement (the paper does not say)
    alpha_level: Literal["nominal", "ordinal", "interval", "ratio"] = "interval"


def _default_protocols() -> list[md.Protocol]:
    return [md.Protocol(name="pointwise+rubric", mode="pointwise"), md.Protocol(name="pairwise+rubric")]


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)
    protocols: list[md.Protocol] = field(default_factory=_default_protocols)
    # the judges evaluated, each under every protocol (a model, its sampling and retries each)
    judges: list[MenloJudgeConfig] = field(default_factory=lambda: [MenloJudgeConfig(
        name="smollm2", sampling=SamplingConfig(max_tokens=256))])
    report: ReportConfig = field(default_factory=ReportConfig)

    def validate(self) -> None:
        require_file(self.data.path, "data.path")
        require_file(self.data.rubrics_path, "data.rubrics_path")
        for key in ("eval_splits", "exemplar_splits"):
            bad = sorted(set(getattr(self.data, key)) - set(md.SPLITS))
            if bad or not getattr(self.data, key):
                raise ConfigError(f"data.{key}: must be a non-empty subset of {list(md.SPLITS)}, got "
                                  f"{getattr(self.data, key)}")
        bad = sorted(set(self.data.dimensions) - set(md.DIMENSIONS))
        if bad:
            raise ConfigError(f"data.dimensions: unknown {bad}; expected some of {list(md.DIMENSIONS)}")
        names = [p.name for p in self.protocols]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"protocols: need at least one, with unique names; got {names}")
        check_unique_names(self.judges, "judges")
        self._check_local_cpus()

    def _check_local_cpus(self) -> None:
        """All judge pools run in one Ray Data plan: on a local cluster they must fit beside the light tasks."""
        if self.ray.address or not self.ray.num_cpus:
            return
        pools = sum(j.pool.min_actors * j.pool.num_cpus for j in self.judges)
        if pools + LIGHT_CPU > self.ray.num_cpus:
            raise ConfigError(f"judges: the judge pools ask for {pools:g} CPUs together, plus {LIGHT_CPU} for "
                              f"Ray Data's tasks, but ray.num_cpus is {self.ray.num_cpus}; lower pool.num_cpus")


# ---------------------------------------------------------------------------------------------------------------
# Stages


def load_pairs(data: DataConfig) -> pd.DataFrame:
    """Validated pairs with role "eval" (judged) or "exemplar" (few-shot pool); a pair in both splits is judged."""
    try:
        pairs = md.read_menlo_jsonl(data.path)
    except md.MenloDataError as exc:
        raise ConfigError(f"data.path: {exc}") from exc
    keep = pd.Series(True, index=pairs.index)
    if data.dimensions:
        keep &= pairs["dimension"].isin(data.dimensions)
    if data.locales:
        keep &= pairs["locale"].isin(data.locales)
    judged = pairs[keep & pairs["split"].isin(data.eval_splits)]
    if data.limit:
        judged = judged.head(data.limit)
    if judged.empty:
        raise ConfigError(f"data: no pair of {data.path} is in eval_splits {data.eval_splits} after the filters")
    exemplars = pairs[pairs["split"].isin(data.exemplar_splits) & ~pairs.index.isin(judged.index)]
    return pd.concat([judged.assign(role="eval"), exemplars.assign(role="exemplar")], ignore_index=True)


def build_items(cfg: Config, pairs: pd.DataFrame) -> pd.DataFrame:
    rubrics = md.load_rubrics(cfg.data.rubrics_path)
    pool = md.exemplar_pool(pairs[pairs["split"].isin(cfg.data.exemplar_splits)])
    try:
        return md.build_items(pairs[pairs["role"] == "eval"], pool, cfg.protocols, rubrics, cfg.data.seed)
    except md.MenloDataError as exc:
        raise ConfigError(f"data.exemplar_splits: {exc}") from exc


def run_judges(cfg: Config, store: RunStore, cache: str):
    from actors.menlo import build_menlo_dataset, summarize_judgments

    def judge() -> pd.DataFrame:
        items = store.read_stage("items").to_pandas()
        init_ray(cfg.ray)
        block = min(j.pool.batch_size for j in cfg.judges)
        out = build_menlo_dataset(to_dataset(items, block), cfg.judges, cache).to_pandas()
        return out.sort_values(["judge", "item_id"], ignore_index=True)

    return stage_frame(cfg, store, "judgments", {"judges": model_key(cfg.judges)}, judge, summarize_judgments)


def compute_metrics(cfg: Config, judgments: pd.DataFrame) -> pd.DataFrame:
    """jm.evaluate with one Ray task per (judge, protocol): the bootstrap is the costly part (on the paper's data,
    ~50 slices x 7 statistics x 5,000 resamples per group), and the groups are independent."""
    import ray

    init_ray(cfg.ray)
    evaluate_group = ray.remote(num_cpus=1)(jm.evaluate_group)
    boot = Bootstrap(cfg.report.n_boot, cfg.report.seed)
    # config order (judges, then protocols), so every table reads in the order the config lists them
    rank = {(j.name, p.name): (a, b) for a, j in enumerate(cfg.judges) for b, p in enumerate(cfg.protocols)}
    groups = sorted(judgments.groupby(["judge", "protocol"], sort=False), key=lambda kv: rank[kv[0]])
    futures = [evaluate_group.remote(group, boot, cfg.report.failures, cfg.report.alpha_level) for _, group in groups]
    rows = []
    for ((judge, protocol), _), group_rows in zip(groups, ray.get(futures)):
        rows += [{"judge": judge, "protocol": protocol, **row} for row in group_rows]
    return pd.DataFrame(rows, columns=jm.COLUMNS)


def compute_differences(cfg: Config, judgments: pd.DataFrame) -> pd.DataFrame:
    """Every (judge, protocol) minus the config's first, paired over pairs (jm.differences), in config order."""
    rank = {(j.name, p.name): (a, b) for a, j in enumerate(cfg.judges) for b, p in enumerate(cfg.protocols)}
    ordered = judgments.assign(_rank=[rank[k] for k in zip(judgments["judge"], judgments["protocol"])])
    ordered = ordered.sort_values("_rank", kind="stable").drop(columns="_rank")
    return jm.differences(ordered, Bootstrap(cfg.report.n_boot, cfg.report.seed), cfg.report.failures)


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    build_items(cfg, load_pairs(cfg.data))  # bad data fails before the run directory (and its manifest) exists
    run = open_run(JOB, cfg, config_path)
    store, cache = run.store, run.cache_dir
    # data and items first: a malformed file or a missing exemplar fails the run before any model is loaded
    data_key = {**dataclasses.asdict(cfg.data), "file": _digest(cfg.data.path)}
    results = [stage_frame(cfg, store, "data", data_key, lambda: load_pairs(cfg.data))]
    results.append(stage_frame(cfg, store, "items", {"protocols": [dataclasses.asdict(p) for p in cfg.protocols],
                                                     "rubrics": _digest(cfg.data.rubrics_path)},
                               lambda: build_items(cfg, store.read_stage("data").to_pandas())))
    tracker = run.start_tracking(JOB, cfg.wandb)
    try:
        results.append(run_judges(cfg, store, cache))
        results.append(stage_frame(cfg, store, "metrics", dataclasses.asdict(cfg.report),
                                   lambda: compute_metrics(cfg, store.read_stage("judgments").to_pandas())))
        results.append(stage_frame(cfg, store, "differences", dataclasses.asdict(cfg.report),
                                   lambda: compute_differences(cfg, store.read_stage("judgments").to_pandas())))
        record_stages(results, tracker)
        metrics = write_report(cfg, store, tracker)
        store.finish({"metrics_rows": len(metrics)})
    finally:
        tracker.finish()
    return metrics


def _digest(path: str) -> str:
    """Content hash, so editing the data or rubric file re-runs the stages that read it."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Report


def report_notes(cfg: Config, pairs: pd.DataFrame) -> list[str]:
    judged = pairs[pairs["role"] == "eval"]
    protocols = ", ".join(f"{p.name} ({p.mode}{', few-shot' if p.fewshot else ''}, "
                          f"{'rubric' if p.rubric else 'labels only'})" for p in cfg.protocols)
    return [
        (f"Data: {len(judged)} pairs from {cfg.data.path} ({judged['locale'].nunique()} locales, "
         f"{judged['dimension'].nunique()} dimensions); splits {cfg.data.eval_splits}."),
        f"Protocols: {protocols}. Preference is derived from the grades, never asked.",
        f"Judges: {', '.join(j.name for j in cfg.judges)}.",
        (f"95% CIs: {cfg.report.n_boot} bootstrap resamples of pairs (seed {cfg.report.seed}); Krippendorff's alpha "
         f"at the {cfg.report.alpha_level} level, judge vs gold as two coders over responses."),
    ]


def write_report(cfg: Config, store: RunStore, tracker) -> pd.DataFrame:
    """metrics.md and report.html in the run directory; tables, plots and headline numbers to W&B."""
    metrics = store.read_stage("metrics").to_pandas()
    judgments = store.read_stage("judgments").to_pandas()
    diffs = store.read_stage("differences").to_pandas()
    notes = report_notes(cfg, store.read_stage("data").to_pandas())
    markdown, html, figures = rep.build_report("Judge evaluation (MENLO protocols)", notes, metrics, judgments,
                                               cfg.report.failures, diffs)
    store.write_text("metrics.md", markdown)
    store.write_text("report.html", html)
    print("\n" + markdown + "\n")
    tracker.table("report/headline", jm.headline(metrics))
    tracker.table("report/differences", diffs)
    tracker.table("report/metrics", metrics, max_rows=5000)
    tracker.table("report/parse_health", rep.parse_health(judgments, rep.group_order(metrics)))
    sample = judgments[["judge", "protocol", "item_id", "raw_completion", "parse_error"]]
    tracker.table("report/judge_outputs", sample, max_rows=100)
    if tracker.run is not None:
        import io

        import wandb
        from PIL import Image

        tracker.log({f"report/{_slug(f.title)}": wandb.Image(Image.open(io.BytesIO(f.png)), caption=f.title)
                     for f in figures})
    overall = metrics[metrics["slice"] == "all"]
    tracker.summary("metrics", {f"{r.judge}/{r.protocol}/{r.statistic}": r.value for r in overall.itertuples()})
    return metrics


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


if __name__ == "__main__":
    entry("jobs.judge.evaluate")
