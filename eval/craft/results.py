"""Results maths of the CRAFT CORD comparison (paper 002, §6): constraint accuracy, quality and cost per system.

Input: the job's results table, one row per (CORD instance, system) with ``id``, ``level``, ``system``, ``text``
(the original), ``revision``, ``constraints_json`` (``eval.craft.cord.CordRow.to_row``), ``error`` and the cost columns
``llm_calls``, ``prompt_tokens``, ``completion_tokens``, ``seconds``.

**Constraint accuracy** is checked on CORD's gold constraints (never the planner's own calls): a constraint holds
when every one of its gold calls holds on the revision (a word-count range is two calls, both must hold); an
instance's accuracy is the fraction of its constraints that hold; a row with an ``error`` (a failed system run or a
bad CORD line kept with ``data.on_error: keep``) counts as 0 on every constraint, so failures lower the score
instead of vanishing; a kept bad CORD line has no constraint to check, so it gets one ``bad_input`` check that
fails (its instance scores 0 in its level). Per level (C1-C4 and "all", C0 has no constraint) the accuracy is the mean over instances;
per constraint type it is the share of that type's constraints that hold. 95% CIs: ``eval.agreement.bootstrap_ci``
(percentile bootstrap, resampling instances: a type's constraints of one instance move together).

**Quality**: the R_g each system's answer got from the job's scorer (``quality`` column, ``eval.craft.quality``:
App. D.3's normalised perplexity and BARTScore by default, anchored at the input, so the copy row scores
``(0 + 100 + SOME_nom) / 3``, 33.3 with SOME's fixed term at 0; ``copy_quality`` is the copy's own score). A frame
without that column (an older run, a test) falls back to the difflib proxy, ``eval.craft.quality.difflib_quality``.

**Search children that beat the copy** (:func:`children_beating_copy`, :func:`children_share`): how many of a
search's usable children meet more gold constraints than the input does. If the reviser never proposes one, no
reward can make the search beat the copy.

**The copy floor**: every table carries a ``copy`` row, the input returned unchanged (:func:`with_copy_floor`, no
model call). CORD's constraints were set from a shorter GPT-4o revision, yet copying already meets about half of
them; a system is only better than doing nothing where it beats this row.

**Significance** (:func:`sign_test`): the paper's one-tailed sign test of one system against another over paired
instances (ties dropped), with a bootstrap of instances for the share of wins.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from eval.agreement import bootstrap_ci
from eval.craft.quality import difflib_quality
from eval.craft.tools import check

COPY = "copy"
SYSTEM_ORDER = (COPY, "direct", "iter", "agent", "mcts", "mcts_oracle_rc", "mcts_gold_planner")
COST_COLUMNS = ("llm_calls", "prompt_tokens", "completion_tokens", "seconds")


def with_copy_floor(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` plus one ``copy`` row per instance: the input as the revision, no model call, no cost.

    A kept bad CORD line stays failed in the copy row too (it has no text to copy).
    """
    if results.empty or COPY in set(results["system"]):
        return results
    first = results.drop_duplicates("id").copy()
    first["system"] = COPY
    first["revision"] = first["text"]
    first["error"] = [e if e.startswith("bad input") else "" for e in first["error"]]
    for col in COST_COLUMNS:
        if col in first:
            first[col] = 0
    for col in ("stop_reason", "guard_flags_json", "detail_json"):
        if col in first:
            first[col] = "" if col == "stop_reason" else "{}"
    if "copy_quality" in first:
        first["quality"] = first["copy_quality"]
        first["quality_json"] = first.get("copy_quality_json", "{}")
    return pd.concat([first, results], ignore_index=True)


def constraints_met(constraints: list[dict], original: str, revision: str) -> int:
    """How many gold constraints ``revision`` meets (a constraint holds when all its ``;``-joined calls hold).

    >>> cs = [{"type": "w", "call": 'word_count_check(5, "less than")'},
    ...       {"type": "k", "call": 'keyword_keep_removal_check("cat", "keep")'}]
    >>> original = "The cat sat on the mat today."
    >>> constraints_met(cs, original, "The cat sat."), constraints_met(cs, original, "A dog sat on the mat all day.")
    (2, 0)
    """
    met = 0
    for c in constraints:
        calls = [part.strip() for part in c["call"].split(";") if part.strip()]
        met += bool(calls) and all(check(call, original, revision).satisfied is True for call in calls)
    return met


def children_beating_copy(tree: list[dict], constraints: list[dict], original: str) -> dict:
    """Over a search tree's dump (``SearchResult.tree``): children, usable (non-degenerate) children, and the
    usable ones that meet more gold constraints than the input returned unchanged (``better``)."""
    floor = constraints_met(constraints, original, original)
    kids = [n for n in tree if n.get("parent_id") is not None]
    usable = [n for n in kids if not n.get("degenerate")]
    better = sum(constraints_met(constraints, original, n["text"]) > floor for n in usable)
    return {"children": len(kids), "usable": len(usable), "better": int(better), "copy_met": floor}


def children_share(results: pd.DataFrame) -> pd.DataFrame:
    """Per search system: children, usable children, those beating the copy and their share (of usable children),
    and the instances where at least one child beat it; from ``detail_json["children_vs_copy"]``."""
    rows = []
    for system in _systems(results) if len(results) else []:
        mine = [json.loads(d).get("children_vs_copy") for d in results[results["system"] == system]["detail_json"]]
        mine = [m for m in mine if m]
        if not mine:
            continue
        usable, better = sum(m["usable"] for m in mine), sum(m["better"] for m in mine)
        rows.append({"system": system, "instances": len(mine), "children": sum(m["children"] for m in mine),
                     "usable": usable, "better_than_copy": better,
                     "share": better / usable if usable else float("nan"),
                     "instances_with_one": sum(m["better"] > 0 for m in mine)})
    return pd.DataFrame(rows, columns=["system", "instances", "children", "usable", "better_than_copy", "share",
                                       "instances_with_one"])


def sign_test(checks: pd.DataFrame, system: str, baseline: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """One-tailed sign test (the paper's significance test): does ``system`` beat ``baseline`` per instance?

    Pairs are instances both systems ran; an instance counts as a win when its accuracy is higher, a loss when
    lower; ties are dropped. ``p`` is the binomial tail P(X >= wins | n = wins + losses, 1/2); ``ci_low/high``
    bound the share of wins among untied instances (percentile bootstrap of instances).

    >>> c = pd.DataFrame({"id": ["a", "a", "b", "b", "c", "c"], "level": 1, "system": ["m", "i"] * 3,
    ...                   "type": "t", "satisfied": [True, False, True, False, True, True]})
    >>> r = sign_test(c, "m", "i"); (r["wins"], r["losses"], r["ties"], r["p"])
    (2, 0, 1, 0.25)
    """
    from scipy.stats import binomtest

    acc = checks.groupby(["system", "id"])["satisfied"].mean().unstack(0)
    if system not in acc or baseline not in acc:
        return {"system": system, "baseline": baseline, "wins": 0, "losses": 0, "ties": 0, "p": float("nan"),
                "win_share": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    both = acc[[system, baseline]].dropna()
    diff = (both[system] - both[baseline]).to_numpy()
    wins, losses = int((diff > 0).sum()), int((diff < 0).sum())
    n = wins + losses
    p = float(binomtest(wins, n, 0.5, alternative="greater").pvalue) if n else float("nan")
    share, lo, hi = _ci((diff[diff != 0] > 0), n_boot=n_boot, seed=seed)
    return {"system": system, "baseline": baseline, "wins": wins, "losses": losses, "ties": int(len(diff) - n),
            "p": p, "win_share": share, "ci_low": lo, "ci_high": hi}


def constraint_checks(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (instance, system, gold constraint): ``id, level, system, type, satisfied``."""
    out = []
    for row in results.itertuples(index=False):
        constraints = json.loads(row.constraints_json)
        if row.error and not constraints:
            constraints = [{"type": "bad_input", "call": ""}]
        for c in constraints:
            calls = [part.strip() for part in c["call"].split(";") if part.strip()]
            ok = bool(calls) and not row.error and all(check(call, row.text, row.revision).satisfied is True for call in calls)
            out.append({"id": row.id, "level": int(row.level), "system": row.system, "type": c["type"],
                        "satisfied": bool(ok)})
    return pd.DataFrame(out, columns=["id", "level", "system", "type", "satisfied"])


def _ci(values: np.ndarray, clusters=None, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    return bootstrap_ci(np.mean, values.astype(float), clusters=clusters, n_boot=n_boot, seed=seed)


def _systems(frame: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(frame["system"]))
    return [s for s in SYSTEM_ORDER if s in present] + [s for s in present if s not in SYSTEM_ORDER]


def accuracy_by_level(checks: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Mean per-instance constraint accuracy per system and level (C1..C4, then "all"), with 95% CIs."""
    per_instance = checks.groupby(["system", "level", "id"], sort=False)["satisfied"].mean().reset_index()
    rows = []
    for system in _systems(per_instance) if len(per_instance) else []:
        mine = per_instance[per_instance["system"] == system]
        groups = [(f"C{lv}", mine[mine["level"] == lv]) for lv in sorted(mine["level"].unique())] + [("all", mine)]
        for name, part in groups:
            est, lo, hi = _ci(part["satisfied"].to_numpy(), n_boot=n_boot, seed=seed)
            rows.append({"system": system, "level": name, "instances": len(part), "accuracy": est,
                         "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows, columns=["system", "level", "instances", "accuracy", "ci_low", "ci_high"])


def accuracy_by_type(checks: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Share of satisfied constraints per system and constraint type, CIs resampling instances."""
    rows = []
    for system in _systems(checks) if len(checks) else []:
        mine = checks[checks["system"] == system]
        for ctype in sorted(mine["type"].unique()):
            part = mine[mine["type"] == ctype]
            est, lo, hi = _ci(part["satisfied"].to_numpy(), clusters=part["id"].to_numpy(), n_boot=n_boot, seed=seed)
            rows.append({"system": system, "type": ctype, "constraints": len(part), "accuracy": est,
                         "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows, columns=["system", "type", "constraints", "accuracy", "ci_low", "ci_high"])


def quality_table(results: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Mean text quality (R_g) per system (failed rows score 0), with 95% CIs; the recorded ``quality`` column,
    or the difflib proxy where a frame has none. Also the mean raw perplexity and BARTScore where recorded."""
    rows = []
    for system in _systems(results) if len(results) else []:
        mine = results[results["system"] == system]
        if "quality" in mine:
            scores = np.array([0.0 if r.error else float(r.quality) for r in mine.itertuples(index=False)])
        else:
            scores = np.array([0.0 if r.error else difflib_quality(r.text, r.revision)
                               for r in mine.itertuples(index=False)])
        est, lo, hi = _ci(scores, n_boot=n_boot, seed=seed)
        parts = [json.loads(p) for p in mine["quality_json"]] if "quality_json" in mine else []
        row = {"system": system, "instances": len(mine), "quality": est, "ci_low": lo, "ci_high": hi}
        for key in ("ppl", "bart"):
            values = [p[key] for p in parts if key in p]
            row[key] = float(np.mean(values)) if values else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=["system", "instances", "quality", "ci_low", "ci_high", "ppl", "bart"])


def cost_table(results: pd.DataFrame, relative_to: str = "iter") -> pd.DataFrame:
    """LLM calls, tokens and seconds per system: totals and means per instance, plus failed rows, and each mean
    relative to ``relative_to``'s (Table 11's "x Iter"; NaN when that system did not run)."""
    rows = []
    for system in _systems(results) if len(results) else []:
        mine = results[results["system"] == system]
        row = {"system": system, "instances": len(mine), "failed": int((mine["error"] != "").sum())}
        for col in COST_COLUMNS:
            row[col] = float(mine[col].sum())
            row[f"{col}_per_instance"] = float(mine[col].mean())
        rows.append(row)
    out = pd.DataFrame(rows)
    base = out[out["system"] == relative_to] if len(out) else out
    for col in COST_COLUMNS:
        ref = float(base[f"{col}_per_instance"].iloc[0]) if len(base) else float("nan")
        out[f"{col}_vs_{relative_to}"] = out[f"{col}_per_instance"] / ref if ref else float("nan")
    return out


def calls_per_solved(results: pd.DataFrame, checks: pd.DataFrame, system: str = "mcts") -> float:
    """A system's LLM calls over the instances it solved (every gold constraint holds); inf when none is solved.

    Instances without constraints (C0) are left out of both counts.
    """
    mine = checks[checks["system"] == system]
    if mine.empty:
        return float("nan")
    solved = mine.groupby("id")["satisfied"].all()
    spent = results[(results["system"] == system) & results["id"].isin(solved.index)]["llm_calls"].sum()
    return float(spent / solved.sum()) if solved.sum() else float("inf")


def sample_revisions(results: pd.DataFrame, per_system: int = 3) -> pd.DataFrame:
    """A few revisions per system for W&B and the report (first instances in id order), texts cut to 600 chars."""
    frame = results.sort_values(["system", "id"]).groupby("system", sort=False).head(per_system)
    # one line per cell: a newline would break the markdown table
    cut = frame.assign(text=frame["text"].str.slice(0, 600).str.replace(r"\s+", " ", regex=True),
                       revision=frame["revision"].str.slice(0, 600).str.replace(r"\s+", " ", regex=True))
    return cut[["system", "id", "level", "instruction", "text", "revision", "error"]].reset_index(drop=True)
