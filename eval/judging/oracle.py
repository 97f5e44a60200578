"""The reference oracle of paper 000's positive control, and the judge-signal figure measured against it.

Pure (pandas/numpy, no Ray). Where a source has human references, sentence SARI of each candidate against them
says which candidate a reference-aware judge would pick:

- `oracle_verdict_rows` turns the candidates of every (source, policy) into best/worst rows shaped like the jury's
  (`train.preference.pairs.build_pairs` takes either): Best = highest sentence SARI, Worst = lowest, ties to the lower index
  (model-name order), the same for every aspect. Judge name `oracle:sari`, so the pairs say where they came from.
- `judge_signal` compares a jury's panel Best / Worst with the oracle: how often the jury's Best is a candidate of
  maximal SARI (and Worst one of minimal SARI), beside the chance level of a judge that picks uniformly. Ties count
  for the jury (any top-SARI candidate is the oracle's Best) and raise the chance level by the same rule, so
  duplicates among the candidates cannot fake a signal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from eval.agreement import bootstrap_ci
from eval.metrics.sari import sentence_sari

ORACLE_JUDGE = "oracle:sari"
ASPECTS = ("Lexical", "Structural", "Overall")


def candidate_sari(source: str, candidates: Sequence[str | None], references: Sequence[str]) -> list[float | None]:
    """Sentence SARI of each candidate against the references; None for a failed or empty candidate."""
    return [sentence_sari(source, c, list(references)) if isinstance(c, str) and c.strip() else None
            for c in candidates]


def oracle_verdict_rows(candidates: pd.DataFrame, references: dict[tuple[str, str], list[str]]) -> pd.DataFrame:
    """Best/worst rows by sentence SARI, one per (id, policy), shaped like the best/worst jury's rows.

    Args:
        candidates: the generate stage's rows (id, policy, model, source, candidate, generation_error).
        references: (id, policy) -> references of that source for that policy.

    Returns:
        Rows with id, policy, source, judge, format, models_json, candidates_json, scores_json, verdict_json,
        parse_error (`fewer than two scored candidates` or `no score spread` when there is no verdict).

    Raises:
        KeyError: a source has no references (the config check refuses such corpora, so this is a bug).
    """
    rows = []
    for (sid, policy), group in candidates.groupby(["id", "policy"], sort=True):
        group = group.sort_values("model")
        texts = [c if not err else None for c, err in zip(group["candidate"], group["generation_error"])]
        refs = references[(sid, policy)]
        scores = candidate_sari(group["source"].iloc[0], texts, refs)
        valid = [i for i, s in enumerate(scores) if s is not None]
        error = ""
        if len(valid) < 2:
            error = "fewer than two scored candidates"
        elif len({scores[i] for i in valid}) < 2:
            error = "no score spread"
        if error:
            verdict = {a: {"best": None, "worst": None, "error": error} for a in ASPECTS}
        else:
            best = max(valid, key=lambda i: (scores[i], -i))
            worst = min(valid, key=lambda i: (scores[i], i))
            verdict = {a: {"best": best, "worst": worst, "error": ""} for a in ASPECTS}
        rows.append({"id": sid, "policy": policy, "source": group["source"].iloc[0], "judge": ORACLE_JUDGE,
                     "format": "best_worst", "models_json": json.dumps(list(group["model"])),
                     "candidates_json": json.dumps([t if t is not None else "" for t in texts]),
                     "scores_json": json.dumps(scores), "verdict_json": json.dumps(verdict), "parse_error": error})
    return pd.DataFrame(rows)


def signal_rows(panel: pd.DataFrame, oracle: pd.DataFrame) -> pd.DataFrame:
    """Per (id, policy): did the panel's Best / Worst land on an oracle-best / oracle-worst candidate?

    Args:
        panel: id, policy, best_model, worst_model (None where the panel gave no verdict).
        oracle: `oracle_verdict_rows` output (models_json, scores_json per id and policy).

    Returns:
        id, policy, judged, best_hit, worst_hit, chance_best, chance_worst, oracle_best_model, oracle_worst_model
        (hits are NaN for unjudged sources and sources whose candidates all tie).
    """
    scores = {(r.id, r.policy): (json.loads(r.models_json), json.loads(r.scores_json)) for r in oracle.itertuples()}
    rows = []
    for r in panel.itertuples():
        models, sari = scores[(r.id, r.policy)]
        scored = {m: s for m, s in zip(models, sari) if s is not None}
        row = {"id": r.id, "policy": r.policy, "judged": bool(pd.notna(r.best_model) and pd.notna(r.worst_model)),
               "best_hit": np.nan, "worst_hit": np.nan, "chance_best": np.nan, "chance_worst": np.nan,
               "oracle_best_model": None, "oracle_worst_model": None}
        if len(scored) >= 2 and len(set(scored.values())) >= 2:
            top, bottom = max(scored.values()), min(scored.values())
            tops = [m for m in models if scored.get(m) == top]
            bottoms = [m for m in models if scored.get(m) == bottom]
            # a uniform judge picks among the candidates it was shown; failed ones were never shown
            row.update(chance_best=len(tops) / len(scored), chance_worst=len(bottoms) / len(scored),
                       oracle_best_model=tops[0], oracle_worst_model=bottoms[0])
            if row["judged"]:
                row.update(best_hit=float(r.best_model in tops), worst_hit=float(r.worst_model in bottoms))
        rows.append(row)
    return pd.DataFrame(rows)


def judge_signal(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per policy: agreement of the panel's Best / Worst with the oracle, 95% bootstrap CIs, chance level.

    Rates are over the sources the panel judged and whose candidates the oracle can rank; `coverage` says what
    share of sources that is (an unparseable judge has low coverage, which is its own signal).
    """
    out = []
    for policy, group in rows.groupby("policy", sort=True):
        ranked = group[group["chance_best"].notna()]
        judged = ranked[ranked["judged"]]
        entry = {"policy": policy, "sources": len(group), "judged_and_ranked": len(judged),
                 "coverage": len(judged) / len(group) if len(group) else np.nan}
        for side in ("best", "worst"):
            hits = judged[f"{side}_hit"].to_numpy(dtype=float)
            if len(hits):
                est, lo, hi = bootstrap_ci(np.mean, hits, n_boot=n_boot, seed=seed)
            else:
                est = lo = hi = np.nan
            entry.update({f"{side}_agreement": est, f"{side}_lo": lo, f"{side}_hi": hi,
                          f"{side}_chance": float(judged[f"chance_{side}"].mean()) if len(judged) else np.nan})
        out.append(entry)
    return pd.DataFrame(out)


def oracle_distribution(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 3 of the oracle: per policy and model, how often it is the oracle's Best / Worst (%)."""
    ranked = rows[rows["oracle_best_model"].notna()]
    out = []
    for policy, group in ranked.groupby("policy", sort=True):
        n = len(group)
        models = sorted(set(group["oracle_best_model"]) | set(group["oracle_worst_model"]))
        for model in models:
            out.append({"policy": policy, "model": model,
                        "oracle_preferred_pct": 100.0 * float((group["oracle_best_model"] == model).sum()) / n,
                        "oracle_dispreferred_pct": 100.0 * float((group["oracle_worst_model"] == model).sum()) / n})
    return pd.DataFrame(out, columns=["policy", "model", "oracle_preferred_pct", "oracle_dispreferred_pct"])
