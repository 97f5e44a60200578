"""eval.judging.metrics on hand-made judgment tables; every expected number is worked out in the comments."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pandas as pd
import pytest

import eval.judging.metrics as jm
from eval.judging.jury_meta import Bootstrap

NAN = math.nan
NO_BOOT = Bootstrap(n_boot=0)


def judgments(rows: list[tuple], mode: str, protocol: str = "p") -> pd.DataFrame:
    """rows: (pair_id, dimension, locale, unit, gold_a, gold_b, pred_a, pred_b, parse_error, format_ok)."""
    cols = ["pair_id", "dimension", "locale", "unit", "gold_a", "gold_b", "pred_a", "pred_b", "parse_error",
            "format_ok"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(judge="j", protocol=protocol, mode=mode)


def stat(table: pd.DataFrame, statistic: str, slice_: str = "all") -> pd.Series:
    row = table[(table["statistic"] == statistic) & (table["slice"] == slice_)]
    assert len(row) == 1, (statistic, slice_)
    return row.iloc[0]


# Pairwise, both orders, grades already mapped back to the original A/B identity.
#   p1 gold (4, 2): AB -> (4, 2), BA -> (4, 2): preference A both times, no flip
#   p2 gold (3, 3): AB -> (5, 3) "A", BA -> (3, 5) "B": the first-shown response wins both times -> a flip
#   p3 gold (1, 5): AB unparsed, BA -> (2, 4) "B": the pair cannot show a flip -> excluded from position bias
PAIRWISE = judgments([
    ("p1", "tone", "de_DE", "AB", 4, 2, 4, 2, "", True),
    ("p1", "tone", "de_DE", "BA", 4, 2, 4, 2, "", True),
    ("p2", "tone", "fr_FR", "AB", 3, 3, 5, 3, "", False),
    ("p2", "tone", "fr_FR", "BA", 3, 3, 3, 5, "", True),
    ("p3", "fluency", "fr_FR", "AB", 1, 5, NAN, NAN, "missing_grade_a; missing_grade_b", False),
    ("p3", "fluency", "fr_FR", "BA", 1, 5, 2, 4, "", True),
], mode="pairwise")


def test_pairwise_hand_table_count_wrong():
    table = pd.DataFrame(jm.evaluate_group(PAIRWISE, NO_BOOT, "count_wrong"))
    # position bias: p1 no flip, p2 flip, p3 excluded -> 1/2
    bias = stat(table, "position_bias_rate")
    assert (bias["value"], bias["n_used"], bias["n_excluded"]) == (0.5, 2, 1)
    # 1 of 6 calls unparsed; 2 of 6 break the format (p2 AB, p3 AB)
    assert stat(table, "parse_failure_rate")["value"] == pytest.approx(1 / 6)
    assert stat(table, "format_violation_rate")["value"] == pytest.approx(2 / 6)
    # comparisons: p1 AB ok, p1 BA ok, p2 AB "A" vs tie wrong, p2 BA "B" vs tie wrong, p3 AB failed (wrong),
    # p3 BA "B" ok -> 3/6
    pref = stat(table, "preference_accuracy")
    assert (pref["value"], pref["n_used"], pref["n_excluded"]) == (0.5, 6, 0)
    # 12 responses: p1 4/4 right; p2 AB a 5 vs 3 wrong, b right; BA a right, b 5 vs 3 wrong; p3 AB two failures
    # (wrong); p3 BA 2 vs 1 and 4 vs 5 wrong -> 6/12
    acc = stat(table, "accuracy")
    assert (acc["value"], acc["n_used"]) == (0.5, 12)


def test_pairwise_hand_table_exclude_failures():
    table = pd.DataFrame(jm.evaluate_group(PAIRWISE, NO_BOOT, "exclude"))
    # the failed call leaves 5 comparisons (3 right) and 10 responses (6 right)
    pref, acc = stat(table, "preference_accuracy"), stat(table, "accuracy")
    assert (pref["value"], pref["n_used"], pref["n_excluded"]) == (0.6, 5, 1)
    assert (acc["value"], acc["n_used"], acc["n_excluded"]) == (0.6, 10, 2)
    # the parse-failure rate does not depend on the policy
    assert stat(table, "parse_failure_rate")["value"] == pytest.approx(1 / 6)


def test_slices_by_dimension_and_locale():
    table = pd.DataFrame(jm.evaluate_group(PAIRWISE, NO_BOOT))
    assert [s for s in dict.fromkeys(table["slice"])] == [
        "all", "dimension=fluency", "dimension=tone", "locale=de_DE", "locale=fr_FR"]
    # tone = p1 + p2: p1's 4 responses right, p2's 2 of 4 -> 6/8; fluency = p3 only: 0/4
    assert stat(table, "accuracy", "dimension=tone")["value"] == 0.75
    assert stat(table, "accuracy", "dimension=fluency")["value"] == 0.0
    # fr_FR = p2 + p3: the only pair with both orders parsed is p2, which flips -> 1/1
    bias = stat(table, "position_bias_rate", "locale=fr_FR")
    assert (bias["value"], bias["n_used"], bias["n_excluded"]) == (1.0, 1, 1)


# Pointwise: one call per response. p1 gold (1, 1) -> pred 1, 2; p2 gold (2, 2) -> pred 2, unparsed.
POINTWISE = judgments([
    ("p1", "fluency", "ja_JP", "a", 1, 1, 1, NAN, "", True),
    ("p1", "fluency", "ja_JP", "b", 1, 1, NAN, 2, "", True),
    ("p2", "fluency", "ja_JP", "a", 2, 2, 2, NAN, "", True),
    ("p2", "fluency", "ja_JP", "b", 2, 2, NAN, NAN, "missing_grade", False),
], mode="pointwise")


def test_pointwise_macro_f1_with_missing_classes():
    table = pd.DataFrame(jm.evaluate_group(POINTWISE, NO_BOOT, "count_wrong"))
    # gold 1 1 2 2, pred 1 2 2 none. grade 1: tp 1, fp 0, fn 1 -> F1 2/3; grade 2: tp 1, fp 1, fn 1 -> 2/4;
    # grades 3-5 never occur -> 0 each (sklearn's macro over labels=1..5 does the same): (2/3 + 1/2) / 5 = 7/30
    assert stat(table, "macro_f1")["value"] == pytest.approx(7 / 30)
    excluded = pd.DataFrame(jm.evaluate_group(POINTWISE, NO_BOOT, "exclude"))
    # without the failure: gold 1 1 2, pred 1 2 2: grade 1 2/3, grade 2 tp 1, fp 1, fn 0 -> 2/3: (4/3) / 5 = 4/15
    assert stat(excluded, "macro_f1")["value"] == pytest.approx(4 / 15)


def test_pointwise_preference_alpha_and_no_position_bias():
    table = pd.DataFrame(jm.evaluate_group(POINTWISE, NO_BOOT, "count_wrong"))
    # p1: gold tie, pred sign(1 - 2) = B -> wrong; p2: B's grade missing -> wrong: 0/2
    pref = stat(table, "preference_accuracy")
    assert (pref["value"], pref["n_used"]) == (0.0, 2)
    # interval alpha over units (1,1), (1,2), (2,2) (the failed response is missing): coincidences o11 = 2,
    # o12 = o21 = 1, o22 = 2; n_c = 3, 3; n = 6. D_o = o12 + o21 = 2, D_e = 2 * 3 * 3 = 18:
    # alpha = 1 - (n - 1) * 2 / 18 = 1 - 10/18 = 4/9
    alpha = stat(table, "krippendorff_alpha")
    assert alpha["value"] == pytest.approx(4 / 9) and (alpha["n_used"], alpha["n_excluded"]) == (3, 1)
    assert "position_bias_rate" not in set(table["statistic"])
    assert stat(table, "parse_failure_rate")["value"] == 0.25


def test_bootstrap_ci_brackets_the_estimate_and_resamples_pairs():
    table = pd.DataFrame(jm.evaluate_group(PAIRWISE, Bootstrap(n_boot=300, seed=1)))
    acc = stat(table, "accuracy")
    assert acc["ci_lo"] <= acc["value"] <= acc["ci_hi"]
    # p1 is always right (4/4), p2 half (2/4), p3 never (0/4); resampling whole pairs ranges from all-p3 (0.0)
    # to all-p1 (1.0), and a 95% interval around 0.5 must reach both sides of it
    assert 0.0 <= acc["ci_lo"] < 0.5 < acc["ci_hi"] <= 1.0
    # a statistic that is undefined has no CI and says why
    point = pd.DataFrame(jm.evaluate_group(POINTWISE.assign(pred_a=NAN, pred_b=NAN), Bootstrap(n_boot=50)))
    alpha = stat(point, "krippendorff_alpha")
    assert math.isnan(alpha["value"]) and math.isnan(alpha["ci_lo"]) and alpha["note"]


def test_evaluate_headline_and_confusion():
    both = pd.concat([PAIRWISE, POINTWISE.assign(protocol="q")], ignore_index=True)
    metrics = jm.evaluate(both, NO_BOOT)
    assert list(metrics.columns) == jm.COLUMNS
    head = jm.headline(metrics)
    assert list(head["protocol"]) == ["p", "q"]
    assert head.loc[0, "accuracy"] == "0.500" and head.loc[1, "position_bias_rate"] == "-"
    matrix = jm.confusion(POINTWISE)
    # responses: gold 1 -> pred 1 and 2; gold 2 -> pred 2 and none
    assert matrix.loc[1, "1"] == 1 and matrix.loc[1, "2"] == 1 and matrix.loc[2, "2"] == 1
    assert matrix.loc[2, "none"] == 1 and int(np.asarray(matrix).sum()) == 4
    by_dim = jm.slice_table(metrics, "dimension", "accuracy")
    assert by_dim.loc[0, "tone"] == "0.750 (n=8)"


def test_unknown_failure_policy_is_refused():
    with pytest.raises(ValueError, match="failure policy 'drop'"):
        jm.evaluate_group(PAIRWISE, NO_BOOT, "drop")


def test_doctests():
    import eval.judging.menlo_data as md

    assert doctest.testmod(md).failed == 0


def test_numeric_twins_agree_with_the_generic_statistics():
    from eval.agreement import accuracy, macro_f1

    rng = np.random.default_rng(3)
    for _ in range(20):
        gold = rng.integers(1, 6, 30).astype(float)
        pred = rng.choice([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, NAN], 30)
        assert jm.grade_accuracy(gold, pred) == pytest.approx(accuracy(list(gold), list(pred)), nan_ok=True)
        assert jm.f1_over_grades(gold, pred) == pytest.approx(macro_f1(gold, pred, labels=jm.GRADES), nan_ok=True)


# Paired protocol differences. Baseline "p" = PAIRWISE above (preference accuracy 3/6, grade accuracy 6/12).
# "q" judges the same three pairs perfectly in both orders: preference 6/6, grades 12/12.
PERFECT = judgments([(pid, dim, loc, unit, ga, gb, ga, gb, "", True)
                     for pid, dim, loc, unit, ga, gb, *_ in PAIRWISE.drop(columns=["judge", "protocol", "mode"])
                     .itertuples(index=False)], mode="pairwise", protocol="q")


def test_protocol_differences_are_paired_over_shared_pairs():
    diffs = jm.differences(pd.concat([PAIRWISE, PERFECT], ignore_index=True), Bootstrap(n_boot=200, seed=1))
    got = diffs.set_index("statistic")
    assert list(got["protocol"].unique()) == ["q"] and got["versus"].iloc[0] == "j / p"
    assert got.loc["preference_accuracy", "difference"] == pytest.approx(1 - 3 / 6)
    assert got.loc["accuracy", "difference"] == pytest.approx(1 - 6 / 12)
    assert (got["n_pairs"] == 3).all()
    # paired resampling: p1 is right under both protocols, so a resample of only p1 gives a difference of 0, one of
    # only p2 gives 1 (2 wrong comparisons fixed); every resample lies in [0, 1], and so does the CI
    pref = got.loc["preference_accuracy"]
    assert 0 <= pref["ci_lo"] <= pref["difference"] <= pref["ci_hi"] <= 1


def test_protocol_differences_use_only_the_pairs_both_judged():
    only_p1 = PERFECT[PERFECT["pair_id"] == "p1"]
    diffs = jm.differences(pd.concat([PAIRWISE, only_p1], ignore_index=True), NO_BOOT).set_index("statistic")
    # on p1 alone the baseline is right too: no difference, and no CI without resamples
    assert diffs.loc["preference_accuracy", "difference"] == 0.0 and (diffs["n_pairs"] == 1).all()
    assert math.isnan(diffs.loc["accuracy", "ci_lo"])
    assert jm.differences(PAIRWISE, NO_BOOT).empty
    table = jm.difference_table(jm.differences(pd.concat([PAIRWISE, PERFECT]), NO_BOOT))
    assert list(table.columns) == ["judge", "protocol", "versus", "n_pairs", "macro_f1", "accuracy",
                                   "preference_accuracy"]
    assert table.loc[0, "preference_accuracy"] == "0.500"
