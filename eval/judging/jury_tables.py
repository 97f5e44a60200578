"""Driver-side tables over jury output: one score per candidate, one row per (policy, system).

Pure pandas/numpy over the stage Parquet files; no Ray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from eval.agreement import bootstrap_ci
from eval.judging.aggregate import aggregate_scores


def candidate_scores(judgments: pd.DataFrame, how: str = "mean") -> pd.DataFrame:
    """Aggregate judge scores per candidate; unparseable judgments count as missing, never as a score."""
    scored = judgments[judgments["format"] == "score"]
    rows = []
    for (sid, policy, model), group in scored.groupby(["id", "policy", "model"], sort=True):
        agg = aggregate_scores([s if not pd.isna(s) else None for s in group["score"]], how=how)
        rows.append({"id": sid, "policy": policy, "model": model, "jury_score": agg.value,
                     "n_judges": agg.n_used, "n_unparsed": agg.n_missing})
    return pd.DataFrame(rows, columns=["id", "policy", "model", "jury_score", "n_judges", "n_unparsed"])


def _words(text: str) -> int:
    return len(str(text).split())


def system_table(candidates: pd.DataFrame, scores: pd.DataFrame, seed: int = 0, n_boot: int = 1000) -> pd.DataFrame:
    """Per (policy, model): jury mean with a source-clustered bootstrap 95% CI, failures and surface stats."""
    merged = candidates.merge(scores, on=["id", "policy", "model"], how="left")
    rows = []
    for (policy, model), group in merged.groupby(["policy", "model"], sort=True):
        ok = group[group["generation_error"] == ""]
        valid = ok.dropna(subset=["jury_score"])
        values = valid["jury_score"].to_numpy(dtype=float)
        if len(values):
            est, lo, hi = bootstrap_ci(np.mean, values, clusters=valid["id"].to_numpy(), n_boot=n_boot, seed=seed)
        else:
            est = lo = hi = float("nan")
        src_words = ok["source"].map(_words).replace(0, np.nan)
        rows.append({
            "policy": policy, "model": model, "candidates": len(group),
            "failed_generations": int((group["generation_error"] != "").sum()),
            "scored": len(values), "unparsed_judgments": int(ok["n_unparsed"].fillna(0).sum()),
            "jury_mean": est, "ci95_lo": lo, "ci95_hi": hi,
            "mean_words": float(ok["candidate"].map(_words).mean()) if len(ok) else float("nan"),
            "compression": float((ok["candidate"].map(_words) / src_words).mean()) if len(ok) else float("nan"),
            "copy_rate": float((ok["candidate"].str.strip() == ok["source"].str.strip()).mean())
            if len(ok) else float("nan"),
        })
    return pd.DataFrame(rows)
