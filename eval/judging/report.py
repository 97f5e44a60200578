"""Report of the MENLO judge evaluation (jobs/judge/evaluate.py): markdown tables and an HTML page with plots.

Built from the long metrics table of eval.judging.metrics and the judgments; rendering is eval.report_html's. Pure:
pandas + matplotlib (Agg), no ray.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from eval.judging import metrics as jm
from eval.report_html import Figure, Section, _empty, _figure_png, _pyplot, render_html, render_markdown

MAX_CONFUSION_PANELS = 12


def _groups(judgments: pd.DataFrame, order: list[tuple[str, str]] | None) -> list:
    """(judge, protocol) groups in `order` (e.g. the metrics table's), else in order of appearance."""
    groups = dict(list(judgments.groupby(["judge", "protocol"], sort=False)))
    keys = [k for k in dict.fromkeys(order) if k in groups] if order else list(groups)
    return [(k, groups[k]) for k in keys]


def parse_health(judgments: pd.DataFrame, order: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """Per judge x protocol: calls, parse failures (kept), format violations, retried calls, the top error code."""
    rows = []
    for (judge, protocol), group in _groups(judgments, order):
        errors = group.loc[group["parse_error"] != "", "parse_error"]
        rows.append({"judge": judge, "protocol": protocol, "calls": len(group), "parse failures": len(errors),
                     "format violations": int((~group["format_ok"].astype(bool)).sum()),
                     "retried": int((group["attempts"] > 1).sum()),
                     "most common error": errors.value_counts().index[0] if len(errors) else ""})
    return pd.DataFrame(rows)


def group_order(metrics: pd.DataFrame) -> list[tuple[str, str]]:
    return list(dict.fromkeys(zip(metrics["judge"], metrics["protocol"])))


def build_sections(metrics: pd.DataFrame, judgments: pd.DataFrame, failures: str,
                   diffs: pd.DataFrame | None = None) -> list[Section]:
    """Headline, paired differences, parse health, per-dimension and per-locale slices."""
    wrong = ("an unparseable grade counts as a wrong answer" if failures == "count_wrong"
             else "unparseable grades are left out (n_excluded)")
    sections = [
        Section("Headline (all pairs)", jm.headline(metrics),
                f"value [95% CI], bootstrap over pairs; fractions (the paper prints x100); {wrong}; "
                "'-' = not applicable (position bias needs pairwise judging in both orders)."),
    ]
    if diffs is not None and len(diffs):
        sections.append(Section(
            f"Paired differences vs {diffs['versus'].iloc[0]}", jm.difference_table(diffs),
            "difference [95% CI] of each judge x protocol minus the first, over the pairs both judged; every "
            "bootstrap resample draws the same pairs for both sides, so a CI excluding 0 is a real difference."))
    sections += [
        Section("Parse health", parse_health(judgments, group_order(metrics)),
                "Every judge call is kept: parse failures stay in the judgments stage with parse_error set."),
    ]
    for kind in ("dimension", "locale"):
        for statistic in ("macro_f1", "preference_accuracy"):
            sections.append(Section(f"{statistic} by {kind}", jm.slice_table(metrics, kind, statistic),
                                    "n = responses (macro_f1) or comparisons (preference_accuracy) in the slice."))
    bias = jm.slice_table(metrics, "dimension", "position_bias_rate")
    if len(bias):
        sections.append(Section("position_bias_rate by dimension", bias,
                                "Share of pairs whose derived preference changes when A and B are swapped."))
    return sections


def plot_headline(metrics: pd.DataFrame, statistics: tuple[str, ...] = ("macro_f1", "preference_accuracy")) -> bytes:
    """Bars per judge x protocol for each statistic, whiskers = 95% CI."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(statistics), figsize=(6 * len(statistics), 4), squeeze=False)
    part = metrics[metrics["slice"] == "all"]
    for ax, statistic in zip(axes[0], statistics):
        rows = part[part["statistic"] == statistic]
        if rows.empty or rows["value"].isna().all():
            _empty(ax, f"{statistic}: no values")
            continue
        labels = [f"{j}\n{p}" for j, p in zip(rows["judge"], rows["protocol"])]
        values = rows["value"].to_numpy(float)
        lo = np.where(np.isnan(rows["ci_lo"]), values, rows["ci_lo"])
        hi = np.where(np.isnan(rows["ci_hi"]), values, rows["ci_hi"])
        x = np.arange(len(rows))
        ax.bar(x, np.nan_to_num(values), color="#4c78a8")
        ax.errorbar(x, np.nan_to_num(values), yerr=[np.nan_to_num(values - lo), np.nan_to_num(hi - values)],
                    fmt="none", ecolor="black", capsize=3)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(statistic)
    return _figure_png(fig)


def plot_confusions(judgments: pd.DataFrame, order: list[tuple[str, str]] | None = None) -> bytes:
    """Gold x predicted grade counts, one panel per judge x protocol (the first MAX_CONFUSION_PANELS)."""
    plt = _pyplot()
    groups = _groups(judgments, order)[:MAX_CONFUSION_PANELS]
    cols = min(3, max(len(groups), 1))
    rows = max(1, math.ceil(len(groups) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    if not groups:
        _empty(axes[0][0], "no judgments")
    for ax, ((judge, protocol), group) in zip(axes.flat, groups):
        matrix = jm.confusion(group)
        ax.imshow(matrix.to_numpy(), cmap="Blues")
        for (i, j), count in np.ndenumerate(matrix.to_numpy()):
            ax.text(j, i, str(count), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(matrix.shape[1]))
        ax.set_xticklabels(matrix.columns)
        ax.set_yticks(range(matrix.shape[0]))
        ax.set_yticklabels(matrix.index)
        ax.set_xlabel("predicted")
        ax.set_ylabel("gold")
        ax.set_title(f"{judge} / {protocol}", fontsize=9)
    return _figure_png(fig)


def build_report(title: str, notes: list[str], metrics: pd.DataFrame, judgments: pd.DataFrame,
                 failures: str, diffs: pd.DataFrame | None = None) -> tuple[str, str, list[Figure]]:
    """(markdown, html, figures). The markdown has the summary tables; the HTML adds the full table and plots."""
    sections = build_sections(metrics, judgments, failures, diffs)
    full = Section("All statistics", metrics, "One row per judge x protocol x slice x statistic; n_used / "
                   "n_excluded count responses, comparisons, pairs or calls as the statistic requires.")
    figures = [
        Figure("Macro-F1 and preference accuracy", plot_headline(metrics), "Bars: value; whiskers: 95% CI."),
        Figure("Confusion matrices", plot_confusions(judgments, group_order(metrics)),
               "Rows: gold grade; columns: predicted (none = no grade extracted)."),
    ]
    return (render_markdown(title, notes, sections), render_html(title, notes, sections + [full], figures),
            figures)
