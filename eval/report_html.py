"""Report rendering: tables to markdown and a self-contained HTML page with matplotlib plots as base64 PNG <img>s.

    sections = [Section("Inter-judge agreement", format_stats(stats[stats.section == "inter_judge"]), "note")]
    figures = [Figure("Judge x judge Spearman", plot_heatmap(matrix), "caption")]
    html = render_html("Jury meta-evaluation", ["a note"], sections, figures)

NaN prints as "n/a" everywhere: a statistic with nothing to compute on is shown, not hidden. Plots with no data
say so inside the image. Pure: matplotlib (Agg backend) and pandas only; no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

NA = "n/a"


@dataclass
class Section:
    title: str
    table: pd.DataFrame
    note: str = ""


@dataclass
class Figure:
    title: str
    png: bytes
    caption: str = ""


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def fmt(value, digits: int = 3) -> str:
    """Numbers to text with `digits` decimals (integers as integers); NaN/None -> "n/a"."""
    if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
        return NA
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        text = f"{value:.{digits}f}"
        return text[1:] if text.startswith("-") and not text.strip("-0.") else text  # no "-0.000"
    return str(value)


def format_table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Every cell as display text (so markdown and HTML print NaN the same way)."""
    return df.apply(lambda col: col.map(lambda v: fmt(v, digits))) if len(df) else df.astype(str)


def ci_text(lo: float, hi: float) -> str:
    return NA if math.isnan(lo) or math.isnan(hi) else f"[{fmt(lo)}, {fmt(hi)}]"


def format_stats(stats: pd.DataFrame) -> pd.DataFrame:
    """Stats rows -> display columns: set, a, b, statistic, value, 95% CI, n used, n excluded, note."""
    out = pd.DataFrame({
        "set": stats["set"], "a": stats["a"], "b": stats["b"], "statistic": stats["statistic"],
        "value": stats["value"].map(fmt),
        "95% CI": [ci_text(lo, hi) for lo, hi in zip(stats["ci_lo"], stats["ci_hi"])],
        "n used": stats["n_used"].map(fmt), "n excluded": stats["n_excluded"].map(fmt), "note": stats["note"],
    })
    return out.reset_index(drop=True)


def pivot_cells(stats: pd.DataFrame, index: str = "a", columns: tuple[str, ...] = ("set", "b")) -> pd.DataFrame:
    """One cell per (index, columns) as "rho [lo, hi] n=k": a compact grid, e.g. metrics x human scores."""
    if stats.empty:
        return pd.DataFrame()
    cells = stats.assign(
        cell=[f"{fmt(v)} {ci_text(lo, hi)} n={n}" for v, lo, hi, n in
              zip(stats["value"], stats["ci_lo"], stats["ci_hi"], stats["n_used"])],
        column=stats[list(columns)].astype(str).agg("/".join, axis=1))
    order = list(dict.fromkeys(cells[index]))
    grid = cells.pivot(index=index, columns="column", values="cell").reindex(order)
    return grid[list(dict.fromkeys(cells["column"]))].reset_index()


# ---------------------------------------------------------------------------------------------------------------
# Plots


def _figure_png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_system_means(systems: pd.DataFrame) -> bytes:
    """Mean jury score per system with its 95% CI, one panel per set (synthetic systems in size order)."""
    plt = _pyplot()
    sets = list(dict.fromkeys(systems["set"])) if len(systems) else []
    fig, axes = plt.subplots(1, max(len(sets), 1), figsize=(4.5 * max(len(sets), 1), 3.6), squeeze=False)
    if not sets:
        _empty(axes[0, 0], "no systems")
    for ax, name in zip(axes[0], sets):
        df = systems[systems["set"] == name]
        labels = [m if math.isnan(s) else f"{m}\n({s:g}B)" for m, s in zip(df["model"], df["size_b"])]
        x, y = np.arange(len(df)), df["jury_mean"].to_numpy(dtype=float)
        lo, hi = df["ci_lo"].to_numpy(dtype=float), df["ci_hi"].to_numpy(dtype=float)
        ok = ~np.isnan(y)
        if ok.any():
            err = np.vstack([np.nan_to_num(y - lo), np.nan_to_num(hi - y)])
            ax.bar(x[ok], y[ok], color="#4C72B0")
            ax.errorbar(x[ok], y[ok], yerr=err[:, ok], fmt="none", ecolor="black", capsize=4)
        for xi in x[~ok]:
            ax.text(xi, 0.1, NA, ha="center", color="gray")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(df) - 0.4)
        ax.set_ylim(0, 5.2)
        ax.set_title(name)
        ax.set_ylabel("mean jury score (1-5)")
    return _figure_png(fig)


def plot_human_vs_jury(scores: pd.DataFrame, sets: tuple[str, ...] = ("simpeval", "asset")) -> bytes:
    """Per human-rated set: human score (x) against jury mean (y) per pair; pairs missing either are left out."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(sets), figsize=(4.5 * len(sets), 3.6), squeeze=False)
    for ax, name in zip(axes[0], sets):
        df = scores[scores["set"] == name] if "set" in scores else scores.iloc[:0]
        h = df["human"].to_numpy(dtype=float) if "human" in df else np.array([])
        j = df["jury"].to_numpy(dtype=float) if "jury" in df else np.array([])
        ok = ~(np.isnan(h) | np.isnan(j))
        ax.set_title(f"{name}: {int(ok.sum())} of {len(df)} pairs")
        if ok.any():
            ax.scatter(h[ok], j[ok], s=16, alpha=0.7, color="#DD8452")
            ax.set_xlabel("human score (mean of raters)")
            ax.set_ylabel("jury mean (1-5)")
        else:
            _empty(ax, "no pair has both a human and a jury score")
    return _figure_png(fig)


def plot_heatmap(matrix: pd.DataFrame, title: str = "Spearman") -> bytes:
    """Square correlation matrix with values written in the cells (n/a where undefined)."""
    plt = _pyplot()
    n = max(len(matrix), 1)
    fig, ax = plt.subplots(figsize=(1.1 * n + 2.5, 1.0 * n + 1.5))
    if matrix.empty:
        _empty(ax, "no scorers")
        return _figure_png(fig)
    values = matrix.to_numpy(dtype=float)
    image = ax.imshow(np.ma.masked_invalid(values), vmin=-1, vmax=1, cmap="RdBu_r")
    for i in range(values.shape[0]):
        for k in range(values.shape[1]):
            ax.text(k, i, fmt(values[i, k], 2), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(n), list(matrix.columns), rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(n), list(matrix.index), fontsize=8)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046)
    return _figure_png(fig)


# ---------------------------------------------------------------------------------------------------------------
# Documents


def render_markdown(title: str, notes: list[str], sections: list[Section]) -> str:
    parts = [f"# {title}", ""] + [f"- {n}" for n in notes] + [""]
    for section in sections:
        parts += [f"## {section.title}", ""]
        if section.note:
            parts += [section.note, ""]
        table = format_table(section.table)
        # the cells are display text already: tabulate must not re-parse "0.100" as a number
        parts += [table.to_markdown(index=False, disable_numparse=True) if len(table) else "(no rows)", ""]
    return "\n".join(parts)


_STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px}
th{background:#f0f0f0}td{text-align:right}td:first-child{text-align:left}.note{color:#555;font-size:13px}
figure{margin:1em 0}figcaption{color:#555;font-size:13px}"""


def render_html(title: str, notes: list[str], sections: list[Section], figures: list[Figure]) -> str:
    """A single self-contained page: notes, every table, every figure inline (data: URIs)."""
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", "<ul>"] + [f"<li>{esc(n)}</li>" for n in notes] + ["</ul>"]
    for section in sections:
        body.append(f"<h2>{esc(section.title)}</h2>")
        if section.note:
            body.append(f'<p class="note">{esc(section.note)}</p>')
        table = format_table(section.table)
        body.append(table.to_html(index=False, escape=True, border=0) if len(table) else "<p>(no rows)</p>")
    for figure in figures:
        data = base64.b64encode(figure.png).decode("ascii")
        body.append(f"<figure><h2>{esc(figure.title)}</h2>"
                    f'<img alt="{esc(figure.title)}" src="data:image/png;base64,{data}"/>'
                    f"<figcaption>{esc(figure.caption)}</figcaption></figure>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# ---------------------------------------------------------------------------------------------------------------
# The jury meta-evaluation report

STAT_SECTIONS = (
    ("inter_judge", "Inter-judge agreement",
     "ICC(2,1) with the judges as raters; pairs where any judge has no usable score are excluded (counted)."),
    ("human_raters", "Human inter-rater agreement",
     "SimpEval's three ratings as raters (the paper reports 0.228 on all 360 rows)."),
    ("human_vs_jury", "Human vs jury (instance level)",
     ("Spearman on raw scores; ICC(2,1) on scores z-scored within the set (human 0-100 and jury 1-5 scales "
      "differ).")),
    ("judge_vs_jury", "Each judge vs the jury",
     ("spearman: against the mean of all judges (includes the judge); spearman_vs_rest: against the mean of the "
      "other judges.")),
    ("expected_trend", "Expected trend (synthetic set)",
     ("Instance-level Spearman of each scorer with the simplifier's size_b; monotone_means = 1 when per-simplifier "
      "jury means never fall as size grows.")),
)


def build_report(title: str, notes: list[str], overview: pd.DataFrame, health: pd.DataFrame,
                 systems: pd.DataFrame, stats: pd.DataFrame, matrix: pd.DataFrame,
                 scores: pd.DataFrame, full: pd.DataFrame | None = None) -> tuple[str, str, list[Figure]]:
    """(markdown, html, figures) of the jury meta-evaluation from its tables."""
    sections = [Section("Pairs", overview, "Every pair is kept: failed generations and unparsed judgments are "
                        "counted here and excluded from the statistics that need them."),
                Section("Jury health", health, "Judgments whose output had no parsable `Answer: [k]` stay in the "
                        "jury stage with parse_error set."),
                Section("Mean jury score per system", systems, "95% CI: bootstrap over source sentences.")]
    for key, heading, note in STAT_SECTIONS:
        part = stats[stats["section"] == key]
        if len(part):
            sections.append(Section(heading, format_stats(part), note))
    metric_rows = stats[stats["section"] == "metric_vs_human"]
    sections.append(Section("Metric meta-evaluation: Spearman with human ratings", pivot_cells(metric_rows),
                            "Cells: rho [95% CI] n=pairs used. Raw signs: FKGL is a grade level (lower = simpler)."))
    sections.append(Section("Spearman between judges (all pairs pooled)", matrix.reset_index(names="scorer")))
    figures = [
        Figure("Mean jury score per system", plot_system_means(systems), "Bars: mean jury score; whiskers: 95% CI."),
        Figure("Human vs jury", plot_human_vs_jury(scores), "One point per pair with both scores."),
        Figure("Judge x judge Spearman", plot_heatmap(matrix, "Spearman (pairwise complete)"),
               "n/a: fewer than two pairs scored by both, or a constant scorer."),
    ]
    if full is not None and len(full):
        note = ("Paper 001 Fig. 3 on the synthetic set: judges (ablations included), the jury mean, the metrics "
                "oriented so that higher = better (-fkgl) and model size (size_b).")
        sections.append(Section("Full Spearman matrix (paper 001 Fig. 3, synthetic set)",
                                full.reset_index(names="scorer"), note))
        figures.append(Figure("Full Spearman matrix", plot_heatmap(full, "Spearman, synthetic set"), note))
    return render_markdown(title, notes, sections), render_html(title, notes, sections, figures), figures
