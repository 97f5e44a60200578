"""Jury meta-evaluation statistics (paper 001): agreement, human correlation, expected trend, metric meta-eval.

Input is the *scores table*, one row per rated pair (`wide_scores` builds it):

    set, id, model, source, candidate, generation_error,  size_b (synthetic),  human, human_* (human sets),
    judge:<name> (one column per judge, NaN = no usable judgment), jury, n_judges, n_unparsed, <metric columns>

Every statistic is one row of the *stats table* (`STAT_COLUMNS`): value, 95% CI from a bootstrap that resamples
source sentences (`id`; the several outputs of one sentence are not independent), and how many rows were used and
excluded (NaN scores: failed generations, unparsed judgments, missing ratings are excluded AND counted; nothing is
imputed). A statistic with nothing to compute on is NaN, with its CI; the report prints it as "n/a".

Choices, stated once:
- inter-judge agreement: ICC(2,1) with the judges as raters; pairs where any judge failed are dropped (counted).
- human vs jury: Spearman on the raw scores (rank-based, so the 0-100 human and 1-5 jury scales need no mapping),
  and ICC(2,1) on z-scores (human mean and jury mean each standardised over the complete pairs of that set, inside
  every bootstrap resample) since absolute agreement between two different scales means nothing unstandardised.
- each judge vs the jury mean: Spearman with the mean of all judges (the paper's comparison; the judge is part of
  that mean) and with the mean of the other judges (`spearman_vs_rest`, free of that overlap).
- expected trend: instance-level Spearman of each scorer with the simplifier's size (`size_b`) on the synthetic set;
  ties (one size per simplifier) take average ranks; plus whether per-simplifier jury means rise with size.
- metric meta-evaluation: Spearman of every automatic metric (and every judge, and the jury) with each human score.
  Signs are raw: FKGL is a grade level (lower = simpler), so agreement with humans shows as a negative rho.

This module is pure: it never imports ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from eval.agreement import AgreementStat, bootstrap_ci, icc_2_1, spearman
from eval.judging.jury_tables import candidate_scores
from eval.judging.synth_bench import ASSET, SIMPEVAL, SYNTH

JUDGE_PREFIX = "judge:"
JURY = "jury"
ALL = "all"
STAT_COLUMNS = ["section", "set", "a", "b", "statistic", "value", "ci_lo", "ci_hi", "n_used", "n_excluded", "note"]
HUMAN_COLUMNS = ("human", "human_fluency", "human_meaning", "human_simplicity")
PAIR_KEY = ["set", "id", "model"]


@dataclass(frozen=True)
class Bootstrap:
    n_boot: int = 1000
    seed: int = 0


# ---------------------------------------------------------------------------------------------------------------
# Building the scores table


def judge_column(name: str) -> str:
    return f"{JUDGE_PREFIX}{name}"


def wide_scores(pairs: pd.DataFrame, judgments: pd.DataFrame, judges: list[str], how: str = "mean",
                metrics: pd.DataFrame | None = None, ablations: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per pair: the pair's columns, one score column per judge, the jury aggregate, metric columns, and
    one column per ablation judge (`ablations`: judgments in the jury stage's columns; never in the aggregate).

    Args:
        pairs: rated pairs with `set` (also the jury's `policy`), id, model, ... (failed generations included).
        judgments: jury stage rows (id, policy, model, judge, score, format, parse_error, ...).
        judges: judge names, in config order (every judge gets a column even if it has no rows).
        how: jury aggregation (mean | median | majority), via `eval.judging.jury_tables.candidate_scores`.
        metrics: optional per-pair metric columns keyed by set, id, model.
    """
    out = pairs.merge(_judge_columns(judgments, judges), on=PAIR_KEY, how="left")
    jury = candidate_scores(judgments, how).rename(columns={"policy": "set", "jury_score": JURY})
    out = out.merge(jury, on=PAIR_KEY, how="left")
    out[JURY] = out[JURY].astype(float)
    out["n_judges"] = out["n_judges"].fillna(0).astype(int)
    out["n_unparsed"] = out["n_unparsed"].fillna(0).astype(int)
    if metrics is not None and len(metrics):
        out = out.merge(metrics, on=PAIR_KEY, how="left")
    if ablations is not None:
        out = out.merge(_judge_columns(ablations, sorted(ablations["judge"].unique()) if len(ablations) else []),
                        on=PAIR_KEY, how="left")
    return out


def _judge_columns(judgments: pd.DataFrame, judges: list[str]) -> pd.DataFrame:
    """PAIR_KEY + one `judge:<name>` score column per judge (NaN = no usable judgment)."""
    judged = judgments.rename(columns={"policy": "set"})
    per_judge = (judged.pivot(index=PAIR_KEY, columns="judge", values="score") if len(judged)
                 else pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=PAIR_KEY)))
    per_judge = per_judge.reindex(columns=judges).astype(float)
    per_judge.columns = [judge_column(name) for name in judges]
    return per_judge.reset_index()


def overview(scores: pd.DataFrame) -> pd.DataFrame:
    """Per set: pairs, failed generations, pairs the jury scored, judgments that did not parse (all counted)."""
    rows = []
    for name, df in _subsets(scores):
        rows.append({"set": name, "pairs": len(df), "sources": df["id"].nunique(),
                     "failed_generations": int((df["generation_error"] != "").sum()),
                     "jury_scored": int(df[JURY].notna().sum()), "unparsed_judgments": int(df["n_unparsed"].sum()),
                     "human_scored": int(df["human"].notna().sum()) if "human" in df.columns else 0})
    return pd.DataFrame(rows)


def parse_health(judgments: pd.DataFrame, judges: list[str]) -> pd.DataFrame:
    """Per judge: judgments made, scored, parse failures (kept, counted), engine errors, retried, mean score."""
    rows = []
    for name in judges:
        group = judgments[judgments["judge"] == name] if len(judgments) else judgments
        scores = group["score"].astype(float) if len(group) else pd.Series(dtype=float)
        rows.append({"judge": name, "judgments": len(group), "scored": int(scores.notna().sum()),
                     "parse_failures": int((group["parse_error"] != "").sum()) if len(group) else 0,
                     "engine_errors": int((group["engine_error"] != "").sum()) if len(group) else 0,
                     "retried": int((group["attempts"] > 1).sum()) if len(group) else 0,
                     "mean_score": float(scores.mean()) if scores.notna().any() else math.nan})
    return pd.DataFrame(rows)


REFERENCE_FREE = ("fkgl", "compression_ratio", "levenshtein", "exact_copy", "split_rate")
# metrics a job may ask for: the reference-free ones, BERTScore against the source, and SARI/BLEU where a pair has
# references (SimpEval's non-human systems, scored against that sentence's human-written simplifications); the learned
# LENS-SALSA (reference-free) and LENS (with references) of paper 001 Fig. 2 from a local checkpoint (`eval.metrics.lens`)
PAIR_METRICS = REFERENCE_FREE + ("bertscore", "sari", "bleu", "lens_salsa", "lens")


def metric_columns(names: list[str]) -> list[str]:
    """Score-table columns written by `pair_metrics(pairs, names)`, in order."""
    return ["bertscore_src" if n == "bertscore" else n for n in names]


def pair_metrics(pairs: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Automatic metrics per pair (set, id, model + one column per metric value).

    Pairs without a usable candidate get NaN (counted later as excluded). `bertscore` is BERTScore F1 of the
    candidate against its *source* (column `bertscore_src`): a meaning-preservation proxy, as no set here has
    references for every pair. `sari`/`bleu` (sentence BLEU) and `lens` are NaN for pairs without a `references`
    list; `lens_salsa` is reference-free (both from a local checkpoint: `eval.metrics.lens`).
    """
    unknown = sorted(set(names) - set(PAIR_METRICS))
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; expected some of {list(PAIR_METRICS)}")
    out = pairs[PAIR_KEY].copy().reset_index(drop=True)
    ok = ((pairs["generation_error"] == "") & (pairs["candidate"].fillna("").str.strip() != "")).to_numpy()
    orig, sys = list(pairs["source"][ok]), list(pairs["candidate"][ok])

    def put(column: str, values) -> None:
        out[column] = np.nan
        out.loc[np.flatnonzero(ok), column] = np.asarray(values, dtype=float)

    from eval.metrics.text import score_sentences

    simple = [n for n in names if n in REFERENCE_FREE]
    rows = score_sentences(simple, orig, sys, None) if simple and ok.any() else []
    for key in simple:  # each reference-free metric's key is its name
        put(key, [r[key] for r in rows])
    if "bertscore" in names:
        from eval.metrics.bertscore import sentence_bertscore

        put("bertscore_src", [s.f1 for s in sentence_bertscore(sys, [[o] for o in orig])] if ok.any() else [])
    if "lens_salsa" in names:
        from eval.metrics.lens import score_lens_salsa

        put("lens_salsa", score_lens_salsa(orig, sys) if ok.any() else [])
    for name in (n for n in names if n in ("sari", "bleu", "lens")):
        out[name] = np.nan
        refs = pairs["references"] if "references" in pairs.columns else pd.Series([[]] * len(pairs))
        has = ok & np.array([r is not None and len(r) > 0 for r in refs])
        if has.any():
            rows_refs = [list(r) for r in refs[has]]
            width = max(len(r) for r in rows_refs)
            streams = [[r[k] if k < len(r) else None for r in rows_refs] for k in range(width)]
            if name == "lens":
                from eval.metrics.lens import score_lens

                values = score_lens(list(pairs["source"][has]), list(pairs["candidate"][has]), rows_refs)
            else:
                rows = score_sentences([name], list(pairs["source"][has]), list(pairs["candidate"][has]), streams)
                values = [r[name] for r in rows]
            out.loc[np.flatnonzero(has), name] = values
    return out


# ---------------------------------------------------------------------------------------------------------------
# One statistic with its CI


def estimate(fn, *arrays, clusters, boot: Bootstrap) -> dict:
    """fn(*arrays) -> AgreementStat on the full data, plus a cluster-bootstrap 95% CI (skipped when NaN)."""
    full: AgreementStat = fn(*arrays)
    lo = hi = math.nan
    if math.isfinite(full.value) and boot.n_boot > 0:
        _, lo, hi = bootstrap_ci(fn, *arrays, clusters=clusters, n_boot=boot.n_boot, seed=boot.seed)
    return {"value": float(full.value), "ci_lo": lo, "ci_hi": hi, "n_used": int(full.n_used),
            "n_excluded": int(full.n_excluded)}


def _row(section: str, set_name: str, a: str, b: str, statistic: str, result: dict, note: str = "") -> dict:
    if math.isnan(result["value"]) and not note:  # say why there is no number
        note = ("no usable rows" if result["n_used"] == 0 else "fewer than 2 usable rows" if result["n_used"] < 2
                else "undefined: a constant score")
    return {"section": section, "set": set_name, "a": a, "b": b, "statistic": statistic, **result, "note": note}


def _values(df: pd.DataFrame, col: str) -> np.ndarray:
    return df[col].to_numpy(dtype=float) if col in df.columns else np.full(len(df), np.nan)


def _zscore_complete(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise x and y over the rows where both are present (others stay NaN)."""
    keep = ~(np.isnan(x) | np.isnan(y))
    out = []
    for v in (x, y):
        z = np.full(len(v), np.nan)
        sd = v[keep].std() if keep.sum() > 1 else 0.0
        if sd > 0:
            z[keep] = (v[keep] - v[keep].mean()) / sd
        out.append(z)
    return out[0], out[1]


def icc_zscored(x, y) -> AgreementStat:
    zx, zy = _zscore_complete(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    stat = icc_2_1(np.column_stack([zx, zy]))
    if np.isnan(zx).all():  # z-scoring failed (constant or too few pairs): report the pairs honestly
        keep = ~(np.isnan(np.asarray(x, dtype=float)) | np.isnan(np.asarray(y, dtype=float)))
        return AgreementStat(math.nan, int(keep.sum()), int((~keep).sum()))
    return stat


def _subsets(scores: pd.DataFrame, pooled: bool = True) -> list[tuple[str, pd.DataFrame]]:
    present = [s for s in (SYNTH, SIMPEVAL, ASSET) if (scores["set"] == s).any()]
    present += sorted(set(scores["set"]) - set(present))
    out = [(s, scores[scores["set"] == s]) for s in present]
    return out + [(ALL, scores)] if pooled and len(present) > 1 else out


# ---------------------------------------------------------------------------------------------------------------
# Sections


def inter_judge_agreement(scores: pd.DataFrame, judges: list[str], boot: Bootstrap) -> list[dict]:
    cols = [judge_column(j) for j in judges]
    note = "" if len(cols) > 1 else "needs >= 2 judges"
    rows = []
    for name, df in _subsets(scores):
        table = df[cols].to_numpy(dtype=float)
        result = estimate(icc_2_1, table, clusters=df["id"].to_numpy(), boot=boot)
        rows.append(_row("inter_judge", name, "judges", f"{len(cols)} judges", "ICC(2,1)", result, note))
    return rows


def human_rater_agreement(scores: pd.DataFrame, boot: Bootstrap) -> list[dict]:
    """SimpEval's three raters as raters (the paper reports 0.228 on all 360 rows)."""
    df = scores[scores["set"] == SIMPEVAL]
    if df.empty or "human_r1" not in df.columns:
        return []
    table = df[["human_r1", "human_r2", "human_r3"]].to_numpy(dtype=float)
    result = estimate(icc_2_1, table, clusters=df["id"].to_numpy(), boot=boot)
    return [_row("human_raters", SIMPEVAL, "rating_1..3", "3 raters", "ICC(2,1)", result, "raw 0-100 ratings")]


def human_vs_jury(scores: pd.DataFrame, boot: Bootstrap) -> list[dict]:
    rows = []
    for name, df in _subsets(scores, pooled=False):
        if name not in (SIMPEVAL, ASSET):
            continue
        h, j, ids = _values(df, "human"), _values(df, JURY), df["id"].to_numpy()
        rows.append(_row("human_vs_jury", name, "human", JURY, "spearman",
                         estimate(spearman, h, j, clusters=ids, boot=boot), "raw scores"))
        rows.append(_row("human_vs_jury", name, "human", JURY, "ICC(2,1)",
                         estimate(icc_zscored, h, j, clusters=ids, boot=boot), "z-scored within the set"))
    return rows


def judge_vs_jury(scores: pd.DataFrame, judges: list[str], boot: Bootstrap) -> list[dict]:
    rows = []
    cols = [judge_column(j) for j in judges]
    for name, df in _subsets(scores):
        ids, jury = df["id"].to_numpy(), _values(df, JURY)
        for judge, col in zip(judges, cols):
            x = _values(df, col)
            rows.append(_row("judge_vs_jury", name, judge, JURY, "spearman",
                             estimate(spearman, x, jury, clusters=ids, boot=boot)))
            others = [c for c in cols if c != col]
            rest = df[others].mean(axis=1, skipna=True).to_numpy(dtype=float) if others else np.full(len(df), np.nan)
            rows.append(_row("judge_vs_jury", name, judge, "mean of other judges", "spearman_vs_rest",
                             estimate(spearman, x, rest, clusters=ids, boot=boot),
                             "" if others else "needs >= 2 judges"))
    return rows


def expected_trend(scores: pd.DataFrame, scorers: list[str], boot: Bootstrap) -> list[dict]:
    """Spearman(scorer, size_b) per scorer on the synthetic set, and the monotone-means check of the jury."""
    df = scores[scores["set"] == SYNTH]
    if df.empty:
        return []
    size, ids = _values(df, "size_b"), df["id"].to_numpy()
    rows = [_row("expected_trend", SYNTH, s, "size_b", "spearman",
                 estimate(spearman, _values(df, s), size, clusters=ids, boot=boot)) for s in scorers]
    means = df.groupby("size_b")[JURY].mean().sort_index()
    flag = math.nan if means.isna().any() or len(means) < 2 else float((np.diff(means.to_numpy()) >= 0).all())
    rows.append(_row("expected_trend", SYNTH, JURY, "size_b", "monotone_means",
                     {"value": flag, "ci_lo": math.nan, "ci_hi": math.nan, "n_used": int(means.notna().sum()),
                      "n_excluded": int(means.isna().sum())},
                     "1 = per-simplifier jury means never fall as size grows"))
    return rows


def metric_meta(scores: pd.DataFrame, scorers: list[str], boot: Bootstrap) -> list[dict]:
    rows = []
    for name, df in _subsets(scores, pooled=False):
        if name not in (SIMPEVAL, ASSET):
            continue
        ids = df["id"].to_numpy()
        for human in (c for c in HUMAN_COLUMNS if c in df.columns and df[c].notna().any()):
            h = _values(df, human)
            for scorer in scorers:
                rows.append(_row("metric_vs_human", name, scorer, human, "spearman",
                                 estimate(spearman, _values(df, scorer), h, clusters=ids, boot=boot)))
    return rows


def _mean_stat(values: np.ndarray) -> AgreementStat:
    return AgreementStat(float(np.mean(values)), len(values), 0)


def system_means(scores: pd.DataFrame, boot: Bootstrap) -> pd.DataFrame:
    """Per (set, system): pairs, failed generations, scored pairs, jury mean with its CI, human mean, size."""
    rows = []
    for (set_name, model), df in scores.groupby(["set", "model"], sort=False):
        jury = _values(df, JURY)
        ok = ~np.isnan(jury)
        est = {"value": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
        if ok.any():
            est = estimate(_mean_stat, jury[ok], clusters=df["id"].to_numpy()[ok], boot=boot)
        rows.append({"set": set_name, "model": model,
                     "size_b": float(df["size_b"].iloc[0]) if "size_b" in df.columns else math.nan,
                     "pairs": len(df), "failed_generations": int((df["generation_error"] != "").sum()),
                     "scored": int(ok.sum()), "jury_mean": est["value"], "ci_lo": est["ci_lo"],
                     "ci_hi": est["ci_hi"],
                     "human_mean": float(df["human"].mean()) if "human" in df.columns else math.nan})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    rank = {SYNTH: 0, SIMPEVAL: 1, ASSET: 2}
    out = out.assign(_rank=out["set"].map(lambda s: rank.get(s, 3)))
    return out.sort_values(["_rank", "set", "size_b", "model"], kind="stable").drop(columns="_rank").reset_index(
        drop=True)


def spearman_matrix(scores: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Pairwise-complete Spearman between score columns (NaN where a pair has < 2 usable rows or no variance)."""
    names = [c.removeprefix(JUDGE_PREFIX) for c in columns]
    matrix = pd.DataFrame(np.nan, index=names, columns=names)
    for i, a in enumerate(columns):
        for k, b in enumerate(columns):
            matrix.iloc[i, k] = spearman(_values(scores, a), _values(scores, b)).value
    return matrix


# Metrics whose raw value falls as quality rises; Fig. 3 of paper 001 plots them so that higher = better (the paper
# calls FKGL "incorrectly rating larger models as producing worse simplifications", i.e. a negative correlation
# once oriented). Spearman of the negated metric = minus the raw one.
ORIENTATION = {"fkgl": -1}


def full_matrix(scores: pd.DataFrame, judges: list[str], ablations: list[str], metrics: list[str]) -> pd.DataFrame:
    """Paper 001 Fig. 3: Spearman between every judge, the jury mean, each metric (oriented, `-fkgl`) and model size,
    on the synthetic set (its only set with a size); an empty frame without synthetic pairs."""
    df = scores[scores["set"] == SYNTH].copy()
    if df.empty:
        return pd.DataFrame()
    columns = [judge_column(j) for j in judges + ablations] + [JURY]
    for metric in (m for m in metrics if m in df.columns and df[m].notna().any()):
        sign = ORIENTATION.get(metric, 1)
        name = metric if sign > 0 else f"-{metric}"
        df[name] = sign * df[metric].astype(float)
        columns.append(name)
    return spearman_matrix(df, columns + ["size_b"])


def meta_evaluate(scores: pd.DataFrame, judges: list[str], metrics: list[str], boot: Bootstrap,
                  ablations: list[str] = ()) -> pd.DataFrame:
    """Every statistic of the report, as the stats table. Ablation judges get the per-scorer statistics (expected
    trend, agreement with humans) but stay out of the inter-judge ICC and the judge-vs-jury rows."""
    scorers = ([judge_column(j) for j in judges] + [JURY] + [judge_column(a) for a in ablations]
               + [m for m in metrics if m in scores.columns])
    rows = (inter_judge_agreement(scores, judges, boot) + human_rater_agreement(scores, boot)
            + human_vs_jury(scores, boot) + judge_vs_jury(scores, judges, boot)
            + expected_trend(scores, scorers, boot) + metric_meta(scores, scorers, boot))
    out = pd.DataFrame(rows, columns=STAT_COLUMNS)
    out["a"] = out["a"].str.removeprefix(JUDGE_PREFIX)
    return out
