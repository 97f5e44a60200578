"""MENLO's judge reward on a table of well-formed and malformed judge outputs (numbers worked by hand)."""

from __future__ import annotations

import pytest

from train.grpo.reward.judge_training import (
    COMPONENTS,
    JudgeRewardConfig,
    judge_reward,
    mean_components,
    pointwise_reward,
)

THINK = "<think>A answers the question; B drifts.</think>\n"


def grades(a: str, b: str, think: str = THINK) -> str:
    return (f"{think}<final_grade_A> FINAL GRADE: {a} </final_grade_A>\n"
            f"<final_grade_B> FINAL GRADE: {b} </final_grade_B>")


GOOD, MINOR, PASS = "4 - GOOD", "2 - MINOR FAILURE", "3 - PASS"

# (case, text, gold_a, gold_b, expected components: exact_a, exact_b, near_a, near_b, pref, extract, format, total)
TABLE = [
    ("both exact, preference right", grades(GOOD, MINOR), 4, 2, (1, 1, 0, 0, 1, 0, 0, 3.0)),
    ("A off by one, B exact", grades("5 - EXCELLENT", MINOR), 4, 2, (0, 1, 0.5, 0, 1, 0, 0, 2.5)),
    ("both off by one, predicted tie vs gold A>B", grades(PASS, PASS), 4, 2, (0, 0, 0.5, 0.5, 0, 0, 0, 1.0)),
    ("swapped grades: off by two, preference wrong", grades(MINOR, GOOD), 4, 2, (0, 0, 0, 0, 0, 0, 0, 0.0)),
    ("gold tie, predicted tie", grades(PASS, PASS), 3, 3, (1, 1, 0, 0, 1, 0, 0, 3.0)),
    ("markdown bold inside the tags is fine", grades("**4 - GOOD**", MINOR), 4, 2, (1, 1, 0, 0, 1, 0, 0, 3.0)),
    ("no think block: format violation only", grades(GOOD, MINOR, think=""), 4, 2, (1, 1, 0, 0, 1, 0, -0.2, 2.8)),
    ("B block before A: grades read, tags out of order",
     THINK + "<final_grade_B> FINAL GRADE: 2 - MINOR FAILURE </final_grade_B><final_grade_A> FINAL GRADE: 4 - GOOD "
             "</final_grade_A>", 4, 2, (1, 1, 0, 0, 1, 0, -0.2, 2.8)),
    ("'.' instead of '_' in the tag: lenient grade, tag counted absent",
     THINK + "<final_grade.A> FINAL GRADE: 4 - GOOD </final_grade.A><final_grade_B> FINAL GRADE: 2 - MINOR FAILURE "
             "</final_grade_B>", 4, 2, (1, 1, 0, 0, 1, 0, -0.2, 2.8)),
    ("duplicated A block: last one wins, tag twice",
     THINK + "<final_grade_A> FINAL GRADE: 1 - MAJOR FAILURE </final_grade_A>" + grades(GOOD, MINOR, think=""),
     4, 2, (1, 1, 0, 0, 1, 0, -0.2, 2.8)),
    ("missing B block: extraction and format fail", THINK + "<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>",
     4, 2, (0, 0, 0, 0, 0, -1, -0.2, -1.2)),
    ("grade out of range, tags fine", grades("7 - EXCELLENT", MINOR), 4, 2, (0, 0, 0, 0, 0, -1, 0, -1.0)),
    ("no number in the block", grades("GOOD", MINOR), 4, 2, (0, 0, 0, 0, 0, -1, 0, -1.0)),
    ("unterminated think", "<think>A seems better, so A gets", 4, 2, (0, 0, 0, 0, 0, -1, -0.2, -1.2)),
    ("empty output", "", 4, 2, (0, 0, 0, 0, 0, -1, -0.2, -1.2)),
    ("None output", None, 4, 2, (0, 0, 0, 0, 0, -1, -0.2, -1.2)),
]


@pytest.mark.parametrize("case, text, gold_a, gold_b, expected", TABLE, ids=[row[0] for row in TABLE])
def test_reward_table(case, text, gold_a, gold_b, expected):
    got = judge_reward(text, gold_a, gold_b)
    assert tuple(got.components().values()) == pytest.approx(expected)
    assert list(got.components()) == list(COMPONENTS)
    # the total is exactly the sum of the terms
    assert got.total == pytest.approx(sum(expected[:-1]))
    assert got.extracted == (expected[5] == 0)


def test_strict_format_rule_also_checks_the_grade_content():
    mislabeled = grades("4 - EXCELLENT", MINOR)   # tags fine, label does not match grade 4
    assert judge_reward(mislabeled, 4, 2).total == pytest.approx(3.0)
    strict = judge_reward(mislabeled, 4, 2, JudgeRewardConfig(format_rule="strict"))
    assert strict.format_penalty == pytest.approx(-0.2) and strict.total == pytest.approx(2.8)
    assert not strict.format_ok


@pytest.mark.parametrize("weights, text, expected_total", [
    # Table 6 "binary only": A off by one earns nothing, B exact earns 1
    ({"near_miss": 0.0, "pref_bonus": 0.0}, grades("5 - EXCELLENT", MINOR), 1.0),
    ({"near_miss": 0.0, "pref_bonus": 0.0}, grades(PASS, PASS), 0.0),
    # binary + preference: 1 (B exact) + 1 (sign right)
    ({"near_miss": 0.0}, grades("5 - EXCELLENT", MINOR), 2.0),
    ({"pref_bonus": 0.0}, grades(GOOD, MINOR), 2.0),
    ({"format_penalty": 0.0}, grades(GOOD, MINOR, think=""), 3.0),
    ({"extract_penalty": 0.0}, THINK + "<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>", -0.2),
    # re-weighted terms scale exactly
    ({"exact": 2.0, "near_miss": 0.25, "extract_penalty": 3.0}, grades("5 - EXCELLENT", MINOR), 0.25 + 2.0 + 1.0),
])
def test_each_term_is_switchable(weights, text, expected_total):
    assert judge_reward(text, 4, 2, JudgeRewardConfig(**weights)).total == pytest.approx(expected_total)


def test_averaged_gold_grades_round_half_up_for_grades_and_keep_their_sign_for_preference():
    # gold 3.5 -> class 4 (exact for A=4), 2.4 -> class 2 (exact for B=2), sign(3.5 - 2.4) = + as predicted
    assert judge_reward(grades(GOOD, MINOR), 3.5, 2.4).total == pytest.approx(3.0)
    # gold 2.5 vs 2.6: classes 3 and 3, but B is preferred; predicting a PASS/PASS tie misses the bonus
    tie = judge_reward(grades(PASS, PASS), 2.5, 2.6)
    assert (tie.exact_a, tie.exact_b, tie.pref_bonus) == (1.0, 1.0, 0.0)


@pytest.mark.parametrize("gold_a, gold_b", [(0, 2), (4, 6), (True, 2), (5.5, 2), (None, 2), ("4", 2)])
def test_invalid_gold_grades_are_refused(gold_a, gold_b):
    with pytest.raises(ValueError, match="gold_"):
        judge_reward(grades(GOOD, MINOR), gold_a, gold_b)


@pytest.mark.parametrize("field, value", [("near_miss", -0.5), ("format_penalty", -0.2), ("format_rule", "loose")])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        JudgeRewardConfig(**{field: value}).validate()


def test_mean_components_and_failure_rates():
    rewards = [judge_reward(grades(GOOD, MINOR), 4, 2), judge_reward("", 4, 2),
               judge_reward(grades(GOOD, MINOR, think=""), 4, 2), judge_reward(grades(PASS, PASS), 4, 2)]
    means = mean_components(rewards)
    assert means["total"] == pytest.approx((3.0 - 1.2 + 2.8 + 1.0) / 4)
    assert means["exact_a"] == pytest.approx(0.5) and means["near_b"] == pytest.approx(0.125)
    assert means["extract_penalty"] == pytest.approx(-0.25)
    assert means["extract_fail_rate"] == pytest.approx(0.25) and means["format_fail_rate"] == pytest.approx(0.5)
    assert mean_components([]) == {}


@pytest.mark.parametrize("text, gold, total, extracted, fmt_ok", [
    # exact grade, tags in order: +1
    ("<think>Fine.</think><final_grade> FINAL GRADE: 4 - GOOD </final_grade>", 4.0, 1.0, True, True),
    # off by one (gold 3.5 rounds half up to 4, the answer says 3): near-miss 0.5
    ("<think>x</think><final_grade> FINAL GRADE: 3 - PASS </final_grade>", 3.5, 0.5, True, True),
    # off by two: nothing
    ("<think>x</think><final_grade> FINAL GRADE: 1 - MAJOR FAILURE </final_grade>", 3.0, 0.0, True, True),
    # a pairwise answer to a pointwise prompt: no <final_grade>, extraction fails and the tags are wrong: -1.2
    ("<think>x</think><final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>", 4.0, -1.2, False, False),
    # grade without the think block: extracted, but the format penalty applies: 1 - 0.2
    ("<final_grade> FINAL GRADE: 5 - EXCELLENT </final_grade>", 5.0, 0.8, True, False),
])
def test_pointwise_reward_by_hand(text, gold, total, extracted, fmt_ok):
    r = pointwise_reward(text, gold)
    assert r.total == pytest.approx(total) and (r.extracted, r.format_ok) == (extracted, fmt_ok)
    assert r.exact_b == r.near_b == r.pref_bonus == 0.0  # one response: no B side, no preference
