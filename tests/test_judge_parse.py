"""Tests for eval.judging.parse: tables of well-formed and malformed judge outputs and their defined results."""

from __future__ import annotations

import doctest

import pytest

from eval.judging import parse as judge_parse
from eval.judging.menlo_parse import MENLO_LABELS, check_menlo_tags, parse_menlo_grades, parse_pairwise
from eval.judging.parse import Parsed, parse_best_worst, parse_score, split_think


def test_doctests_pass():
    assert doctest.testmod(judge_parse).failed == 0


def test_split_think():
    assert split_think("no tags") == ("no tags", False)
    assert split_think("<think>a</think>b<think>c</think>d") == ("d", False)
    assert split_think("prompt-side think: reasoning</think>answer") == ("answer", False)
    assert split_think("<THINK>a</ Think >b") == ("b", False)
    assert split_think("<think>cut off") == ("", True)


# -----------------------------------------------------------------------------
# parse_score

SCORE_CASES = [
    # (text, value, error)
    ("Fluent and simpler. Answer: [4]", 4, ""),
    ("Answer: [2]\nOn reflection, meaning is kept. Answer: [3]", 3, ""),  # last Answer wins
    ("answer:[5]", 5, ""),
    ("**Answer:** [1]", 1, ""),
    ("Answer: [ 2 ]", 2, ""),
    ("The rubric says [5] is best and [1] unreadable. Final: [4].", 4, ""),  # last in-range bracket
    ("I rate it [4]. Footnote [12].", 4, ""),  # [12] is out of range, skipped
    ("Answer: [4] ... Answer: [9]", None, "out_of_range"),  # explicit answer out of range: no fallback
    ("Answer: [0]", None, "out_of_range"),
    ("Score: [6]", None, "out_of_range"),
    ("Answer: 4", None, "no_score"),  # no brackets
    ("Answer: [3.5]", None, "no_score"),  # not an integer
    ("It is good.", None, "no_score"),
    ("<think>Per the rubric [5] fits. Answer: [5]</think>Answer: [2]", 2, ""),
    ("<think>Per the rubric [5] fits.</think>Looks fine overall.", None, "no_score"),  # reasoning ignored
    ("<think>Per the rubric [5] fits. Answer: [5]", None, "unterminated_think"),
    ("", None, "empty"),
    ("   \n", None, "empty"),
    (None, None, "empty"),
]


@pytest.mark.parametrize("text, value, error", SCORE_CASES)
def test_parse_score_table(text, value, error):
    result = parse_score(text)
    assert (result.value, result.error) == (value, error)
    assert result.raw == text
    assert result.ok == (error == "")


def test_parse_score_custom_range():
    assert parse_score("Answer: [7]", lo=0, hi=10).value == 7
    assert parse_score("Answer: [1]", lo=2, hi=3).error == "out_of_range"


# -----------------------------------------------------------------------------
# parse_best_worst

PAPER_OUTPUT = """<think>Candidate 2 drops meaning... Aspect: Lexical, Best: 0, Worst: 1 (draft)</think>
Aspect: Lexical, Best: 1, Worst: 0
Analysis:
0: 'slip you through'->'slip by you' reverses the core meaning - high penalty.
1: simpler, keeps meaning - the best: 3 of all? no.
Aspect: Structural, Best: 3, Worst: 2
3: Simple S -> NP VP PP, no nesting -> high reward
Aspect: Overall, Best: 1, Worst: 0"""


def ok(best, worst):
    return {"best": best, "worst": worst, "error": ""}


def err(best, worst, error):
    return {"best": best, "worst": worst, "error": error}


def test_parse_best_worst_paper_format_with_think_and_analysis():
    assert parse_best_worst(PAPER_OUTPUT, 4) == {
        "Lexical": ok(1, 0), "Structural": ok(3, 2), "Overall": ok(1, 0)}


BEST_WORST_CASES = [
    # (text, expected {Lexical, Overall}) with n_candidates=4 and aspects=("Lexical", "Overall")
    ("Aspect: Lexical, Best: 1, Worst: 0\nAspect: Overall, Best: 2, Worst: 3",
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # case and whitespace variations
    ("aspect :  LEXICAL ,best:1,   worst :0\nASPECT: overall, BEST: 2, WORST: 3",
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # markdown bold, bullets, text around the line
    (("Final verdicts:\n- **Aspect:** Lexical, **Best:** 1, **Worst:** 0 (see above)\n"
     "* **Aspect: Overall**, **Best**: 2, **Worst**: 3.\nThanks!"),
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # echoed braces/brackets from the format line
    ("Aspect: Lexical, Best: {1}, Worst: [0]\nAspect: Overall, Best: (2), Worst: 3",
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # Best/Worst on the following lines
    ("Aspect: Lexical\nBest: 1\nWorst: 0\nAspect: Overall\nBest: 2\nWorst: 3",
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # two aspects on one line
    ("Aspect: Lexical, Best: 1, Worst: 0; Aspect: Overall, Best: 2, Worst: 3",
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # duplicated aspect: the LAST one is the decision
    (("Aspect: Lexical, Best: 1, Worst: 0\nAspect: Overall, Best: 2, Worst: 3\nOn reflection:\n"
     "Aspect: Lexical, Best: 3, Worst: 2"),
     {"Lexical": ok(3, 2), "Overall": ok(2, 3)}),
    # a later passing mention does not override the complete decision
    (("Aspect: Lexical, Best: 1, Worst: 0\nAspect: Overall, Best: 2, Worst: 3\n"
     "Note on the aspect: lexical choice of 2 was close."),
     {"Lexical": ok(1, 0), "Overall": ok(2, 3)}),
    # no complete occurrence: the last one is reported
    ("Aspect: Lexical, Best: 1\nAspect: Lexical, Worst: 0\nAspect: Overall, Best: 2, Worst: 3",
     {"Lexical": err(None, 0, "malformed"), "Overall": ok(2, 3)}),
    # "aspects:" / "subaspect:" are not headers
    ("Aspects: Lexical, Best: 0, Worst: 1\nSubaspect: Overall, Best: 0, Worst: 1",
     {"Lexical": err(None, None, "missing"), "Overall": err(None, None, "missing")}),
    # missing aspect
    ("Aspect: Lexical, Best: 1, Worst: 0\nAspect: Structural, Best: 2, Worst: 3",
     {"Lexical": ok(1, 0), "Overall": err(None, None, "missing")}),
    # misspelled aspect is not guessed
    ("Aspect: Lexial, Best: 1, Worst: 0\nAspect: Overall, Best: 2, Worst: 3",
     {"Lexical": err(None, None, "missing"), "Overall": ok(2, 3)}),
    # header without Worst / without Best
    ("Aspect: Lexical, Best: 1\n\n\nAspect: Overall, Worst: 3",
     {"Lexical": err(1, None, "malformed"), "Overall": err(None, 3, "malformed")}),
    # negative or non-numeric index
    ("Aspect: Lexical, Best: -1, Worst: 0\nAspect: Overall, Best: two, Worst: 3",
     {"Lexical": err(None, 0, "malformed"), "Overall": err(None, 3, "malformed")}),
    # index out of range (values kept)
    ("Aspect: Lexical, Best: 4, Worst: 0\nAspect: Overall, Best: 1, Worst: 7",
     {"Lexical": err(4, 0, "out_of_range"), "Overall": err(1, 7, "out_of_range")}),
    # Best == Worst (values kept so callers can count it)
    ("Aspect: Lexical, Best: 2, Worst: 2\nAspect: Overall, Best: 1, Worst: 0",
     {"Lexical": err(2, 2, "best_equals_worst"), "Overall": ok(1, 0)}),
    # decisions only inside reasoning: not final
    ("<think>Aspect: Lexical, Best: 1, Worst: 0\nAspect: Overall, Best: 2, Worst: 3</think>I cannot decide.",
     {"Lexical": err(None, None, "missing"), "Overall": err(None, None, "missing")}),
    # truncated inside reasoning
    ("<think>Aspect: Lexical, Best: 1, Worst: 0",
     {"Lexical": err(None, None, "missing"), "Overall": err(None, None, "missing")}),
    ("", {"Lexical": err(None, None, "missing"), "Overall": err(None, None, "missing")}),
    (None, {"Lexical": err(None, None, "missing"), "Overall": err(None, None, "missing")}),
]


@pytest.mark.parametrize("text, expected", BEST_WORST_CASES)
def test_parse_best_worst_table(text, expected):
    assert parse_best_worst(text, 4, aspects=("Lexical", "Overall")) == expected


def test_parse_best_worst_respects_n_candidates_and_aspect_spelling():
    assert parse_best_worst("Aspect: Fluency, Best: 2, Worst: 0", 3, aspects=("fluency",)) == {"fluency": ok(2, 0)}
    assert parse_best_worst("Aspect: Fluency, Best: 3, Worst: 0", 3, aspects=("Fluency",))["Fluency"]["error"] == (
        "out_of_range")
    with pytest.raises(ValueError):
        parse_best_worst("Aspect: Lexical, Best: 0, Worst: 0", 1)


# -----------------------------------------------------------------------------
# parse_menlo_grades / parse_pairwise

GOOD_MENLO = (
    "<think>\nA keeps the meaning; B is simpler still.\n</think>\n\n"
    "<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>\n"
    "<final_grade_B> FINAL GRADE: 5 - EXCELLENT </final_grade_B>"
)


def test_menlo_well_formed():
    g = parse_menlo_grades(GOOD_MENLO)
    assert (g.grade_a, g.grade_b, g.label_a, g.label_b) == (4, 5, "GOOD", "EXCELLENT")
    assert (g.tags_ok, g.format_ok, g.format_errors, g.error, g.raw) == (True, True, (), "", GOOD_MENLO)


def sub(old, new, text=GOOD_MENLO):
    assert old in text
    return text.replace(old, new)


MENLO_CASES = [
    # (text, grade_a, grade_b, tags_ok, format_ok, error) -- tolerated variations first
    (sub("FINAL GRADE: 4 - GOOD", "final grade:4 -   good"), 4, 5, True, True, ""),
    (sub("<final_grade_A>", "< FINAL_GRADE_A >"), 4, 5, True, True, ""),
    (sub("FINAL GRADE: 4 - GOOD", "**FINAL GRADE: 4 - GOOD**"), 4, 5, True, True, ""),
    (sub("</think>\n", "</think>\nBoth are fluent; B is more personal.\n"), 4, 5, True, True, ""),  # Qwen3 style
    (sub("4 - GOOD", "4 - Good."), 4, 5, True, True, ""),
    # extraction works, format violated
    (sub("<think>", ""), 4, 5, False, False, ""),  # opening think missing
    (sub("_A>", ".A>"), 4, 5, False, False, ""),  # MENLO's printed "<final_grade.A>" variant
    (sub("<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>\n", "")
     + "\n<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>", 4, 5, False, False, ""),  # B before A
    (GOOD_MENLO + "\n<final_grade_B> FINAL GRADE: 3 - PASS </final_grade_B>", 4, 3, False, False, ""),  # dup: last
    (sub("4 - GOOD", "4 - EXCELLENT"), 4, 5, True, False, ""),  # label does not match grade
    (sub("4 - GOOD", "4"), 4, 5, True, False, ""),  # label missing
    (sub("4 - GOOD", "4 GOOD"), 4, 5, True, False, ""),  # dash missing
    (sub("FINAL GRADE: 4 - GOOD", "4 - GOOD"), 4, 5, True, False, ""),  # prefix missing
    (sub("4 - GOOD", "[4] - [GOOD]"), 4, 5, True, False, ""),  # template brackets copied
    # extraction failures
    (sub("<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>\n", ""), None, 5, False, False, "missing_grade_a"),
    (sub("4 - GOOD", "6 - EXCELLENT"), None, 5, True, False, "grade_a_out_of_range"),
    (sub("4 - GOOD", "4.5 - GOOD"), None, 5, True, False, "grade_a_unparsable"),
    (sub("FINAL GRADE: 4 - GOOD", "GOOD"), None, 5, True, False, "grade_a_unparsable"),
    (sub("</think>", "") + "", None, None, False, False, "unterminated_think"),  # grades only inside open think
    ("<think>A is fine, B is better", None, None, False, False, "unterminated_think"),
    ("<think>x</think>I prefer B.", None, None, False, False, "missing_grade_a; missing_grade_b"),
    ("", None, None, False, False, "empty"),
    (None, None, None, False, False, "empty"),
]


@pytest.mark.parametrize("text, grade_a, grade_b, tags_ok, format_ok, error", MENLO_CASES)
def test_menlo_table(text, grade_a, grade_b, tags_ok, format_ok, error):
    g = parse_menlo_grades(text)
    assert (g.grade_a, g.grade_b, g.tags_ok, g.format_ok, g.error) == (grade_a, grade_b, tags_ok, format_ok, error)
    assert g.format_ok == (not g.format_errors)
    assert g.raw == text


def test_menlo_grades_in_reasoning_are_not_final():
    text = ("<think>Draft: <final_grade_A> FINAL GRADE: 1 - MAJOR FAILURE </final_grade_A></think>\n"
            "<final_grade_A> FINAL GRADE: 3 - PASS </final_grade_A>\n"
            "<final_grade_B> FINAL GRADE: 2 - MINOR FAILURE </final_grade_B>")
    g = parse_menlo_grades(text)
    assert (g.grade_a, g.grade_b, g.label_a, g.label_b) == (3, 2, "PASS", "MINOR FAILURE")
    assert g.format_errors == ("<final_grade_A> appears 2 times", "</final_grade_A> appears 2 times")
    assert g.error == ""


def test_menlo_format_error_messages():
    g = parse_menlo_grades(sub("4 - GOOD", "4 - EXCELLENT"))
    assert g.format_errors == ("grade A: label 'EXCELLENT' does not match grade 4",)
    g = parse_menlo_grades(sub("FINAL GRADE: 4 - GOOD", "GOOD"))
    assert g.format_errors == ("grade A: 'GOOD' is not 'FINAL GRADE: k - LABEL'",)
    variant = check_menlo_tags(sub("_A>", ".A>"))
    assert variant == ["<final_grade_A> appears 0 times", "</final_grade_A> appears 0 times"]
    swapped = "<think></think><final_grade_B></final_grade_B><final_grade_A></final_grade_A>"
    assert check_menlo_tags(swapped) == ["tags out of order"]


def test_menlo_labels_are_the_papers():
    assert MENLO_LABELS == {1: "MAJOR FAILURE", 2: "MINOR FAILURE", 3: "PASS", 4: "GOOD", 5: "EXCELLENT"}
    for k, label in MENLO_LABELS.items():
        text = sub("4 - GOOD", f"{k} - {label.lower()}")
        assert parse_menlo_grades(text).grade_a == k and parse_menlo_grades(text).format_ok


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD_MENLO, Parsed("B", "", GOOD_MENLO)),
        (sub("4 - GOOD", "5 - EXCELLENT"), Parsed("tie", "", sub("4 - GOOD", "5 - EXCELLENT"))),
        (sub("5 - EXCELLENT", "2 - MINOR FAILURE"), Parsed("A", "", sub("5 - EXCELLENT", "2 - MINOR FAILURE"))),
        (sub("<think>", ""), Parsed("B", "", sub("<think>", ""))),  # format violation does not fail the winner
        ("I prefer A.", Parsed(None, "missing_grade_a; missing_grade_b", "I prefer A.")),
    ],
)
def test_parse_pairwise(text, expected):
    assert parse_pairwise(text) == expected


# ---------------------------------------------------------------------------------------------------------------
# parse_menlo_grade (pointwise MENLO protocols): one <final_grade> block

GOOD_POINT = "<think>\nNatural and polite.\n</think>\n<final_grade> FINAL GRADE: 4 - GOOD </final_grade>"

POINT_CASES = [
    # (text, grade, tags_ok, format_ok, error)
    (GOOD_POINT, 4, True, True, ""),
    (GOOD_POINT.replace("4 - GOOD", "2 - minor failure"), 2, True, True, ""),
    (GOOD_POINT.replace("</think>\n", "</think>\nOverall fine.\n"), 4, True, True, ""),
    (GOOD_POINT.replace("<think>", ""), 4, False, False, ""),
    (GOOD_POINT.replace("4 - GOOD", "4 - PASS"), 4, True, False, ""),
    (GOOD_POINT + "\n<final_grade> FINAL GRADE: 5 - EXCELLENT </final_grade>", 5, False, False, ""),  # last wins
    # the pairwise format is not the pointwise one: no grade, and the foreign tags are named
    (GOOD_POINT.replace("final_grade>", "final_grade_A>"), None, False, False, "missing_grade"),
    (GOOD_POINT.replace("4 - GOOD", "7 - GREAT"), None, True, False, "grade_out_of_range"),
    (GOOD_POINT.replace("FINAL GRADE: 4 - GOOD", "good"), None, True, False, "grade_unparsable"),
    ("<think>it is fine, grade 4", None, False, False, "unterminated_think"),
    ("   ", None, False, False, "empty"),
]


@pytest.mark.parametrize("text, grade, tags_ok, format_ok, error", POINT_CASES)
def test_menlo_pointwise_table(text, grade, tags_ok, format_ok, error):
    from eval.judging.menlo_parse import parse_menlo_grade

    g = parse_menlo_grade(text)
    assert (g.grade_a, g.grade_b, g.tags_ok, g.format_ok, g.error) == (grade, None, tags_ok, format_ok, error)
    assert g.format_ok == (not g.format_errors)


def test_menlo_pointwise_tag_messages():
    from eval.judging.menlo_parse import MENLO_POINTWISE_TAGS

    pairwise_answer = GOOD_MENLO
    errors = check_menlo_tags(pairwise_answer, MENLO_POINTWISE_TAGS)
    assert errors == ["<final_grade> appears 0 times", "</final_grade> appears 0 times",
                      "unexpected tags ['</final_grade_A>', '</final_grade_B>', '<final_grade_A>', '<final_grade_B>']"]
    # and a pointwise block inside a pairwise answer is foreign there
    assert check_menlo_tags(GOOD_MENLO + "<final_grade>x</final_grade>") == [
        "unexpected tags ['</final_grade>', '<final_grade>']"]


def test_a_truncated_rationale_quoting_the_rubric_is_not_a_score():
    """Paper 001's rubric lists "[5]: The sentence is fully simplified ..."; a rationale cut off while quoting it used
    to parse as 5 (the fallback took the last bracketed integer)."""
    from eval.judging.parse import parse_score

    cut = "The output keeps the meaning and reads well, matching [5]: The sentence is fully simplified, entirely"
    assert parse_score(cut).value is None and parse_score(cut).error == "no_score"
    assert parse_score("Between [4]: and [3], I give [4]").value == 4
    assert parse_score(cut + " Answer: [4]").value == 4
