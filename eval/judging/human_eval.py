"""Human evaluation round trip: a blind rating sheet out, annotators' 1-5 ratings in, the papers' statistics out.

Paper 000 (Table 4): 60 random sources per policy x the systems' outputs, randomised and blind, one annotator,
5-point Likert; the table is the mean per system. Paper 001 (§3.2, Fig. 1): synthetic sentences x the four writers'
simplifications rated 1-5 by three annotators; ICC(2,1) among them, Spearman of the mean human score with model size
and with the LLM jury, and the mean rating per model size normalised to 0-1.

`make_sheet` samples sources, shuffles every (source, system) output into a random order under opaque item ids and
splits the result into the **sheet** (what annotators see: item_id, source, output, an empty `rating`) and the
**key** (item_id -> source id, system and whatever else the analysis needs, e.g. size_b or the jury score), so
the annotator cannot tell systems apart. `read_ratings` checks a filled sheet (every item rated exactly once with an
integer 1-5; the error names the file, line and column) and `analyse` joins ratings to the key.

Pure: pandas, numpy and eval.agreement only.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from eval.agreement import AgreementStat, bootstrap_ci, icc_2_1, spearman

SHEET_COLUMNS = ["item_id", "source", "output", "rating"]


class RatingsError(ValueError):
    """A filled rating sheet that cannot be used; the message names the file, line and column."""


def make_sheet(outputs: pd.DataFrame, n_sources: int, seed: int = 0, text: str = "output",
               keep: tuple[str, ...] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sheet, key) for `n_sources` sources drawn by `seed` (0 = all) with every system's output for each.

    Args:
        outputs: one row per (id, system): `id`, `source`, `system`, the `text` column and the `keep` columns.
        n_sources: sources to sample; more than exist is an error.
        seed: sampling and shuffling seed.
        text: the column annotators rate.
        keep: extra columns carried into the key (never shown), e.g. ("size_b", "jury").

    Raises:
        ValueError: n_sources larger than the number of sources, or a missing column.
    """
    missing = [c for c in ("id", "source", "system", text, *keep) if c not in outputs.columns]
    if missing:
        raise ValueError(f"outputs lack the columns {missing}")
    ids = sorted(outputs["id"].unique())
    if n_sources > len(ids):
        raise ValueError(f"asked for {n_sources} sources, only {len(ids)} have outputs")
    rng = np.random.default_rng(seed)
    picked = set(ids) if n_sources == 0 else set(rng.choice(ids, size=n_sources, replace=False).tolist())
    rows = outputs[outputs["id"].isin(picked)].reset_index(drop=True)
    rows = rows.iloc[rng.permutation(len(rows))].reset_index(drop=True)
    # opaque, stable ids: nothing in them reveals the system or the source order
    item_ids = [hashlib.sha256(f"{seed}|{i}|{s}".encode()).hexdigest()[:10]
                for i, s in zip(rows["id"], rows["system"])]
    sheet = pd.DataFrame({"item_id": item_ids, "source": rows["source"], "output": rows[text].fillna(""),
                          "rating": ""})
    key = pd.DataFrame({"item_id": item_ids, "id": rows["id"], "system": rows["system"],
                        **{c: rows[c] for c in keep}})
    return sheet, key


def read_ratings(path: str | Path, key: pd.DataFrame, annotator: str = "") -> pd.DataFrame:
    """A filled sheet (CSV) as rows (item_id, annotator, rating); the annotator defaults to the file's stem.

    Raises:
        RatingsError: no `item_id` / `rating` column, an item not in the key or rated twice, a rating that is not an
            integer 1-5 (file, line and column named), or items of the key left unrated.
    """
    path = Path(path)
    try:
        sheet = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise RatingsError(f"{path}: not a readable CSV ({exc})") from exc
    for column in ("item_id", "rating"):
        if column not in sheet.columns:
            raise RatingsError(f"{path}: no {column!r} column (the sheet's columns are {SHEET_COLUMNS})")
    known, seen, rows = set(key["item_id"]), {}, []
    for index, (item, rating) in enumerate(zip(sheet["item_id"], sheet["rating"])):
        line = index + 2  # header is line 1
        if item not in known:
            raise RatingsError(f"{path}: line {line}, column 'item_id': {item!r} is not an item of this sheet's key")
        if item in seen:
            raise RatingsError(f"{path}: line {line}, column 'item_id': {item!r} already rated on line {seen[item]}")
        seen[item] = line
        value = rating.strip()
        if value not in ("1", "2", "3", "4", "5"):
            raise RatingsError(f"{path}: line {line}, column 'rating': {rating!r} is not an integer from 1 to 5")
        rows.append({"item_id": item, "annotator": annotator or path.stem, "rating": int(value)})
    unrated = len(known - set(seen))
    if unrated:
        raise RatingsError(f"{path}: {unrated} items of the key are not rated (every row needs a rating)")
    return pd.DataFrame(rows)


def per_item(key: pd.DataFrame, ratings: pd.DataFrame) -> pd.DataFrame:
    """The key with one column per annotator and `human` = their mean rating."""
    wide = ratings.pivot(index="item_id", columns="annotator", values="rating")
    annotators = list(wide.columns)
    wide.columns = [f"rater:{a}" for a in annotators]
    out = key.merge(wide.reset_index(), on="item_id", how="left")
    out["human"] = out[[f"rater:{a}" for a in annotators]].mean(axis=1)
    return out


def system_means(items: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Paper 000 Table 4 / paper 001 Fig. 1: mean human rating per system with a 95% bootstrap CI over sources, and
    the mean normalised to 0-1 ((mean - 1) / 4, as Fig. 1 plots it)."""
    rows = []
    for system, df in items.groupby("system", sort=True):
        values = df["human"].to_numpy(dtype=float)
        mean, lo, hi = bootstrap_ci(lambda v: float(np.mean(v)), values, clusters=df["id"].to_numpy(),
                                    n_boot=n_boot, seed=seed)
        rows.append({"system": system, "n": len(df), "mean": mean, "ci_lo": lo, "ci_hi": hi,
                     "normalised": (mean - 1) / 4})
    return pd.DataFrame(rows)


def statistics(items: pd.DataFrame, against: tuple[str, ...] = (), n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Paper 001's figures: ICC(2,1) among the annotators, Spearman of the mean human rating with each column of
    `against` (e.g. size_b -> the paper's 0.627, jury -> 0.672); 95% CIs by bootstrap over source ids."""
    raters = [c for c in items.columns if c.startswith("rater:")]
    ids = items["id"].to_numpy()
    rows = []

    def add(name: str, fn, *arrays) -> None:
        full: AgreementStat = fn(*arrays)
        lo = hi = math.nan
        if math.isfinite(full.value) and n_boot:
            _, lo, hi = bootstrap_ci(fn, *arrays, clusters=ids, n_boot=n_boot, seed=seed)
        rows.append({"statistic": name, "value": float(full.value), "ci_lo": lo, "ci_hi": hi,
                     "n_used": int(full.n_used)})

    if len(raters) >= 2:
        add(f"ICC(2,1) among {len(raters)} annotators", icc_2_1, items[raters].to_numpy(dtype=float))
    for column in against:
        add(f"Spearman(human, {column})", spearman, items["human"].to_numpy(dtype=float),
            items[column].to_numpy(dtype=float))
    return pd.DataFrame(rows, columns=["statistic", "value", "ci_lo", "ci_hi", "n_used"])


def pairwise_outcomes(items: pd.DataFrame, system: str, baseline: str) -> pd.DataFrame:
    """MENLO Table 7 from pointwise ratings: per source, `system` wins when its mean human rating is higher than
    `baseline`'s, ties when equal. Rates over the sources rated for both (a source missing one is counted apart).

    >>> items = pd.DataFrame({"id": ["a", "a", "b", "b", "c", "c"], "system": ["t", "b"] * 3,
    ...                       "human": [4.0, 2.0, 3.0, 3.0, 1.0, 5.0]})
    >>> pairwise_outcomes(items, "t", "b").iloc[0].to_dict()["win"]
    0.3333333333333333
    """
    wide = items.pivot_table(index="id", columns="system", values="human", aggfunc="mean")
    both = wide[[system, baseline]].dropna() if {system, baseline} <= set(wide.columns) else wide.iloc[0:0]
    diff = (both[system] - both[baseline]).to_numpy(dtype=float)
    n = len(diff)
    rate = (lambda mask: float(mask.sum() / n)) if n else (lambda mask: math.nan)
    return pd.DataFrame([{"system": system, "baseline": baseline, "sources": n, "win": rate(diff > 0),
                          "tie": rate(diff == 0), "loss": rate(diff < 0),
                          "unpaired": int(len(wide) - n)}])
