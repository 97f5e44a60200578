"""The scripted hosted judge behind tests/test_trainer_rewards.py's `quorum serve`: it answers MENLO's grade blocks
with the judge-gaming fixture's weaknesses (tests/test_judge_gaming.py: the longer answer wins, then the quality mark,
then the first slot), and answers a prompt holding UNJUDGEABLE with text no parser reads (a real judgment failure)."""

from __future__ import annotations

from eval.judging.menlo_parse import MENLO_LABELS
from tests.test_judge_gaming import scripted_judge

UNJUDGEABLE = "UNJUDGEABLE"


def grade_block(tag: str, grade: int) -> str:
    return f"<{tag}> FINAL GRADE: {grade} - {MENLO_LABELS[grade]} </{tag}>"


def pairwise_grades(a: str, b: str) -> tuple[int, int]:
    """The gaming fixture's judge for its own answers ([q=...] marks); by length for anything else."""
    if "[q=" in a and "[q=" in b:
        return scripted_judge(a, b)
    la, lb = len(a.split()), len(b.split())
    return (4, 2) if la > lb else (2, 4) if la < lb else (3, 3)


def judge_reply(message: str) -> str:
    """The scripted judge's answer to a rendered MENLO template (its last user message)."""
    if UNJUDGEABLE in message:
        return "I would rather not grade these."
    if "[Response A]" in message:
        a = message.split("[Response A]\n", 1)[1].split("\n\n[Response B]\n", 1)[0]
        b = message.split("\n\n[Response B]\n", 1)[1]
        grade_a, grade_b = pairwise_grades(a, b)
        return f"<think> compared </think>{grade_block('final_grade_A', grade_a)}{grade_block('final_grade_B', grade_b)}"
    response = message.split("[Response]\n", 1)[1]
    return f"<think> read </think>{grade_block('final_grade', min(5, 1 + len(response.split()) // 3))}"
