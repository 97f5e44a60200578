"""Listwise judging, the pure part: one judge call ranks (or grades) a whole group of n responses instead of the
n(n-1)/2 pairwise calls of `/reward/group`'s all_pairs scheme.

    grammar = listwise_grammar(4, "rank", max_tokens=256)   # llguidance Lark: only a permutation of 1..4 decodes
    verdict = parse_ranking("<think>...</think>\\nRANKING: 3 > 1 > 4 > 2", 4)
    verdict.order                                          # [2, 0, 3, 1]: 0-based indices, best first
    rank_rewards(verdict.order, 4)                         # [2/3, 0, 1, 1/3]: the normalised rank

Formats (responses are shown numbered from 1, as ``[Response k]``):

=========  ==================================================  =============================================
mode       constrained completion                              reward of response i
=========  ==================================================  =============================================
``rank``   ``<think> ... </think>`` then                       ``(n - 1 - position_i) / (n - 1)``: 1 for the
           ``RANKING: a > b > ...``, a permutation of 1..n      best, 0 for the worst
``grade``  ``<think> ... </think>`` then ``GRADES:`` and one    ``(g_i - lo) / (hi - lo)``
           ``[k]: g`` line per response, in order, g in lo..hi
=========  ==================================================  =============================================

The rank grammar admits exactly the permutations: one rule per set of responses already ranked (2^n - 1 rules, each
choosing one of the others), so no duplicate or missing index can be decoded. Indices are single digits (n <= 9,
`MAX_LISTWISE`): llguidance's lexer must never see two lexemes where one is a prefix of the other ("1" and "10").
`kendall_tau_b` compares a listwise ranking with the pairwise one (ties in the pairwise mean grades allowed).

Pure: no ray, vllm, deepspeed, torch or llguidance import; the engines compile these strings.
"""

from __future__ import annotations

import dataclasses
import math
import re

from eval.judging.grammar import free_budget

MODES = ("rank", "grade")
MAX_LISTWISE = 9
_RANKING_RE = re.compile(r"RANKING:\s*((?:(?!RANKING:)[^\n])*)")
_GRADE_RE = re.compile(r"^\s*\[(\d+)\]:\s*(-?\d+)\s*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ListwiseVerdict:
    """A parsed listwise answer: `order` (0-based indices, best first) or `grades` (per response, in order); the
    other is None. `error` is "" when the answer parsed."""

    order: list[int] | None = None
    grades: list[int] | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def _check_n(n: int) -> None:
    if not 2 <= n <= MAX_LISTWISE:
        raise ValueError(f"listwise judging ranks 2..{MAX_LISTWISE} responses, got {n}")


def listwise_grammar(n: int, mode: str, max_tokens: int, lo: int = 1, hi: int = 5) -> str:
    """The Lark grammar (llguidance dialect) of a listwise answer for `n` responses (see the module table).

    Raises:
        ValueError: an unknown mode, n outside 2..MAX_LISTWISE, or a grade range that is not single digits.

    >>> print(listwise_grammar(2, "rank", 8))
    start: "<think> </think>" "\\nRANKING: " r0
    r0: "1" " > " r1 | "2" " > " r2
    r1: "2"
    r2: "1"
    <BLANKLINE>
    """
    _check_n(n)
    if mode == "rank":
        verdict = "\nRANKING: " + " > ".join(str(k) for k in range(1, n + 1))
        rules = ['"\\nRANKING: " r0', *_permutation_rules(n)]
    elif mode == "grade":
        if not 0 <= lo < hi <= 9:
            raise ValueError(f"grade range must be single digits lo < hi, got {lo}..{hi}")
        verdict = "\nGRADES:" + "".join(f"\n[{k}]: {hi}" for k in range(1, n + 1))
        lines = " ".join(f'"\\n[{k}]: " grade' for k in range(1, n + 1))
        rules = [f'"\\nGRADES:" {lines}', f"grade: /[{lo}-{hi}]/"]
    else:
        raise ValueError(f"listwise mode {mode!r} is not one of {MODES}")
    budget = free_budget(max_tokens, "<think></think>" + verdict)
    think = '"<think>" reasoning "</think>"' if budget else '"<think> </think>"'
    out = [f"start: {think} {rules[0]}", *rules[1:]]
    if budget:
        out.append(f"reasoning[max_tokens={budget}]: /[^<]*/")
    return "\n".join(out) + "\n"


def _permutation_rules(n: int) -> list[str]:
    """``r<mask>``: the rest of a ranking once the responses in bit set `mask` are placed."""
    full = (1 << n) - 1
    rules = []
    for mask in range(full):
        choices = []
        for i in range(n):
            if mask & (1 << i):
                continue
            rest = mask | (1 << i)
            choices.append(f'"{i + 1}"' if rest == full else f'"{i + 1}" " > " r{rest}')
        rules.append(f"r{mask}: " + " | ".join(choices))
    return rules


def parse_ranking(text: str | None, n: int) -> ListwiseVerdict:
    """The last ``RANKING:`` line of `text` as 0-based indices, best first; an error unless it is a permutation
    of 1..n (a duplicate, a missing or an unknown index is never repaired).

    >>> parse_ranking("RANKING: 2 > 1 > 3", 3).order
    [1, 0, 2]
    >>> parse_ranking("RANKING: 2 > 2 > 3", 3).error
    'ranking is not a permutation of 1..3: [2, 2, 3]'
    """
    _check_n(n)
    found = _RANKING_RE.findall(text or "")
    if not found:
        return ListwiseVerdict(error="no RANKING: line")
    parts = [p.strip().strip("[]") for p in found[-1].split(">")]
    if not all(p.isdigit() for p in parts):
        return ListwiseVerdict(error=f"ranking has a non-number: {found[-1].strip()!r}")
    numbers = [int(p) for p in parts]
    if sorted(numbers) != list(range(1, n + 1)):
        return ListwiseVerdict(error=f"ranking is not a permutation of 1..{n}: {numbers}")
    return ListwiseVerdict(order=[k - 1 for k in numbers])


def parse_grades(text: str | None, n: int, lo: int = 1, hi: int = 5) -> ListwiseVerdict:
    """The ``[k]: g`` lines after the last ``GRADES:`` of `text`: one per response 1..n, in order, g in lo..hi.

    >>> parse_grades("GRADES:\\n[1]: 4\\n[2]: 2", 2).grades
    [4, 2]
    """
    _check_n(n)
    text = text or ""
    at = text.rfind("GRADES:")
    if at < 0:
        return ListwiseVerdict(error="no GRADES: line")
    pairs = [(int(k), int(g)) for k, g in _GRADE_RE.findall(text[at + len("GRADES:"):])]
    if [k for k, _ in pairs] != list(range(1, n + 1)):
        return ListwiseVerdict(error=f"grades must list responses 1..{n} once each, in order; got "
                                     f"{[k for k, _ in pairs]}")
    grades = [g for _, g in pairs]
    if any(not lo <= g <= hi for g in grades):
        return ListwiseVerdict(error=f"grade outside {lo}..{hi}: {grades}")
    return ListwiseVerdict(grades=grades)


def rank_rewards(order: list[int], n: int) -> list[float]:
    """Normalised rank reward per response (in response order): 1 for the best, 0 for the worst, evenly spaced.

    >>> rank_rewards([2, 0, 3, 1], 4)
    [0.6666666666666666, 0.0, 1.0, 0.3333333333333333]
    """
    if sorted(order) != list(range(n)):
        raise ValueError(f"order {order} is not a permutation of 0..{n - 1}")
    rewards = [0.0] * n
    for position, index in enumerate(order):
        rewards[index] = (n - 1 - position) / (n - 1)
    return rewards


def grade_rewards(grades: list[int], lo: int = 1, hi: int = 5) -> list[float]:
    """Grades mapped to [0, 1]: ``(g - lo) / (hi - lo)``. >>> grade_rewards([5, 3, 1])  ->  [1.0, 0.5, 0.0]"""
    return [(g - lo) / (hi - lo) for g in grades]


def kendall_tau_b(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b of two scorings of the same items (ties allowed on either side; nan when one side is all
    ties). Compare a listwise ranking (as scores, e.g. `rank_rewards`) with the pairwise mean grades.

    >>> kendall_tau_b([3, 2, 1], [3, 1, 2])          # 2 concordant pairs, 1 discordant
    0.3333333333333333
    """
    if len(xs) != len(ys):
        raise ValueError(f"kendall_tau_b: {len(xs)} x values, {len(ys)} y values")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else math.nan
