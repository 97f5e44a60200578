"""Parsers for MENLO-format judge outputs (paper 003): pairwise and pointwise grade blocks, MENLO's tag rule.

One parser for every consumer: judge evaluation (`jobs/judge/evaluate.py`), the RL reward (`train/grpo/reward/judge_training.py`),
the served reward model (`serve/`) and the jury's pairwise verdicts (`parse_pairwise`). As in
`eval.judging.parse`, bad output never raises: extraction failures come back as error codes (listed there) and
format violations are reported separately from extraction, so a reward can penalise them differently.
Pure (no ray, vllm, deepspeed or torch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eval.judging.parse import Parsed, split_think

MENLO_LABELS = {1: "MAJOR FAILURE", 2: "MINOR FAILURE", 3: "PASS", 4: "GOOD", 5: "EXCELLENT"}
MENLO_TAGS = ("<think>", "</think>", "<final_grade_A>", "</final_grade_A>", "<final_grade_B>", "</final_grade_B>")
# pointwise protocols (one response) use one untagged-side block, in the same format
MENLO_POINTWISE_TAGS = ("<think>", "</think>", "<final_grade>", "</final_grade>")


@dataclass(frozen=True)
class MenloGrades:
    """Grades parsed from a MENLO-format pairwise judgment.

    Attributes:
        grade_a: Grade of response A in 1..5, or ``None`` if it could not be extracted.
        grade_b: Same for B. One grade may parse while the other fails.
        label_a: Label as written (upper-cased, whitespace collapsed), ``""`` if absent.
        label_b: Same for B.
        tags_ok: MENLO's own format rule: each of the six tags appears exactly once, in order.
            Use this for the paper's -0.2 formatting penalty.
        format_ok: ``tags_ok`` and both grade blocks well formed (``FINAL GRADE:`` prefix, a
            readable integer, no brackets, ``-`` and a label that matches the grade).
        format_errors: Human-readable descriptions of every format violation.
        error: Extraction failure codes joined with ``"; "`` (``""`` if both grades parsed).
        raw: The text that was parsed.
    """

    grade_a: int | None
    grade_b: int | None
    label_a: str = ""
    label_b: str = ""
    tags_ok: bool = False
    format_ok: bool = False
    format_errors: tuple[str, ...] = ()
    error: str = ""
    raw: str | None = None


_STRICT_TAG_RE = re.compile(r"<\s*(/?)\s*(think|final_grade_a|final_grade_b|final_grade)\s*>", re.IGNORECASE)
_GRADE_CONTENT_RE = re.compile(
    r"^(?P<prefix>final\s*grade\s*:\s*)?\[?\s*(?P<grade>\d+)\b(?!\.\d)\s*\]?\s*"
    r"(?P<sep>[-–—:])?\s*(?P<label>.*?)[\s.]*$",
    re.IGNORECASE | re.DOTALL,
)


def _grade_block_re(side: str) -> re.Pattern:
    # Lenient on purpose: "_" vs "." (seen in MENLO's printed Qwen3 outputs), "\_", spaces, case.
    sep = r"[\s_.\\-]*"
    name = rf"final{sep}grade{sep}{side}"
    return re.compile(rf"<\s*{name}\s*>(.*?)<\s*/\s*{name}\s*>", re.IGNORECASE | re.DOTALL)


# side "" is the pointwise block: "<final_grade>" (the separator run cannot swallow an "_A" side letter)
_GRADE_BLOCK_RE = {"a": _grade_block_re("a"), "b": _grade_block_re("b"), "": _grade_block_re("")}


def check_menlo_tags(text: str, tags: tuple[str, ...] = MENLO_TAGS) -> list[str]:
    """List violations of MENLO's rule "each tag must appear in the correct order and only once".

    Tags are matched case-insensitively and with optional inner whitespace (``< /think >``), but a
    variant name such as ``<final_grade.A>`` is not the tag and counts as absent.

    >>> check_menlo_tags("<think>x</think><final_grade_A>..</final_grade_A><final_grade_B>..</final_grade_B>")
    []
    >>> check_menlo_tags("</think><final_grade_B>..</final_grade_B><final_grade_A>..</final_grade_A>")
    ['<think> appears 0 times']
    """
    found = []
    for match in _STRICT_TAG_RE.finditer(text):
        name = match.group(2).lower()
        name = "final_grade_" + name[-1].upper() if name.startswith("final_grade_") else name
        found.append(f"<{match.group(1)}{name}>")
    errors = [f"{tag} appears {found.count(tag)} times" for tag in tags if found.count(tag) != 1]
    foreign = sorted(set(found) - set(tags))
    if foreign:  # e.g. A/B blocks in a pointwise answer: the judge followed the wrong protocol
        errors.append(f"unexpected tags {foreign}")
    if not errors and found != list(tags):
        errors.append("tags out of order")
    return errors


def _read_grade(region: str, side: str) -> tuple[int | None, str, list[str], str]:
    """Return (grade, label, content format errors, extraction error) for one side."""
    blocks = _GRADE_BLOCK_RE[side].findall(region)
    code = f"grade_{side}" if side else "grade"  # error-code stem: grade_a / grade_b / grade (pointwise)
    side_up = f"grade {side.upper()}" if side else "grade"
    if not blocks:
        return None, "", [], f"missing_{code}"
    content = blocks[-1].replace("*", "").strip()
    match = _GRADE_CONTENT_RE.match(content)
    if not match:
        problem = f"{side_up}: {content[:40]!r} is not 'FINAL GRADE: k - LABEL'"
        return None, "", [problem], f"{code}_unparsable"
    grade = int(match.group("grade"))
    label = " ".join((match.group("label") or "").replace("[", "").replace("]", "").split()).upper()
    problems = []
    if not match.group("prefix"):
        problems.append(f"{side_up}: missing 'FINAL GRADE:'")
    if "[" in content or "]" in content:
        problems.append(f"{side_up}: brackets around grade or label")
    if not label:
        problems.append(f"{side_up}: missing label")
    elif not match.group("sep"):
        problems.append(f"{side_up}: missing '-' between grade and label")
    elif MENLO_LABELS.get(grade) != label:
        problems.append(f"{side_up}: label {label!r} does not match grade {grade}")
    if not 1 <= grade <= 5:
        return None, label, problems, f"{code}_out_of_range"
    return grade, label, problems, ""


def parse_menlo_grades(text: str | None) -> MenloGrades:
    """Parse ``<final_grade_A> FINAL GRADE: k - LABEL </final_grade_A>`` and the same for B.

    Extraction is tolerant (case, whitespace, markdown bold, ``_``/``.`` in tag names, free text
    between ``</think>`` and the tags; the last block per side wins) and only looks after the last
    ``</think>``. Format is checked strictly and reported separately, so a reward can penalise
    format and extraction failures differently (MENLO: -0.2 vs -1).

    Args:
        text: Raw judge output.

    Returns:
        A :class:`MenloGrades`.

    >>> g = parse_menlo_grades("<think>B is warmer.</think>\\n"
    ...                        "<final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>\\n"
    ...                        "<final_grade_B> FINAL GRADE: 5 - EXCELLENT </final_grade_B>")
    >>> (g.grade_a, g.grade_b, g.label_b, g.format_ok, g.error)
    (4, 5, 'EXCELLENT', True, '')
    >>> parse_menlo_grades("<final_grade.A> FINAL GRADE: 2 - Minor Failure </final_grade.A>").error
    'missing_grade_b'
    """
    if text is None or not text.strip():
        return MenloGrades(None, None, format_errors=("empty output",), error="empty", raw=text)
    tag_errors = check_menlo_tags(text)
    region, unterminated = split_think(text)
    grade_a, label_a, problems_a, error_a = _read_grade(region, "a")
    grade_b, label_b, problems_b, error_b = _read_grade(region, "b")
    errors = [e for e in (error_a, error_b) if e]
    if unterminated and grade_a is None and grade_b is None:
        errors = ["unterminated_think"]
    format_errors = tuple(tag_errors + problems_a + problems_b)
    return MenloGrades(
        grade_a, grade_b, label_a, label_b,
        tags_ok=not tag_errors, format_ok=not format_errors, format_errors=format_errors,
        error="; ".join(errors), raw=text,
    )


def parse_menlo_grade(text: str | None) -> MenloGrades:
    """Pointwise MENLO judgment: ``<think>…</think>`` then ``<final_grade> FINAL GRADE: k - LABEL </final_grade>``.

    Same tolerance and strict format check as :func:`parse_menlo_grades`, with the tags of
    :data:`MENLO_POINTWISE_TAGS`; the grade and label are returned in ``grade_a`` / ``label_a``
    (``grade_b`` stays ``None``). Error codes: ``missing_grade``, ``grade_unparsable``,
    ``grade_out_of_range``, ``unterminated_think``, ``empty``.

    >>> g = parse_menlo_grade("<think>Natural.</think><final_grade> FINAL GRADE: 4 - GOOD </final_grade>")
    >>> (g.grade_a, g.label_a, g.format_ok, g.error)
    (4, 'GOOD', True, '')
    >>> parse_menlo_grade("<think>.</think><final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>").error
    'missing_grade'
    """
    if text is None or not text.strip():
        return MenloGrades(None, None, format_errors=("empty output",), error="empty", raw=text)
    tag_errors = check_menlo_tags(text, MENLO_POINTWISE_TAGS)
    region, unterminated = split_think(text)
    grade, label, problems, error = _read_grade(region, "")
    if unterminated and grade is None:
        error = "unterminated_think"
    format_errors = tuple(tag_errors + problems)
    return MenloGrades(grade, None, label, "", tags_ok=not tag_errors, format_ok=not format_errors,
                       format_errors=format_errors, error=error, raw=text)


def parse_pairwise(text: str | None) -> Parsed:
    """Winner of a ``jury_pairwise.yaml`` judgment, derived from the two MENLO grades.

    The judge is never asked for a winner: A wins if ``grade_A > grade_B``, B if lower, ``"tie"``
    if equal (MENLO's ``sign(s_A - s_B)``). Format violations do not fail this parse; use
    :func:`parse_menlo_grades` when they matter.

    Args:
        text: Raw judge output.

    Returns:
        ``Parsed(value="A" | "B" | "tie")``, or ``value=None`` with the extraction error.

    >>> parse_pairwise("<think>.</think><final_grade_A>FINAL GRADE: 3 - PASS</final_grade_A>"
    ...                "<final_grade_B>FINAL GRADE: 3 - PASS</final_grade_B>").value
    'tie'
    """
    grades = parse_menlo_grades(text)
    if grades.error:
        return Parsed(None, grades.error, text)
    if grades.grade_a == grades.grade_b:
        return Parsed("tie", "", text)
    return Parsed("A" if grades.grade_a > grades.grade_b else "B", "", text)
