"""Judge meta-evaluation on MENLO-format data (paper 003 §3, §2.4 of the notes): pure pandas/numpy, no ray.

Input: one row per judge call (the `judgments` stage of jobs/judge/evaluate.py) with columns judge, protocol, mode,
pair_id, dimension, locale, unit ("a"/"b" pointwise, "AB"/"BA" pairwise), gold_a, gold_b, pred_a, pred_b (grades
in the pair's original identity, NaN when not extracted), parse_error ("" = parsed) and format_ok.

Statistics, per (judge, protocol) and per slice (all, each dimension, each locale), each with a percentile
bootstrap 95% CI that resamples *pairs* (a pair's responses, orders and pointwise calls move together):

====================  ==========================================================================================
macro_f1              unweighted mean over the 5 grades of per-grade F1, predicted vs gold class, over responses
accuracy              exact 5-way grade match over responses
preference_accuracy   share of comparisons with sign(pred_a - pred_b) == sign(gold_a - gold_b), ties a class of
                      their own; pairwise: one comparison per judged order; pointwise: the two separate grades
krippendorff_alpha    judge vs gold as two coders over responses (level configurable; failures are missing)
position_bias_rate    pairwise with both orders: share of pairs whose derived preference changes when A and B
                      are swapped (both orders parsed; other pairs counted as excluded)
parse_failure_rate    share of judge calls whose grade(s) could not be extracted (kept, never dropped)
format_violation_rate share of judge calls breaking MENLO's format (tags once, in order; FINAL GRADE: k - LABEL)
====================  ==========================================================================================

Failure policy (the paper does not say how it scored unparseable outputs): ``count_wrong`` (default) scores a
missing grade as a wrong answer in F1, accuracy and preference accuracy (it is a "no grade" prediction that never
matches, and adds a false negative to its gold grade's F1); ``exclude`` leaves those responses out (counted in
n_excluded). Alpha always treats them as missing. All values are fractions (the paper prints x100).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from eval.agreement import AgreementStat, krippendorff_alpha
from eval.judging.jury_meta import Bootstrap, estimate
from eval.judging.menlo_data import gold_class

GRADES = (1.0, 2.0, 3.0, 4.0, 5.0)
NO_GRADE = 0.0  # the "no grade" prediction under count_wrong: never equal to a gold class
NO_PREFERENCE = 9.0  # the same for preference signs (-1, 0, 1)
FAILURE_POLICIES = ("count_wrong", "exclude")
STATISTICS = ("macro_f1", "accuracy", "preference_accuracy", "krippendorff_alpha", "position_bias_rate",
              "parse_failure_rate", "format_violation_rate")
COLUMNS = ["judge", "protocol", "slice", "statistic", "value", "ci_lo", "ci_hi", "n_used", "n_excluded", "note"]
KEYS = ["judge", "protocol", "dimension", "locale", "pair_id"]


# ---------------------------------------------------------------------------------------------------------------
# Judgments -> responses, comparisons, swap pairs


def response_rows(judgments: pd.DataFrame) -> pd.DataFrame:
    """One row per graded response: a pointwise call grades one, a pairwise call two. Columns: KEYS, gold, pred."""
    parts = []
    for side in ("a", "b"):
        graded = judgments[judgments["unit"] != ("b" if side == "a" else "a")]  # pointwise "b" has no A grade
        parts.append(graded[KEYS].assign(side=side, gold=graded[f"gold_{side}"].map(gold_class).astype(float),
                                         pred=graded[f"pred_{side}"].astype(float)))
    return pd.concat(parts, ignore_index=True)


def _sign(x: pd.Series) -> pd.Series:
    return np.sign(x.astype(float))


def comparison_rows(judgments: pd.DataFrame) -> pd.DataFrame:
    """One row per comparison: each pairwise call, or the two pointwise calls of a pair joined. Columns: KEYS,
    gold_pref, pred_pref (NaN when a grade is missing)."""
    pair = judgments[judgments["mode"] == "pairwise"]
    pairwise = pair[KEYS].assign(gold_pref=_sign(pair["gold_a"] - pair["gold_b"]),
                                 pred_pref=_sign(pair["pred_a"] - pair["pred_b"]))
    point = judgments[judgments["mode"] == "pointwise"]
    a = point[point["unit"] == "a"][KEYS + ["gold_a", "gold_b", "pred_a"]]
    b = point[point["unit"] == "b"][KEYS + ["pred_b"]]
    joined = a.merge(b, on=KEYS, how="outer")
    pointwise = joined[KEYS].assign(gold_pref=_sign(joined["gold_a"] - joined["gold_b"]),
                                    pred_pref=_sign(joined["pred_a"] - joined["pred_b"]))
    return pd.concat([pairwise, pointwise], ignore_index=True)


def swap_rows(judgments: pd.DataFrame) -> pd.DataFrame:
    """Pairwise pairs judged in both orders: KEYS, flipped (1.0 / 0.0; NaN when either order lacks a grade)."""
    pair = judgments[judgments["mode"] == "pairwise"]
    pref = pair[KEYS].assign(unit=pair["unit"], pref=_sign(pair["pred_a"] - pair["pred_b"]))
    ab = pref[pref["unit"] == "AB"].drop(columns="unit")
    ba = pref[pref["unit"] == "BA"].drop(columns="unit")
    both = ab.merge(ba, on=KEYS, suffixes=("_ab", "_ba"))
    flipped = (both["pref_ab"] != both["pref_ba"]).astype(float)
    flipped[both["pref_ab"].isna() | both["pref_ba"].isna()] = np.nan
    return both[KEYS].assign(flipped=flipped)


# ---------------------------------------------------------------------------------------------------------------
# Statistics on arrays (AgreementStat so n_used / n_excluded travel with the value)


def mean_rate(values) -> AgreementStat:
    """Mean of 0/1 values, NaN ignored (counted as excluded)."""
    x = np.asarray(values, dtype=float)
    kept = x[~np.isnan(x)]
    return AgreementStat(float(kept.mean()) if len(kept) else math.nan, len(kept), len(x) - len(kept))


# Numeric twins of eval.agreement.accuracy / macro_f1 (same definitions; tests check they agree): the bootstrap
# calls them about 10^5 times per run, and the generic versions walk Python lists of arbitrary labels.


def _complete(gold, pred) -> tuple[np.ndarray, np.ndarray, int]:
    t, p = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    keep = ~(np.isnan(t) | np.isnan(p))
    return t[keep], p[keep], int((~keep).sum())


def grade_accuracy(gold, pred) -> AgreementStat:
    """Exact-match rate over pairs where both are present (agreement.accuracy for numbers)."""
    t, p, dropped = _complete(gold, pred)
    return AgreementStat(float((t == p).mean()) if len(t) else math.nan, len(t), dropped)


def f1_over_grades(gold, pred) -> AgreementStat:
    """agreement.macro_f1(gold, pred, labels=GRADES) for numbers: a grade never seen nor predicted scores 0."""
    t, p, dropped = _complete(gold, pred)
    if not len(t):
        return AgreementStat(math.nan, 0, dropped)
    # confusion counts over codes 0..6: grades 1-5, 0 for any other label ("no grade"), gold or predicted
    codes = [np.where(np.isin(x, GRADES), x, 0).astype(int) for x in (t, p)]
    matrix = np.bincount(codes[0] * 6 + codes[1], minlength=36).reshape(6, 6)[1:, 1:]
    tp = np.diag(matrix).astype(float)
    fp = np.bincount(codes[1], minlength=6)[1:] - tp  # predicted c, gold something else
    fn = np.bincount(codes[0], minlength=6)[1:] - tp  # gold c, predicted something else
    f1 = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros(len(GRADES)), where=tp > 0)
    return AgreementStat(float(f1.mean()), len(t), dropped)


def alpha_fn(level: str):
    def alpha(gold, pred) -> AgreementStat:
        return krippendorff_alpha(np.column_stack([np.asarray(gold, float), np.asarray(pred, float)]), level)

    return alpha


def _apply_policy(pred: np.ndarray, policy: str, failed_value: float) -> np.ndarray:
    return np.where(np.isnan(pred), failed_value, pred) if policy == "count_wrong" else pred


# ---------------------------------------------------------------------------------------------------------------
# The table


def slices(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """("all", frame), then ("dimension=<d>", ...) and ("locale=<l>", ...) in sorted order."""
    out = [("all", frame)]
    for column in ("dimension", "locale"):
        out += [(f"{column}={value}", part) for value, part in sorted(frame.groupby(column), key=lambda kv: kv[0])]
    return out


def evaluate_group(judgments: pd.DataFrame, boot: Bootstrap, policy: str = "count_wrong",
                   alpha_level: str = "interval") -> list[dict]:
    """Every statistic of one (judge, protocol) on every slice, as rows of COLUMNS (without judge/protocol)."""
    if policy not in FAILURE_POLICIES:
        raise ValueError(f"failure policy {policy!r} is not one of {FAILURE_POLICIES}")
    responses, comparisons, swaps = response_rows(judgments), comparison_rows(judgments), swap_rows(judgments)
    pairwise_both = (judgments["mode"] == "pairwise").all() and set(judgments["unit"]) == {"AB", "BA"}
    rows = []
    for name, part in slices(judgments):
        pick = _slicer(name)
        resp, comp, swap = pick(responses), pick(comparisons), pick(swaps)
        pred, gold = resp["pred"].to_numpy(float), resp["gold"].to_numpy(float)
        scored = _apply_policy(pred, policy, NO_GRADE)
        pref = _apply_policy(comp["pred_pref"].to_numpy(float), policy, NO_PREFERENCE)
        stats = {
            "macro_f1": (f1_over_grades, (gold, scored), resp),
            "accuracy": (grade_accuracy, (gold, scored), resp),
            "preference_accuracy": (grade_accuracy, (comp["gold_pref"].to_numpy(float), pref), comp),
            "krippendorff_alpha": (alpha_fn(alpha_level), (gold, pred), resp),
            "parse_failure_rate": (mean_rate, ((part["parse_error"] != "").to_numpy(float),), part),
            "format_violation_rate": (mean_rate, ((~part["format_ok"].astype(bool)).to_numpy(float),), part),
        }
        if pairwise_both:
            stats["position_bias_rate"] = (mean_rate, (swap["flipped"].to_numpy(float),), swap)
        for statistic in STATISTICS:
            if statistic in stats:
                fn, arrays, frame = stats[statistic]
                result = estimate(fn, *arrays, clusters=frame["pair_id"].to_numpy(), boot=boot)
                rows.append({"slice": name, "statistic": statistic, **result, "note": _note(statistic, result)})
    return rows


def _slicer(name: str):
    if name == "all":
        return lambda frame: frame
    column, value = name.split("=", 1)
    return lambda frame: frame[frame[column] == value]


def _note(statistic: str, result: dict) -> str:
    if not math.isnan(result["value"]):
        return ""
    if result["n_used"] == 0:
        return "no usable rows" if statistic != "krippendorff_alpha" else "no response with an extracted grade"
    return "undefined: a single grade value" if statistic == "krippendorff_alpha" else "undefined"


def evaluate(judgments: pd.DataFrame, boot: Bootstrap, policy: str = "count_wrong",
             alpha_level: str = "interval") -> pd.DataFrame:
    """The long metrics table: COLUMNS, one row per (judge, protocol, slice, statistic), in input order."""
    rows = []
    for (judge, protocol), group in judgments.groupby(["judge", "protocol"], sort=False):
        rows += [{"judge": judge, "protocol": protocol, **row}
                 for row in evaluate_group(group, boot, policy, alpha_level)]
    return pd.DataFrame(rows, columns=COLUMNS)


# ---------------------------------------------------------------------------------------------------------------
# Paired differences between protocols / judges

DIFF_STATISTICS = ("macro_f1", "accuracy", "preference_accuracy")
DIFF_COLUMNS = ["judge", "protocol", "versus", "statistic", "difference", "ci_lo", "ci_hi", "n_pairs"]


def _paired(fn):
    """fn on group 0 minus fn on group 1 of the stacked arrays (the third array is the 0/1 group)."""
    def difference(gold, pred, group) -> AgreementStat:
        a, b = fn(gold[group == 0], pred[group == 0]), fn(gold[group == 1], pred[group == 1])
        return AgreementStat(a.value - b.value, min(a.n_used, b.n_used), a.n_excluded + b.n_excluded)

    return difference


def _diff_arrays(frames: list[pd.DataFrame], gold: str, pred: str, policy: str, failed: float):
    gold_v = np.concatenate([f[gold].to_numpy(float) for f in frames])
    pred_v = np.concatenate([_apply_policy(f[pred].to_numpy(float), policy, failed) for f in frames])
    group = np.concatenate([np.full(len(f), i) for i, f in enumerate(frames)])
    clusters = np.concatenate([f["pair_id"].to_numpy() for f in frames])
    return gold_v, pred_v, group, clusters


def differences(judgments: pd.DataFrame, boot: Bootstrap, policy: str = "count_wrong") -> pd.DataFrame:
    """Each (judge, protocol) minus the first one, for DIFF_STATISTICS, with a *paired* cluster-bootstrap 95% CI.

    Both sides are restricted to the pairs both judged and every resample draws the same pair ids for both, so the
    CI reflects the protocol difference, not which pairs happened to be drawn (a CI that excludes 0 is a
    difference at the 5% level). Rows: DIFF_COLUMNS; empty with fewer than two groups.
    """
    groups = list(judgments.groupby(["judge", "protocol"], sort=False))
    if len(groups) < 2:
        return pd.DataFrame(columns=DIFF_COLUMNS)
    (base_judge, base_protocol), base = groups[0]
    rows = []
    for (judge, protocol), group in groups[1:]:
        shared = set(base["pair_id"]) & set(group["pair_id"])
        sides = [g[g["pair_id"].isin(shared)] for g in (group, base)]
        responses = [response_rows(side) for side in sides]
        comparisons = [comparison_rows(side) for side in sides]
        plans = {"macro_f1": (f1_over_grades, responses, "gold", "pred", NO_GRADE),
                 "accuracy": (grade_accuracy, responses, "gold", "pred", NO_GRADE),
                 "preference_accuracy": (grade_accuracy, comparisons, "gold_pref", "pred_pref", NO_PREFERENCE)}
        for statistic in DIFF_STATISTICS:
            fn, frames, gold, pred, failed = plans[statistic]
            gold_v, pred_v, flag, clusters = _diff_arrays(frames, gold, pred, policy, failed)
            result = estimate(_paired(fn), gold_v, pred_v, flag, clusters=clusters, boot=boot)
            rows.append({"judge": judge, "protocol": protocol, "versus": f"{base_judge} / {base_protocol}",
                         "statistic": statistic, "difference": result["value"], "ci_lo": result["ci_lo"],
                         "ci_hi": result["ci_hi"], "n_pairs": len(shared)})
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)


def difference_table(diffs: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """One row per compared group, one ``difference [CI]`` column per statistic."""
    if diffs.empty:
        return pd.DataFrame()
    cells = diffs.assign(cell=[_cell(r.difference, r.ci_lo, r.ci_hi, digits) for r in diffs.itertuples()])
    table = cells.pivot_table(index=["judge", "protocol", "versus", "n_pairs"], columns="statistic", values="cell",
                              aggfunc="first", sort=False)
    return table[[s for s in DIFF_STATISTICS if s in table.columns]].reset_index()


# ---------------------------------------------------------------------------------------------------------------
# Views for the report


def headline(metrics: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """judge x protocol rows, one "value [lo, hi]" cell per statistic (slice "all"); "n/a" when undefined."""
    part = metrics[metrics["slice"] == "all"]
    cells = part.assign(cell=[_cell(v, lo, hi, digits) for v, lo, hi in
                              zip(part["value"], part["ci_lo"], part["ci_hi"])])
    table = cells.pivot_table(index=["judge", "protocol"], columns="statistic", values="cell", aggfunc="first",
                              sort=False)
    order = [s for s in STATISTICS if s in table.columns]
    return table[order].fillna("-").reset_index()


def slice_table(metrics: pd.DataFrame, kind: str, statistic: str, digits: int = 3) -> pd.DataFrame:
    """judge x protocol rows, one column per `kind` slice (dimension / locale) of one statistic, "v (n)" cells."""
    part = metrics[metrics["slice"].str.startswith(f"{kind}=") & (metrics["statistic"] == statistic)]
    if part.empty:
        return pd.DataFrame()
    cells = part.assign(column=part["slice"].str.split("=", n=1).str[1],
                        cell=[f"{_fmt(v, digits)} (n={n})" for v, n in zip(part["value"], part["n_used"])])
    table = cells.pivot_table(index=["judge", "protocol"], columns="column", values="cell", aggfunc="first",
                              sort=False)
    return table.reset_index()


def confusion(judgments: pd.DataFrame) -> pd.DataFrame:
    """Gold grade (rows 1-5) x predicted grade (columns 1-5 and "none") counts over responses."""
    responses = response_rows(judgments)
    pred = responses["pred"].map(lambda p: "none" if math.isnan(p) else str(int(p)))
    table = pd.crosstab(responses["gold"].astype(int), pred)
    return table.reindex(index=[1, 2, 3, 4, 5], columns=["1", "2", "3", "4", "5", "none"], fill_value=0)


def _fmt(value: float, digits: int) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _cell(value: float, lo: float, hi: float, digits: int) -> str:
    if math.isnan(value):
        return "n/a"
    ci = "" if math.isnan(lo) or math.isnan(hi) else f" [{_fmt(lo, digits)}, {_fmt(hi, digits)}]"
    return f"{_fmt(value, digits)}{ci}"
