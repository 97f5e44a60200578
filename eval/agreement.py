"""Agreement statistics between raters, judges and metrics (numpy/scipy only).

Layout: a *ratings table* is an array of shape (n_units, n_raters): one row per rated item
(sentence, output, pair), one column per rater; `NaN` marks a missing rating. Paired statistics
take two equally long 1-D arrays.

Missing values are never imputed. Each function drops what it cannot use and says how much:
every statistic returns an `AgreementStat(value, n_used, n_excluded)` (usable as a float):

- ICC(2,1): rows with any missing rating are dropped (the two-way ANOVA needs a full table);
  n_used/n_excluded count rows.
- Krippendorff's alpha: uses every pairable value; units with fewer than two ratings are dropped;
  n_used/n_excluded count units.
- Paired statistics (correlations, accuracy, macro-F1, preference accuracy): pairs where either
  side is missing (NaN or None) are dropped; n_used/n_excluded count pairs.

A statistic that is undefined on the data left (constant ratings, too few units) is NaN.

`bootstrap_ci` gives percentile confidence intervals by a clustered bootstrap: it resamples
clusters (e.g. source sentences, whose several outputs are not independent) with replacement.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats as sps


class AgreementStat(NamedTuple):
    """A statistic with the number of items used and excluded (rows, units or pairs)."""

    value: float
    n_used: int
    n_excluded: int

    def __float__(self) -> float:
        return float(self.value)


# ----------------------------------------------------------------------------- helpers


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, np.floating) and np.isnan(value)
    )


def _ratings_table(ratings) -> np.ndarray:
    table = np.asarray(ratings, dtype=float)
    if table.ndim != 2:
        raise ValueError(f"ratings must be a 2-D table (n_units, n_raters), got shape {table.shape}")
    return table


def _paired_numbers(x, y) -> tuple[np.ndarray, np.ndarray, int]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"paired statistics need two 1-D arrays of equal length, got {x.shape} and {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    return x[keep], y[keep], int((~keep).sum())


def _paired_labels(y_true: Sequence, y_pred: Sequence) -> tuple[list, list, int]:
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} labels but y_pred has {len(y_pred)}")
    pairs = [(t, p) for t, p in zip(y_true, y_pred) if not (_is_missing(t) or _is_missing(p))]
    return [t for t, _ in pairs], [p for _, p in pairs], len(y_true) - len(pairs)


# ----------------------------------------------------------------------------- ICC


def icc_2_1(ratings) -> AgreementStat:
    """ICC(2,1): two-way random effects, absolute agreement, single rater (Shrout & Fleiss 1979).

    With n units, k raters, row means r_i, column means c_j and grand mean g:
    MSR = k·Σ(r_i - g)²/(n-1), MSC = n·Σ(c_j - g)²/(k-1),
    MSE = Σ(x_ij - r_i - c_j + g)²/((n-1)(k-1)), and
    ICC(2,1) = (MSR - MSE) / (MSR + (k-1)·MSE + k·(MSC - MSE)/n).

    Args:
        ratings: table (n_units, n_raters); rows with a missing rating are dropped.

    Returns:
        AgreementStat counting rows; NaN with fewer than 2 complete rows or 2 raters, or when
        every rating is equal.
    """
    table = _ratings_table(ratings)
    complete = ~np.isnan(table).any(axis=1)
    table, dropped = table[complete], int((~complete).sum())
    n, k = table.shape
    if n < 2 or k < 2:
        return AgreementStat(math.nan, n, dropped)
    grand = table.mean()
    rows, cols = table.mean(axis=1), table.mean(axis=0)
    msr = k * ((rows - grand) ** 2).sum() / (n - 1)
    msc = n * ((cols - grand) ** 2).sum() / (k - 1)
    mse = ((table - rows[:, None] - cols[None, :] + grand) ** 2).sum() / ((n - 1) * (k - 1))
    denominator = msr + (k - 1) * mse + k * (msc - mse) / n
    value = (msr - mse) / denominator if denominator > 0 else math.nan
    return AgreementStat(float(value), n, dropped)


# ----------------------------------------------------------------------------- Krippendorff's alpha


def _squared_differences(values: np.ndarray, marginals: np.ndarray, level: str) -> np.ndarray:
    if level == "nominal":
        return (values[:, None] != values[None, :]).astype(float)
    if level == "interval":
        return (values[:, None] - values[None, :]) ** 2
    if level == "ratio":
        sums = values[:, None] + values[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(sums == 0, 0.0, (values[:, None] - values[None, :]) / sums)
        return ratio**2
    # ordinal: the values between c and k (inclusive) counted by their marginals, minus half
    # of the two end categories.
    cumulative = np.cumsum(marginals)
    lo, hi = np.minimum.outer(np.arange(len(values)), np.arange(len(values))), np.maximum.outer(
        np.arange(len(values)), np.arange(len(values))
    )
    between = cumulative[hi] - cumulative[lo] + marginals[lo]
    return (between - (marginals[:, None] + marginals[None, :]) / 2) ** 2


def coincidence_matrix(ratings) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Krippendorff's coincidence matrix of a ratings table.

    Args:
        ratings: table (n_units, n_raters) with NaN for missing ratings.

    Returns:
        (values, o, n_units_used, n_units_excluded): the sorted distinct values and the matrix
        o[c, k] = Σ_u (number of c-k pairs of ratings in unit u, ordered) / (m_u - 1).
    """
    table = _ratings_table(ratings)
    counts_per_unit = (~np.isnan(table)).sum(axis=1)
    pairable = counts_per_unit >= 2
    used = table[pairable]
    values = np.unique(used[~np.isnan(used)])
    # One row per unit: how often each value occurs in it.
    counts = np.stack([(used == v).sum(axis=1) for v in values], axis=1).astype(float) if len(values) else \
        np.zeros((len(used), 0))
    weights = 1.0 / (counts_per_unit[pairable] - 1)
    o = (counts * weights[:, None]).T @ counts - np.diag((counts * weights[:, None]).sum(axis=0))
    return values, o, int(pairable.sum()), int((~pairable).sum())


def krippendorff_alpha(ratings, level: str = "interval") -> AgreementStat:
    """Krippendorff's alpha for a ratings table with missing values.

    alpha = 1 - (n - 1)·Σ o_ck δ²_ck / Σ n_c n_k δ²_ck, with o the coincidence matrix, n_c its
    row sums and n their total (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability").

    Args:
        ratings: table (n_units, n_raters), NaN = missing.
        level: 'interval' (δ² = (c-k)²), 'ordinal' (rank-based δ² from the marginals),
            'nominal' or 'ratio'.

    Returns:
        AgreementStat counting units; NaN when no unit has two ratings or all values agree by
        construction (a single distinct value).
    """
    if level not in ("nominal", "ordinal", "interval", "ratio"):
        raise ValueError(f"unknown level {level!r}: expected nominal, ordinal, interval or ratio")
    values, o, used, excluded = coincidence_matrix(ratings)
    marginals = o.sum(axis=1)
    n = marginals.sum()
    if used == 0 or len(values) < 2:
        return AgreementStat(math.nan, used, excluded)
    delta2 = _squared_differences(values, marginals, level)
    expected = (np.outer(marginals, marginals) * delta2).sum()
    value = 1.0 - (n - 1) * (o * delta2).sum() / expected if expected > 0 else math.nan
    return AgreementStat(float(value), used, excluded)


# ----------------------------------------------------------------------------- correlations


def _correlation(fn: Callable, x, y) -> AgreementStat:
    x, y, dropped = _paired_numbers(x, y)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return AgreementStat(math.nan, len(x), dropped)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = fn(x, y)
    return AgreementStat(float(value), len(x), dropped)


def pearson(x, y) -> AgreementStat:
    """Pearson's r over the pairs where both values are present."""
    return _correlation(lambda a, b: sps.pearsonr(a, b).statistic, x, y)


def spearman(x, y) -> AgreementStat:
    """Spearman's rho (ties get their average rank) over complete pairs."""
    return _correlation(lambda a, b: sps.spearmanr(a, b).statistic, x, y)


def kendall_tau_b(x, y) -> AgreementStat:
    """Kendall's tau-b, which corrects for ties in either variable, over complete pairs."""
    return _correlation(lambda a, b: sps.kendalltau(a, b, variant="b").statistic, x, y)


# ----------------------------------------------------------------------------- labels


def accuracy(y_true: Sequence, y_pred: Sequence) -> AgreementStat:
    """Share of complete pairs whose labels are equal (NaN when none is complete)."""
    t, p, dropped = _paired_labels(y_true, y_pred)
    value = sum(a == b for a, b in zip(t, p)) / len(t) if t else math.nan
    return AgreementStat(float(value), len(t), dropped)


def macro_f1(y_true: Sequence, y_pred: Sequence, labels: Sequence | None = None) -> AgreementStat:
    """Unweighted mean of per-class F1 for graded (or any discrete) labels.

    Args:
        y_true: reference labels (e.g. human grades 1..5); None/NaN = missing.
        y_pred: predicted labels.
        labels: classes to average over; default: every label seen in either list. A class
            with no true and no predicted item scores F1 = 0 (it was asked for and never hit).

    Returns:
        AgreementStat counting pairs.
    """
    t, p, dropped = _paired_labels(y_true, y_pred)
    if not t:
        return AgreementStat(math.nan, 0, dropped)
    classes = list(labels) if labels is not None else sorted(set(t) | set(p), key=repr)
    f1s = []
    for c in classes:
        tp = sum(a == c and b == c for a, b in zip(t, p))
        fp = sum(a != c and b == c for a, b in zip(t, p))
        fn = sum(a == c and b != c for a, b in zip(t, p))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return AgreementStat(float(sum(f1s) / len(f1s)), len(t), dropped)


def preference_accuracy(human, judge, tie_margin: float = 0.0) -> AgreementStat:
    """Agreement of preference directions, with ties as their own class.

    Each input holds, per pair (A, B), a preference strength such as score(A) - score(B):
    > tie_margin means A preferred, < -tie_margin B preferred, otherwise a tie. The result is
    the share of pairs where human and judge land in the same of the three classes.

    Args:
        human: reference preferences (NaN = missing).
        judge: predicted preferences.
        tie_margin: half-width of the tie band (absolute values up to it count as ties).

    Returns:
        AgreementStat counting pairs.
    """
    h, j, dropped = _paired_numbers(human, judge)
    if len(h) == 0:
        return AgreementStat(math.nan, 0, dropped)
    h_class = np.where(h > tie_margin, 1, np.where(h < -tie_margin, -1, 0))
    j_class = np.where(j > tie_margin, 1, np.where(j < -tie_margin, -1, 0))
    return AgreementStat(float((h_class == j_class).mean()), len(h), dropped)


# ----------------------------------------------------------------------------- bootstrap


def bootstrap_ci(
    stat_fn: Callable[..., Any], *data, clusters=None, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05,
) -> tuple[float, float, float]:
    """Clustered percentile bootstrap: resample clusters with replacement, recompute the statistic.

    Args:
        stat_fn: called as stat_fn(*resampled_data); returns a float or an AgreementStat.
        *data: arrays sharing their first axis (rows), e.g. human and judge scores, or a ratings
            table.
        clusters: cluster id of each row (e.g. source sentence ids); None makes every row its own
            cluster. A resample draws as many clusters as there are, with replacement, and keeps
            all rows of each drawn cluster (a cluster drawn twice appears twice).
        n_boot: number of resamples.
        seed: seed of numpy's default_rng, so results are reproducible.
        alpha: 1 - confidence level (0.05 gives a 95% interval).

    Returns:
        (estimate on the full data, lower, upper). Resamples where the statistic is not finite
        are left out of the percentiles; if none is finite, lower and upper are NaN.
    """
    if not data:
        raise ValueError("bootstrap_ci needs at least one data array")
    arrays = [np.asarray(d) for d in data]
    n_rows = len(arrays[0])
    if any(len(a) != n_rows for a in arrays):
        raise ValueError(f"data arrays differ in length: {[len(a) for a in arrays]}")
    if not 0 < alpha < 1 or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot >= 1, got alpha={alpha}, n_boot={n_boot}")
    groups = _cluster_rows(clusters, n_rows)
    estimate = float(stat_fn(*arrays))
    rng = np.random.default_rng(seed)
    replicates = []
    for _ in range(n_boot):
        picked = rng.integers(0, len(groups), size=len(groups))
        rows = np.concatenate([groups[i] for i in picked])
        replicates.append(float(stat_fn(*(a[rows] for a in arrays))))
    finite = np.array([r for r in replicates if math.isfinite(r)])
    if len(finite) == 0:
        return estimate, math.nan, math.nan
    lo, hi = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return estimate, float(lo), float(hi)


def _cluster_rows(clusters, n_rows: int) -> list[np.ndarray]:
    if clusters is None:
        return [np.array([i]) for i in range(n_rows)]
    ids = np.asarray(clusters)
    if len(ids) != n_rows:
        raise ValueError(f"clusters has {len(ids)} ids but the data has {n_rows} rows")
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    boundaries = np.flatnonzero(np.diff(inverse[order])) + 1
    return np.split(order, boundaries)
