"""Parsers for judge outputs: jury scores, best/worst selections and MENLO-style pairwise grades.

Model output is data: these functions never raise on ordinary bad output. A failure comes back as
a result with a short ``error`` code, and the raw text is kept so nothing is silently dropped.
Reasoning is removed first: everything up to the LAST ``</think>`` is ignored, because reasoning
often quotes the rubric (``[1]`` to ``[5]``) or drafts a verdict it later revises. If a ``<think>``
is never closed (truncated generation), only the text before it is searched.

Error codes:

=======================  ==============================================================
``empty``                text is ``None`` or blank
``no_score``             parse_score found no ``Answer: [k]`` and no bracketed integer
``out_of_range``         the chosen integer is outside the allowed range
``unterminated_think``   nothing found and a ``<think>`` block was never closed
``missing``              parse_best_worst: no ``Aspect: X`` line for that aspect
``malformed``            parse_best_worst: the aspect line lacks ``Best:`` or ``Worst:``
``best_equals_worst``    parse_best_worst: both indices equal (values kept for counting)
``missing_grade_a``      parse_menlo_grades: no ``<final_grade_A>`` block (same for b)
``grade_a_unparsable``   parse_menlo_grades: a block without a readable grade (same for b)
``grade_a_out_of_range`` parse_menlo_grades: grade not in 1..5 (same for b)
``missing_grade``        parse_menlo_grade (pointwise): no ``<final_grade>`` block; likewise
                         ``grade_unparsable`` and ``grade_out_of_range``
=======================  ==============================================================

Several codes are joined with ``"; "``. This module is pure (no ray, vllm, deepspeed or torch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MENLO_LABELS = {1: "MAJOR FAILURE", 2: "MINOR FAILURE", 3: "PASS", 4: "GOOD", 5: "EXCELLENT"}
MENLO_TAGS = ("<think>", "</think>", "<final_grade_A>", "</final_grade_A>", "<final_grade_B>", "</final_grade_B>")
# pointwise protocols (one response) use one untagged-side block, in the same format
MENLO_POINTWISE_TAGS = ("<think>", "</think>", "<final_grade>", "</final_grade>")

_THINK_OPEN_RE = re.compile(r"<\s*think\s*>", re.I)
_THINK_CLOSE_RE = re.compile(r"<\s*/\s*think\s*>", re.I)


@dataclass(frozen=True)
class Parsed:
    """One parsed value, or an error code.

    Attributes:
        value: The parsed value (``None`` on failure).
        error: ``""`` on success, else an error code (see the module docstring).
        raw: The text that was parsed.
    """

    value: object
    error: str = ""
    raw: str | None = None

    @property
    def ok(self) -> bool:
        return not self.error


def split_think(text: str) -> tuple[str, bool]:
    """Return the answer part of ``text`` and whether a ``<think>`` block was left open.

    Args:
        text: Raw model output.

    Returns:
        ``(answer, unterminated)``: the text after the last ``</think>`` if there is one; otherwise
        the text before an unclosed ``<think>`` (``unterminated=True``); otherwise all of it.

    >>> split_think("<think>maybe [2]</think> Answer: [4]")
    (' Answer: [4]', False)
    >>> split_think("Draft <think>still thinking [2]")
    ('Draft ', True)
    """
    closes = list(_THINK_CLOSE_RE.finditer(text))
    if closes:
        return text[closes[-1].end():], False
    opened = _THINK_OPEN_RE.search(text)
    if opened:
        return text[: opened.start()], True
    return text, False


# -----------------------------------------------------------------------------
# Jury score: "... Answer: [k]" (paper 001)

_ANSWER_RE = re.compile(r"answer[\s*_]*:[\s*_]*\[\s*(\d+)\s*\]", re.I)
_BRACKET_RE = re.compile(r"\[\s*(\d+)\s*\]")


def parse_score(text: str | None, lo: int = 1, hi: int = 5) -> Parsed:
    """Extract an integer score written as ``Answer: [k]``.

    The LAST ``Answer: [k]`` wins (an explicit answer out of range is an error, with no fallback).
    Without one, the last bracketed integer in ``[lo, hi]`` is used; ``[3.5]`` is not an integer
    and a bare ``Answer: 4`` has no brackets, so neither counts.

    Args:
        text: Raw judge output.
        lo: Lowest valid score.
        hi: Highest valid score.

    Returns:
        ``Parsed(value=int)`` or ``Parsed(value=None, error=...)`` with ``raw=text``.

    >>> parse_score("<think>[5] is best</think>Fluent but lossy. Answer: [3]").value
    3
    >>> parse_score("Scores run from [1] to [5]. I give it [4], see [12].").value
    4
    >>> parse_score("Answer: [7]").error
    'out_of_range'
    """
    if text is None or not text.strip():
        return Parsed(None, "empty", text)
    answer, unterminated = split_think(text)
    explicit = _ANSWER_RE.findall(answer)
    if explicit:
        k = int(explicit[-1])
        return Parsed(k, "", text) if lo <= k <= hi else Parsed(None, "out_of_range", text)
    brackets = [int(x) for x in _BRACKET_RE.findall(answer)]
    in_range = [k for k in brackets if lo <= k <= hi]
    if in_range:
        return Parsed(in_range[-1], "", text)
    if brackets:
        return Parsed(None, "out_of_range", text)
    return Parsed(None, "unterminated_think" if unterminated else "no_score", text)


# -----------------------------------------------------------------------------
# Best/worst selection: "Aspect: X, Best: i, Worst: j" (paper 000)

_DECOR = r"[\s*_]*"  # whitespace and markdown emphasis allowed around keys and colons
_ASPECT_RE = re.compile(rf"\baspect{_DECOR}:{_DECOR}([a-z]+)", re.I)
_BEST_RE = re.compile(rf"\bbest{_DECOR}:[\s*_{{\[(]*(\d+)", re.I)
_WORST_RE = re.compile(rf"\bworst{_DECOR}:[\s*_{{\[(]*(\d+)", re.I)
_ASPECT_LINES = 3  # Best/Worst may sit on the header line or the two lines after it


def parse_best_worst(
    text: str | None, n_candidates: int, aspects: tuple[str, ...] = ("Lexical", "Structural", "Overall")
) -> dict[str, dict]:
    """Extract paper 000's ``Aspect: X, Best: i, Worst: j`` decisions.

    Rules:
        - Aspect names, keys and spacing are case/whitespace-insensitive; markdown bold
          (``**Best:** 1``), braces/brackets around the index and text around the line are fine.
        - ``Best``/``Worst`` are read from the header line, or from the next two lines when the
          model put them there.
        - A duplicated aspect takes its LAST complete occurrence (both indices present): the
          final decision after any drafts, not a later passing mention such as "for the
          Aspect: Lexical part ...". With no complete occurrence, the last one is reported.
        - ``<think>`` reasoning is ignored (see :func:`split_think`).
        - Unknown aspect names are ignored; only ``aspects`` are reported.

    Args:
        text: Raw judge output.
        n_candidates: Number of candidates; indices must be in ``[0, n_candidates)``.
        aspects: Aspect names to report, as spelled in the result keys.

    Returns:
        ``{aspect: {"best": int | None, "worst": int | None, "error": str}}`` with error ``""``,
        ``"missing"``, ``"malformed"``, ``"out_of_range"`` or ``"best_equals_worst"``; values are
        kept for the last two so callers can count them.

    Raises:
        ValueError: ``n_candidates < 2`` (a caller bug, not model output).

    >>> parse_best_worst("Aspect: Lexical, Best: 1, Worst: 0", 4, ("Lexical",))
    {'Lexical': {'best': 1, 'worst': 0, 'error': ''}}
    >>> parse_best_worst("**Aspect:** overall, **Best:** 2, **Worst:** 2", 4, ("Overall",))
    {'Overall': {'best': 2, 'worst': 2, 'error': 'best_equals_worst'}}
    """
    if n_candidates < 2:
        raise ValueError(f"n_candidates must be >= 2, got {n_candidates}")
    answer = split_think(text)[0] if text else ""
    segments = _aspect_segments(answer)
    result = {}
    for aspect in aspects:
        readings = [_read_indices(s) for s in segments.get(aspect.lower(), [])]
        complete = [r for r in readings if None not in r]
        chosen = complete[-1] if complete else (readings[-1] if readings else None)
        result[aspect] = _judge_indices(chosen, n_candidates)
    return result


def _aspect_segments(answer: str) -> dict[str, list[str]]:
    """Map lower-cased aspect name -> the text after each of its headers, up to the next header."""
    headers = list(_ASPECT_RE.finditer(answer))
    segments: dict[str, list[str]] = {}
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(answer)
        lines = answer[match.end(): end].split("\n")[:_ASPECT_LINES]
        segments.setdefault(match.group(1).lower(), []).append("\n".join(lines))
    return segments


def _read_indices(segment: str) -> tuple[int | None, int | None]:
    best_match, worst_match = _BEST_RE.search(segment), _WORST_RE.search(segment)
    return (int(best_match.group(1)) if best_match else None, int(worst_match.group(1)) if worst_match else None)


def _judge_indices(indices: tuple[int | None, int | None] | None, n_candidates: int) -> dict:
    if indices is None:
        return {"best": None, "worst": None, "error": "missing"}
    best, worst = indices
    if best is None or worst is None:
        error = "malformed"
    elif not (0 <= best < n_candidates and 0 <= worst < n_candidates):
        error = "out_of_range"
    elif best == worst:
        error = "best_equals_worst"
    else:
        error = ""
    return {"best": best, "worst": worst, "error": error}


# -----------------------------------------------------------------------------
# MENLO pairwise grades (paper 003): <think>...</think> then two final_grade blocks


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


_STRICT_TAG_RE = re.compile(r"<\s*(/?)\s*(think|final_grade_a|final_grade_b|final_grade)\s*>", re.I)
_GRADE_CONTENT_RE = re.compile(
    r"^(?P<prefix>final\s*grade\s*:\s*)?\[?\s*(?P<grade>\d+)\b(?!\.\d)\s*\]?\s*"
    r"(?P<sep>[-–—:])?\s*(?P<label>.*?)[\s.]*$",
    re.I | re.S,
)


def _grade_block_re(side: str) -> re.Pattern:
    # Lenient on purpose: "_" vs "." (seen in MENLO's printed Qwen3 outputs), "\_", spaces, case.
    sep = r"[\s_.\\-]*"
    name = rf"final{sep}grade{sep}{side}"
    return re.compile(rf"<\s*{name}\s*>(.*?)<\s*/\s*{name}\s*>", re.I | re.S)


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


def extract_ptb_tree(text: str) -> str:
    """The first balanced bracketed tree in a parser's output ("" when there is none).

    Chatty models wrap the tree in prose or code fences; an unclosed tree (cut by max_tokens) is no parse.

    >>> extract_ptb_tree("Sure! (S (NP (PRP We)) (VP (VBD left))) Hope it helps.")
    '(S (NP (PRP We)) (VP (VBD left)))'
    >>> extract_ptb_tree("(S (NP (PRP We)")
    ''
    """
    start = text.find("(")
    if start < 0:
        return ""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            tree = text[start : i + 1]
            return tree if " " in tree.strip("()") else ""
    return ""
