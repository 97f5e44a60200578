"""Agreement statistics: textbook examples, hand-worked tables and independent formulations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.agreement import (
    accuracy,
    bootstrap_ci,
    icc_2_1,
    kendall_tau_b,
    krippendorff_alpha,
    macro_f1,
    pearson,
    preference_accuracy,
    spearman,
)

NAN = math.nan

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", the example with missing data:
# 4 observers (columns here) x 12 units (rows); published alphas: nominal 0.743, ordinal 0.815,
# interval 0.849, ratio 0.797 (the ordinal and ratio figures are also pinned by the `krippendorff`
# package's tests).
KRIPPENDORFF_2011 = np.array([
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
]).T

# Shrout & Fleiss (1979), Table 2: 6 targets x 4 judges; published ICC(2,1) = .29.
SHROUT_FLEISS = np.array([[9, 2, 5, 8], [6, 1, 3, 2], [8, 4, 6, 8], [7, 1, 2, 6], [10, 5, 6, 9], [6, 2, 4, 7]])


# ----------------------------------------------------------------------------- ICC


def icc_by_projection(table: np.ndarray) -> float:
    """ICC(A,1) from least-squares fits of dummy-coded models and variance components."""
    n, k = table.shape
    y = table.reshape(-1)
    ones = np.ones((n * k, 1))
    units = np.kron(np.eye(n), np.ones((k, 1)))
    raters = np.kron(np.ones((n, 1)), np.eye(k))

    def residual_ss(design):
        beta = np.linalg.lstsq(design, y, rcond=None)[0]
        return float(((y - design @ beta) ** 2).sum())

    total = residual_ss(ones)
    ms_units = (total - residual_ss(np.hstack([ones, units]))) / (n - 1)
    ms_raters = (total - residual_ss(np.hstack([ones, raters]))) / (k - 1)
    ms_error = residual_ss(np.hstack([units, raters])) / ((n - 1) * (k - 1))
    var_units, var_raters = (ms_units - ms_error) / k, (ms_raters - ms_error) / n
    return var_units / (var_units + var_raters + ms_error)


def test_icc_shrout_fleiss_table():
    result = icc_2_1(SHROUT_FLEISS)
    assert round(result.value, 2) == 0.29
    assert (result.n_used, result.n_excluded) == (6, 0)
    assert result.value == pytest.approx(icc_by_projection(SHROUT_FLEISS.astype(float)))


def test_icc_hand_worked_and_missing_rows():
    # Units [1, 2], [3, 4], [5, 6]: grand mean 3.5, row means 1.5/3.5/5.5, column means 3/4.
    # MSR = 2·(4 + 0 + 4)/2 = 8; MSC = 3·(0.25 + 0.25)/1 = 1.5; residuals all 0 -> MSE = 0.
    # ICC = (8 - 0)/(8 + 0 + 2·1.5/3) = 8/9
    table = [[1, 2], [3, 4], [5, 6], [7, NAN]]
    result = icc_2_1(table)
    assert result.value == pytest.approx(8 / 9)
    assert (result.n_used, result.n_excluded) == (3, 1)
    assert math.isnan(icc_2_1([[1, 2]]).value)
    assert math.isnan(icc_2_1([[3, 3], [3, 3]]).value)


def test_icc_matches_the_projection_formula_on_random_tables():
    rng = np.random.default_rng(7)
    for _ in range(5):
        table = rng.normal(size=(12, 4)) + rng.normal(size=(12, 1)) * 2 + rng.normal(size=(1, 4))
        assert icc_2_1(table).value == pytest.approx(icc_by_projection(table))


# ----------------------------------------------------------------------------- Krippendorff's alpha


def alpha_by_pairs(table: np.ndarray, level: str) -> float:
    """Alpha from pairwise differences (no coincidence matrix): 1 - D_o / D_e."""
    units = [row[~np.isnan(row)] for row in table]
    units = [u for u in units if len(u) >= 2]
    values = np.concatenate(units)
    n = len(values)
    distinct, counts = np.unique(values, return_counts=True)
    count_of = dict(zip(distinct, counts))

    def delta2(a, b):
        if level == "nominal":
            return float(a != b)
        if level == "interval":
            return (a - b) ** 2
        lo, hi = min(a, b), max(a, b)  # ordinal: values from lo to hi, minus half the ends
        between = sum(c for v, c in count_of.items() if lo <= v <= hi)
        return (between - (count_of[a] + count_of[b]) / 2) ** 2

    observed = sum(
        sum(delta2(u[i], u[j]) for i in range(len(u)) for j in range(len(u)) if i != j) / (len(u) - 1)
        for u in units
    ) / n
    expected = sum(delta2(values[i], values[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    return 1 - observed / expected


@pytest.mark.parametrize("level, published", [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849),
                                              ("ratio", 0.797)])
def test_alpha_krippendorff_2011_example(level, published):
    result = krippendorff_alpha(KRIPPENDORFF_2011, level)
    assert round(result.value, 3) == published
    assert (result.n_used, result.n_excluded) == (11, 1)  # unit 12 has a single rating


def test_alpha_second_published_example():
    # 3 coders x 15 units (Hayes & Krippendorff style data; values pinned by the `krippendorff`
    # package's tests): nominal 0.691358, interval 0.810845.
    data = np.array([
        [NAN, NAN, NAN, NAN, NAN, 3, 4, 1, 2, 1, 1, 3, 3, NAN, 3],
        [1, NAN, 2, 1, 3, 3, 4, 3, NAN, NAN, NAN, NAN, NAN, NAN, NAN],
        [NAN, NAN, 2, 1, 3, 4, 4, NAN, 2, 1, 1, 3, 3, NAN, 4],
    ]).T
    assert round(krippendorff_alpha(data, "nominal").value, 6) == 0.691358
    assert round(krippendorff_alpha(data, "interval").value, 6) == 0.810845


def test_alpha_hand_worked():
    # Units [1, 1], [2, 2], [3, 4]: coincidences o11 = 2, o22 = 2, o34 = o43 = 1; n_1 = n_2 = 2,
    # n_3 = n_4 = 1, n = 6. Observed: (n - 1)·Σ o δ² = 5·(1 + 1) = 10.
    # Expected Σ n_c n_k δ² (both orders): (1,2) 2·2·1·2 = 8, (1,3) 2·1·4·2 = 16, (1,4) 2·1·9·2 = 36,
    # (2,3) 2·1·1·2 = 4, (2,4) 2·1·4·2 = 16, (3,4) 1·1·1·2 = 2 -> 82. alpha = 1 - 10/82.
    assert krippendorff_alpha([[1, 1], [2, 2], [3, 4]], "interval").value == pytest.approx(1 - 10 / 82)
    assert krippendorff_alpha([[1, 1], [2, 2], [3, 3]], "ordinal").value == pytest.approx(1.0)
    assert math.isnan(krippendorff_alpha([[1, NAN], [NAN, 2]]).value)  # no pairable unit
    with pytest.raises(ValueError, match="unknown level"):
        krippendorff_alpha([[1, 2]], "cosine")


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_alpha_matches_the_pairwise_formula_on_random_tables(level):
    rng = np.random.default_rng(3)
    table = rng.integers(1, 6, size=(25, 4)).astype(float)
    table[rng.random(table.shape) < 0.3] = NAN
    assert krippendorff_alpha(table, level).value == pytest.approx(alpha_by_pairs(table, level))


# ----------------------------------------------------------------------------- correlations


def test_correlations_with_ties_hand_worked():
    x, y = [1, 2, 2, 3, NAN], [1, 3, 2, 4, 5]
    # Pearson on the 4 complete pairs: dx = (-1, 0, 0, 1), dy = (-1.5, .5, -.5, 1.5);
    # r = 3 / sqrt(2·5).
    r = pearson(x, y)
    assert r.value == pytest.approx(3 / math.sqrt(10))
    assert (r.n_used, r.n_excluded) == (4, 1)
    # Spearman: ranks x (1, 2.5, 2.5, 4), y (1, 3, 2, 4) -> r of ranks = 4.5 / sqrt(4.5·5).
    assert spearman(x, y).value == pytest.approx(4.5 / math.sqrt(22.5))
    # Kendall tau-b: 5 concordant, 0 discordant, 1 pair tied in x only, 6 pairs:
    # (5 - 0) / sqrt((6 - 1)·(6 - 0)).
    assert kendall_tau_b(x, y).value == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]).value)  # constant input
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------- labels


def test_accuracy_and_macro_f1_hand_worked():
    y_true = [1, 1, 2, 2, 3, None]
    y_pred = [1, 2, 2, 2, 1, 3]
    # class 1: tp 1, fp 1, fn 1 -> F1 2/4; class 2: tp 2, fp 1, fn 0 -> 4/5; class 3: tp 0 -> 0.
    result = macro_f1(y_true, y_pred)
    assert result.value == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert (result.n_used, result.n_excluded) == (5, 1)
    assert accuracy(y_true, y_pred).value == pytest.approx(3 / 5)
    # Asking for an extra class that never occurs adds a zero to the average.
    assert macro_f1(y_true, y_pred, labels=[1, 2, 3, 4]).value == pytest.approx(1.3 / 4)
    assert macro_f1(["a", "b"], ["a", "b"]).value == 1.0


def test_preference_accuracy_counts_ties_as_a_class():
    human = [2.0, -1.0, 0.0, 0.05, 1.0, NAN]
    judge = [0.5, -3.0, 0.0, 0.5, -1.0, 1.0]
    # No tie band: human A, B, tie, A, A vs judge A, B, tie, A, B (last pair missing) -> 4/5 agree.
    assert preference_accuracy(human, judge).value == pytest.approx(4 / 5)
    # Tie band 0.1: human 0.05 becomes a tie while the judge's 0.5 stays A -> 3/5.
    result = preference_accuracy(human, judge, tie_margin=0.1)
    assert result.value == pytest.approx(3 / 5)
    assert result.n_excluded == 1


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(0)
    data = rng.normal(loc=1.0, size=400)
    est, lo, hi = bootstrap_ci(np.mean, data, n_boot=2000, seed=1)
    assert est == pytest.approx(data.mean())
    # Normal theory: half-width ~ 1.96·sd/sqrt(n) = 1.96·sd/20.
    assert (hi - lo) / 2 == pytest.approx(1.96 * data.std(ddof=1) / 20, rel=0.15)
    assert lo < est < hi
    assert bootstrap_ci(np.mean, data, n_boot=200, seed=1) == bootstrap_ci(np.mean, data, n_boot=200, seed=1)
    assert bootstrap_ci(np.mean, data, n_boot=200, seed=1) != bootstrap_ci(np.mean, data, n_boot=200, seed=2)


def test_bootstrap_resamples_whole_clusters():
    # 10 clusters of 3 rows. A replicate keeps all rows of every drawn cluster, so each id occurs a
    # multiple of 3 times; row-level resampling breaks that almost always.
    ids = np.repeat(np.arange(10), 3)

    def whole_clusters(sample_ids):
        counts = np.bincount(sample_ids)
        return float(np.all(counts % 3 == 0))

    assert bootstrap_ci(whole_clusters, ids, clusters=ids, n_boot=200) == (1.0, 1.0, 1.0)
    _, lo, _ = bootstrap_ci(whole_clusters, ids, n_boot=200)
    assert lo == 0.0


def test_bootstrap_takes_agreement_stats_and_tables():
    rng = np.random.default_rng(5)
    truth = rng.normal(size=(40, 1))
    table = truth + rng.normal(scale=0.5, size=(40, 3))
    est, lo, hi = bootstrap_ci(icc_2_1, table, clusters=np.arange(40) // 2, n_boot=300)
    assert est == pytest.approx(icc_2_1(table).value)
    assert lo <= est <= hi
    with pytest.raises(ValueError, match="clusters has 3 ids but the data has 40 rows"):
        bootstrap_ci(icc_2_1, table, clusters=[1, 2, 3])
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap_ci(pearson, [1, 2, 3], [1, 2])
