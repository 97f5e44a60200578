"""MENLO's judge-training reward (paper 003, §4.1): grade accuracy, preference sign and format, term by term.

    cfg = JudgeRewardConfig()                                   # the paper's default: every term on
    r = judge_reward(text, gold_a=4, gold_b=2, cfg=cfg)         # r.total, r.exact_a, ..., r.format_penalty

    R = Σ_{i∈{A,B}} [exact·1(s_i = g_i) or near_miss·1(|s_i − g_i| = 1)]
        + pref_bonus·1(sign(s_A − s_B) = sign(g_A − g_B)) − extract_penalty·1(extraction failed)
        − format_penalty·1(format violated)

Every term is a weight; 0 switches it off (Table 6's ablations: binary only = ``near_miss=0, pref_bonus=0``).
Grades and the format verdict come from the one shared parser, `eval.judging.menlo_parse.parse_menlo_grades`, the same
code that scores judges in evaluation and reads the served GRM's output.

Choices where the paper is silent (its §3.3 open points), made explicit:
    * a non-integer gold grade (an averaged rating) counts as its round-half-up class for the exact and near-miss
      terms and as is for the preference sign, the rule of the judge evaluation (`eval.judging.menlo_data.gold_class`),
      so training rewards what evaluation measures;
    * one unreadable grade is an extraction failure of the whole answer: the penalty once, and no grade or
      preference credit for the side that did parse (the paper's pseudo-code; half credit would pay for
      answers the evaluation counts as failures);
    * the format penalty is independent of extraction: a garbled answer can lose both (−1.2, the paper's minimum);
    * "format violation" is MENLO's rule (each of the six tags exactly once, in order: `MenloGrades.tags_ok`);
      ``format_rule="strict"`` also requires the ``FINAL GRADE: k - LABEL`` content (`MenloGrades.format_ok`).

This module is pure (no ray, vllm, deepspeed or torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.config import Section, dotted, one_of
from eval.judging.menlo_parse import MenloGrades, parse_menlo_grade, parse_menlo_grades

FORMAT_RULES = ("tags", "strict")
# components logged per step, in this order (the paper's RewardBreakdown record)
COMPONENTS = ("exact_a", "exact_b", "near_a", "near_b", "pref_bonus", "extract_penalty", "format_penalty", "total")


@dataclass(frozen=True)
class JudgeRewardConfig(Section):
    """Weights of the reward terms (paper defaults); 0 switches a term off. Penalties are given as magnitudes."""

    exact: float = 1.0  # credit per response (A, B) whose grade equals its gold class
    # credit for a grade off by exactly one (the paper's "smoothing")
    near_miss: float = 0.5
    pref_bonus: float = 1.0  # credit when sign(grade A - grade B) equals the gold preference's sign
    extract_penalty: float = 1.0  # subtracted once when a grade cannot be extracted (no grade credit then)
    format_penalty: float = 0.2  # subtracted when the answer breaks `format_rule` (independent of extraction)
    # tags (MENLO's rule) | strict (tags + grade content format)
    format_rule: str = "tags"

    def check(self, where: str = "") -> None:
        # every number >= 0 (penalties are magnitudes) is check_tree's floor
        one_of(self.format_rule, FORMAT_RULES, dotted(where, "format_rule"))


@dataclass(frozen=True)
class RewardBreakdown:
    """One judge answer's reward, term by term; penalties are stored with their sign (<= 0)."""

    exact_a: float
    exact_b: float
    near_a: float
    near_b: float
    pref_bonus: float
    extract_penalty: float
    format_penalty: float
    total: float
    grade_a: int | None
    grade_b: int | None
    extracted: bool
    format_ok: bool

    def components(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in COMPONENTS}


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _gold_class(gold: float, side: str) -> int:
    """The 1..5 class of a gold grade, rounded half up (3.5 -> 4), as `eval.judging.menlo_data.gold_class` does."""
    # gold grades are data, but a wrong one would silently corrupt every reward: stop loudly
    if isinstance(gold, bool) or not isinstance(gold, (int, float)) or not 1 <= gold <= 5:
        raise ValueError(f"gold_{side}: expected a grade in [1, 5], got {gold!r}")
    return math.floor(gold + 0.5)


def _grade_credit(pred: int, gold: int, cfg: JudgeRewardConfig) -> tuple[float, float]:
    """(exact credit, near-miss credit) of one side; at most one is non-zero (the paper's max(...))."""
    if pred == gold:
        return cfg.exact, 0.0
    if abs(pred - gold) == 1:
        return 0.0, cfg.near_miss
    return 0.0, 0.0


def reward_from_grades(grades: MenloGrades, gold_a: float, gold_b: float, cfg: JudgeRewardConfig) -> RewardBreakdown:
    """The reward of an already parsed answer (see the module docstring for the rules)."""
    class_a, class_b = _gold_class(gold_a, "a"), _gold_class(gold_b, "b")
    format_ok = grades.tags_ok if cfg.format_rule == "tags" else grades.format_ok
    fmt = 0.0 if format_ok else -cfg.format_penalty
    extracted = grades.grade_a is not None and grades.grade_b is not None
    if not extracted:
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, -cfg.extract_penalty, fmt, fmt - cfg.extract_penalty,
                               grades.grade_a, grades.grade_b, False, format_ok)
    exact_a, near_a = _grade_credit(grades.grade_a, class_a, cfg)
    exact_b, near_b = _grade_credit(grades.grade_b, class_b, cfg)
    same_sign = _sign(grades.grade_a - grades.grade_b) == _sign(gold_a - gold_b)
    pref = cfg.pref_bonus if same_sign else 0.0
    total = exact_a + exact_b + near_a + near_b + pref + fmt
    return RewardBreakdown(exact_a, exact_b, near_a, near_b, pref, 0.0, fmt, total,
                           grades.grade_a, grades.grade_b, True, format_ok)


def judge_reward(text: str | None, gold_a: float, gold_b: float,
                 cfg: JudgeRewardConfig | None = None) -> RewardBreakdown:
    """Reward of one raw judge answer against the gold grades of its A/B pair.

    Args:
        text: The judge's full output (``<think>`` block included: the format rule counts its tags).
        gold_a: Gold grade of the response shown as A, in [1, 5] (non-integer: see the module docstring).
        gold_b: Gold grade of the response shown as B.
        cfg: Term weights; the paper's defaults when None.

    Returns:
        The `RewardBreakdown`.

    Raises:
        ValueError: a gold grade is not a number in [1, 5].

    >>> ok = "<think>B is warmer.</think><final_grade_A> FINAL GRADE: 3 - PASS </final_grade_A>" \\
    ...      "<final_grade_B> FINAL GRADE: 5 - EXCELLENT </final_grade_B>"
    >>> judge_reward(ok, gold_a=3, gold_b=4).total          # exact A + near-miss B + preference
    2.5
    """
    return reward_from_grades(parse_menlo_grades(text), gold_a, gold_b, cfg or JudgeRewardConfig())


def pointwise_reward(text: str | None, gold: float, cfg: JudgeRewardConfig | None = None) -> RewardBreakdown:
    """Reward of one pointwise judge answer (paper 003 Table 19's pointwise RL): the A-side terms on its single
    ``<final_grade>``, no preference term (one response has none), the same extraction and format penalties (the
    format rule on the pointwise tags). The B-side terms stay 0 so the logged components line up with pairwise.

    >>> pointwise_reward("<think>ok</think><final_grade> FINAL GRADE: 4 - GOOD </final_grade>", gold=3).total
    0.5
    >>> pointwise_reward("4", gold=4).total                  # no tags: extraction failure and format penalty
    -1.2
    """
    cfg = cfg or JudgeRewardConfig()
    grades = parse_menlo_grade(text)
    gold_class = _gold_class(gold, "a")
    format_ok = grades.tags_ok if cfg.format_rule == "tags" else grades.format_ok
    fmt = 0.0 if format_ok else -cfg.format_penalty
    if grades.grade_a is None:
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, -cfg.extract_penalty, fmt, fmt - cfg.extract_penalty,
                               None, None, False, format_ok)
    exact, near = _grade_credit(grades.grade_a, gold_class, cfg)
    return RewardBreakdown(exact, 0.0, near, 0.0, 0.0, 0.0, fmt, exact + near + fmt, grades.grade_a, None, True,
                           format_ok)


def mean_components(breakdowns: list[RewardBreakdown]) -> dict[str, float]:
    """Per-term means plus the extraction- and format-failure rates (what a training step logs)."""
    if not breakdowns:
        return {}
    n = len(breakdowns)
    means = {name: sum(getattr(b, name) for b in breakdowns) / n for name in COMPONENTS}
    means["extract_fail_rate"] = sum(not b.extracted for b in breakdowns) / n
    means["format_fail_rate"] = sum(not b.format_ok for b in breakdowns) / n
    return means
