"""The results table of a policy-simplification run: systems x metrics with bootstrap 95% intervals.

Pure (numpy/pandas, no Ray). Inputs are plain rows: one system output per (source id, system), and the
references of each source.

- Corpus SARI is not a mean of sentence scores, so its interval resamples *sentences* and rescores the summed
  n-gram counts (`eval.metrics.sari.score_stats`) of each resample: exact corpus SARI per replicate, and cheap, since
  the counts are computed once.
- The gain of a system over the baseline is a paired bootstrap (the same resampled sentences for both).
- BLEU, FKGL and compression come from `eval.metrics.text.score_corpus` as point estimates.
- Pairwise jury win rates resample source sentences (both orders of one source stay together).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from eval.agreement import bootstrap_ci
from eval.judging.aggregate import pairwise_winrate
from eval.metrics.sari import compute_corpus_stats, score_stats
from eval.metrics.text import refs_to_streams, score_corpus

POINT_METRICS = ("bleu", "fkgl", "compression_ratio")


def sari_counts(sources: Sequence[str], outputs: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
    """Per-sentence SARI counts, shape (sentences, 4 orders, 9 counts); `references` is one list per sentence."""
    streams = refs_to_streams(references)
    return np.asarray(compute_corpus_stats(list(sources), list(outputs), streams), dtype=np.int64)


def sari_of_counts(counts: np.ndarray) -> float:
    """Corpus SARI of the summed counts of some sentences."""
    return score_stats(counts.sum(axis=0).tolist()).sari


def results_table(outputs: pd.DataFrame, references: dict[str, list[str]], baseline: str, n_boot: int = 1000,
                  seed: int = 0) -> pd.DataFrame:
    """One row per system: SARI with its 95% CI, the paired SARI gain over `baseline` with its CI, point metrics.

    Args:
        outputs: columns id, system, source, output (one row per source and system; a failed generation is an
            empty output and is scored as such, never dropped).
        references: source id -> its references.
        baseline: the system the gains are measured against (e.g. "vanilla").
        n_boot: bootstrap resamples.
        seed: bootstrap seed.

    Raises:
        ValueError: a system does not cover the same source ids as the baseline, or an id has no references.
    """
    ids = _check_coverage(outputs, references, baseline)
    refs = [references[i] for i in ids]
    by_system = {name: group.set_index("id").loc[ids] for name, group in outputs.groupby("system", sort=True)}
    base_counts = sari_counts(by_system[baseline]["source"], by_system[baseline]["output"], refs)
    rows = []
    for name, table in by_system.items():
        counts = base_counts if name == baseline else sari_counts(table["source"], table["output"], refs)
        sari, lo, hi = bootstrap_ci(sari_of_counts, counts, n_boot=n_boot, seed=seed)
        row = {"system": name, "n": len(ids), "sari": sari, "sari_lo": lo, "sari_hi": hi}
        if name == baseline:
            row.update(sari_gain=0.0, sari_gain_lo=0.0, sari_gain_hi=0.0)
        else:
            gain = bootstrap_ci(lambda a, b: sari_of_counts(a) - sari_of_counts(b), counts, base_counts,
                                n_boot=n_boot, seed=seed)
            row.update(sari_gain=gain[0], sari_gain_lo=gain[1], sari_gain_hi=gain[2])
        point = score_corpus(list(POINT_METRICS), list(table["source"]), list(table["output"]), refs_to_streams(refs))
        row.update({k: point[k] for k in POINT_METRICS})
        row["empty_outputs"] = int((table["output"].str.strip() == "").sum())
        rows.append(row)
    return pd.DataFrame(rows)


def add_learned_metric(table: pd.DataFrame, outputs: pd.DataFrame, references: dict[str, list[str]], name: str,
                       score: Callable[[list[str], list[str], list[list[str]]], list[float]], n_boot: int = 1000,
                       seed: int = 0) -> pd.DataFrame:
    """`table` (from `results_table`) with `<name>`, `<name>_lo`, `<name>_hi`: the mean of a per-output learned
    metric (LENS: `score(sources, outputs, references) -> one float per output`) per system, 95% CI over sources.

    >>> outputs = pd.DataFrame({"id": ["a", "b"] * 2, "system": ["v", "v", "t", "t"], "source": ["s", "s"] * 2,
    ...                         "output": ["x", "xy", "xyz", "xyzw"]})
    >>> length = lambda src, out, refs: [float(len(o)) for o in out]
    >>> add_learned_metric(pd.DataFrame({"system": ["t", "v"]}), outputs, {"a": ["r"], "b": ["r"]}, "len", length,
    ...                    n_boot=0)["len"].tolist()
    [3.5, 1.5]
    """
    ids = _check_coverage(outputs, references, outputs["system"].iloc[0])
    values = {}
    for system, group in outputs.groupby("system", sort=True):
        group = group.set_index("id").loc[ids]
        scores = np.asarray(score(list(group["source"]), list(group["output"]), [references[i] for i in ids]),
                            dtype=float)
        if len(scores) != len(ids):
            raise ValueError(f"{name}: scored {len(scores)} of {len(ids)} outputs of {system!r}")
        values[system] = bootstrap_ci(np.mean, scores, n_boot=n_boot, seed=seed) if n_boot else \
            (float(scores.mean()), math.nan, math.nan)
    out = table.copy()
    for suffix, k in (("", 0), ("_lo", 1), ("_hi", 2)):
        out[name + suffix] = [values[s][k] for s in out["system"]]
    return out


def _check_coverage(outputs: pd.DataFrame, references: dict[str, list[str]], baseline: str) -> list[str]:
    missing_cols = {"id", "system", "source", "output"} - set(outputs.columns)
    if missing_cols:
        raise ValueError(f"outputs: missing column(s) {sorted(missing_cols)}")
    systems = set(outputs["system"])
    if baseline not in systems:
        raise ValueError(f"baseline system {baseline!r} not among {sorted(systems)}")
    ids = sorted(outputs.loc[outputs["system"] == baseline, "id"])
    for name, group in outputs.groupby("system"):
        if sorted(group["id"]) != ids:
            raise ValueError(f"system {name!r} does not cover the same {len(ids)} source ids as {baseline!r}")
    no_refs = [i for i in ids if not references.get(i)]
    if no_refs:
        raise ValueError(f"{len(no_refs)} source id(s) have no references, e.g. {no_refs[0]!r}")
    return ids


def winrate_with_ci(outcomes: Sequence[str | None], clusters: Sequence[str], n_boot: int = 1000,
                    seed: int = 0) -> dict:
    """Win rate of system A (ties half) with a 95% CI over source clusters, and the outcome counts.

    Args:
        outcomes: "A", "B", "tie" or None (unparseable judgment: counted, not in the rate) per judgment, already
            mapped to systems.
        clusters: source id of each judgment.
    """
    summary = pairwise_winrate(list(outcomes))
    scores = np.array([{"A": 1.0, "B": 0.0, "tie": 0.5}.get(o, math.nan) for o in outcomes])
    keep = ~np.isnan(scores)
    if not keep.any():
        return {**dataclasses.asdict(summary), "win_rate": math.nan, "win_rate_lo": math.nan, "win_rate_hi": math.nan}
    rate, lo, hi = bootstrap_ci(np.mean, scores[keep], clusters=np.asarray(clusters)[keep], n_boot=n_boot, seed=seed)
    return {**dataclasses.asdict(summary), "win_rate": rate, "win_rate_lo": lo, "win_rate_hi": hi}


def outcome_for(winner: str, model_a: str, model_b: str, system: str) -> str | None:
    """Map a pairwise verdict on shown positions ("A"/"B"/"tie"/"") to `system`'s view: "A" = `system` won.

    >>> outcome_for("B", "vanilla", "trained", "trained")
    'A'
    >>> outcome_for("", "vanilla", "trained", "trained") is None
    True
    """
    if winner == "tie":
        return "tie"
    if winner not in ("A", "B"):
        return None
    if system not in (model_a, model_b):
        raise ValueError(f"system {system!r} is neither {model_a!r} nor {model_b!r}")
    won = model_a if winner == "A" else model_b
    return "A" if won == system else "B"
