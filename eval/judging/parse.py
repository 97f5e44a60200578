"""Parsers for judge outputs: jury scores and best/worst selections (MENLO grade blocks: `eval.judging.menlo_parse`).

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

from eval.answers import Parsed, split_think

# -----------------------------------------------------------------------------
# Jury score: "... Answer: [k]" (paper 001)

_ANSWER_RE = re.compile(r"answer[\s*_]*:[\s*_]*\[\s*(\d+)\s*\]", re.IGNORECASE)
# a bracketed integer followed by ":" is the rubric being quoted ("[5]: The sentence is fully simplified ..."), which
# a rationale cut off by max_tokens often ends with: never an answer
_BRACKET_RE = re.compile(r"\[\s*(\d+)\s*\](?!\s*:)")


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
    >>> parse_score("It reads well, close to [5]: The sentence is fully simplified, entirely").error
    'no_score'
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
_ASPECT_RE = re.compile(rf"\baspect{_DECOR}:{_DECOR}([a-z]+)", re.IGNORECASE)
_BEST_RE = re.compile(rf"\bbest{_DECOR}:[\s*_{{\[(]*(\d+)", re.IGNORECASE)
_WORST_RE = re.compile(rf"\bworst{_DECOR}:[\s*_{{\[(]*(\d+)", re.IGNORECASE)
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
