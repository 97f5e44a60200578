"""Grammars for judge verdicts: the fixed output formats our parsers read, as constraints for decoding.

Each function returns a grammar in llguidance's Lark dialect (the format `kind: hf` decodes under with llguidance
and `kind: vllm` / vLLM-served `kind: openai` pass to vLLM's `guidance` structured-output backend). A completion
that matches it always parses with the format's parser in `eval.judging.parse` / `eval.judging.menlo_parse`:

=================  =====================================================  ==========================================
format             constrained completion                                 parser
=================  =====================================================  ==========================================
``best_worst``     ``Aspect: Lexical, Best: i, Worst: j`` x 3 aspects      ``parse_best_worst`` (paper 000)
                   (i != j), analysis lines allowed after Lexical and
                   Structural as in the paper's worked examples
``score``          free rationale, then ``[k]`` (the prompt's             ``parse_score`` (paper 001)
                   ``Answer: [k]``), k in lo..hi
``pairwise``       ``<think> ... </think>`` then the two MENLO grade      ``parse_menlo_grades`` / ``parse_pairwise``
                   blocks ``FINAL GRADE: k - LABEL``                      (paper 003)
``pointwise``      ``<think> ... </think>`` then one grade block          ``parse_menlo_grade`` (paper 003)
=================  =====================================================  ==========================================

Free text (rationale, analysis, thinking) is kept, never removed: the grammar bounds it in tokens so the verdict
always fits in `max_tokens`. The verdict needs at most `reserve_tokens(verdict)` tokens, a bound from its length in
characters (a BPE token covers at least one character; ours average three, the bound assumes two) plus a margin;
whatever is left of `max_tokens` is the free-text budget. A budget under `MIN_FREE_TOKENS` leaves no free text.

`thinking=True` (a reasoning judge, EngineSpec.thinking) puts a bounded ``<think> ... </think>`` block before
formats that have none, so reasoning stays free and only the verdict after it is constrained.

Pure: no ray, vllm, deepspeed, torch or llguidance import; the engines compile these strings.
"""

from __future__ import annotations

import itertools
import math

from eval.judging.menlo_parse import MENLO_LABELS
from eval.lark_text import MIN_FREE_TOKENS, lark_string, up_to

FORMATS = ("best_worst", "score", "pairwise", "pointwise")
ASPECTS = ("Lexical", "Structural", "Overall")
_RESERVE_MARGIN = 8


def reserve_tokens(verdict: str) -> int:
    """Tokens the verdict `verdict` may need at most: half its characters, rounded up, plus a margin.

    >>> reserve_tokens("Aspect: Lexical, Best: 0, Worst: 1")
    25
    """
    return math.ceil(len(verdict) / 2) + _RESERVE_MARGIN


def free_budget(max_tokens: int, verdict: str, blocks: int = 1) -> int:
    """Token budget of each of `blocks` free-text blocks (0 = no free text) so that `verdict` still fits.

    >>> free_budget(64, "Aspect: Structural, Best: 0, Worst: 1" * 3)
    0
    >>> free_budget(512, "[5]")
    502
    """
    per_block = (max_tokens - reserve_tokens(verdict)) // max(blocks, 1)
    return per_block if per_block >= MIN_FREE_TOKENS else 0


def judge_grammar(fmt: str, max_tokens: int, *, n_candidates: int = 4, lo: int = 1, hi: int = 5,
                  thinking: bool = False) -> str:
    """The grammar of judge format `fmt` (see the module table) within `max_tokens` completion tokens.

    Raises:
        ValueError: an unknown format, fewer than 2 candidates, or an empty score range (caller bugs).
    """
    if fmt == "best_worst":
        return best_worst_grammar(n_candidates, max_tokens, thinking=thinking)
    if fmt == "score":
        return score_grammar(max_tokens, lo=lo, hi=hi, thinking=thinking)
    if fmt in ("pairwise", "pointwise"):
        return menlo_grammar(fmt, max_tokens)
    raise ValueError(f"judge format {fmt!r} has no grammar (one of {', '.join(FORMATS)})")


def best_worst_grammar(n_candidates: int, max_tokens: int, aspects: tuple[str, ...] = ASPECTS,
                       thinking: bool = False) -> str:
    """Paper 000's verdict: one `Aspect: X, Best: i, Worst: j` line per aspect, i != j, i and j < n_candidates.

    As in the paper's worked examples (Figs. 8-10), the Lexical and Structural lines may be followed by analysis
    lines (an optional `Analysis:` line, then `k: ...` per candidate), each block within its token budget.

    >>> g = best_worst_grammar(2, 64)
    >>> '"Best: 0, Worst: 1" | "Best: 1, Worst: 0"' in g
    True
    """
    if n_candidates < 2:
        raise ValueError(f"best_worst needs at least 2 candidates, got {n_candidates}")
    longest = max(aspects, key=len)
    verdict = "\n".join(f"Aspect: {longest}, Best: {n_candidates - 1}, Worst: {n_candidates - 2}" for _ in aspects)
    analysed = [a for a in aspects if a != "Overall"]
    think = _think_budget(thinking, max_tokens, verdict)
    block = free_budget(max_tokens - think, verdict, blocks=len(analysed))
    # a block is an optional "Analysis:" line (3 tokens) and one line per candidate: "k: " (2 tokens), text, "\n"
    line = (block - 3) // n_candidates - 3 if block else 0
    line = line if line >= MIN_FREE_TOKENS // 2 else 0
    picks = " | ".join(lark_string(f"Best: {b}, Worst: {w}")
                       for b, w in itertools.permutations(range(n_candidates), 2))
    lines = []
    for k, aspect in enumerate(aspects):
        rule = f"{lark_string(f'Aspect: {aspect}, ')} pick"
        if k < len(aspects) - 1:
            rule += ' "\\n"' + (" analysis?" if aspect in analysed and line else "")
        lines.append(rule)
    rules = [f"verdict: {' '.join(lines)}", f"pick: {picks}"]
    if line:
        # each line's text is bounded and its newline is a literal of its own, so a line cut at its budget still
        # ends before the next "Aspect:" header (the lexer never backtracks: no two lexemes may share a prefix)
        index = " | ".join(lark_string(str(k)) for k in range(n_candidates))
        rules += [f'analysis: "Analysis:\\n"? note {up_to("note", n_candidates - 1)}',
                  f'note: ({index}) ": " note_text "\\n"',
                  f"note_text[max_tokens={line}]: /[^\\n]*/"]
    return _with_think(rules, think)


def score_grammar(max_tokens: int, lo: int = 1, hi: int = 5, thinking: bool = False) -> str:
    """Paper 001's verdict: a rationale without square brackets, then `[k]` with lo <= k <= hi.

    The prompt asks for "... Answer: [k]"; the model writes "Answer: " in its rationale and the grammar closes it
    with the bracketed score (a rationale cut at its budget gets the bracket forced, which `parse_score` also reads).

    >>> '"[" /[1-5]/ "]"' in score_grammar(32)
    True
    """
    if not 0 <= lo <= hi <= 9:
        raise ValueError(f"score range must be single digits lo <= hi, got {lo}..{hi}")
    think = _think_budget(thinking, max_tokens, "[5]")
    budget = free_budget(max_tokens - think, "Answer: [5]")
    rules = [f'verdict: {"rationale " if budget else ""}"[" /[{lo}-{hi}]/ "]"']
    if budget:
        rules.append(f"rationale[max_tokens={budget}]: /[^\\[\\]]*/")
    return _with_think(rules, think)


def menlo_grammar(mode: str, max_tokens: int) -> str:
    """MENLO's format (paper 003): `<think> reasoning </think>` then one grade block per response.

    Grade blocks read `<final_grade_A> FINAL GRADE: k - LABEL </final_grade_A>` (pairwise, A then B) or
    `<final_grade> ... </final_grade>` (pointwise), with the label of grade k, as in MENLO's prompts.

    >>> '"3 - PASS"' in menlo_grammar("pointwise", 96)
    True
    """
    sides = ("_A", "_B") if mode == "pairwise" else ("",)
    blocks = [f'"\\n<final_grade{s}> FINAL GRADE: " grade " </final_grade{s}>"' for s in sides]
    verdict = "".join(f"\n<final_grade{s}> FINAL GRADE: 2 - MINOR FAILURE </final_grade{s}>" for s in sides)
    budget = free_budget(max_tokens, "<think></think>" + verdict)
    grades = " | ".join(lark_string(f"{k} - {label}") for k, label in sorted(MENLO_LABELS.items()))
    think = '"<think>" reasoning "</think>"' if budget else '"<think> </think>"'
    rules = [f"start: {think} {' '.join(blocks)}", f"grade: {grades}"]
    if budget:
        rules.append(f"reasoning[max_tokens={budget}]: /[^<]*/")
    return "\n".join(rules) + "\n"


def _think_budget(thinking: bool, max_tokens: int, verdict: str) -> int:
    """Tokens of a reasoning judge's `<think>` block: half of what the verdict leaves, the rest for its text."""
    return free_budget(max_tokens, verdict) // 2 if thinking else 0


def _with_think(rules: list[str], think: int) -> str:
    start = 'start: "<think>" thinking "</think>" /\\n{0,2}/ verdict' if think else "start: verdict"
    extra = [f"thinking[max_tokens={think}]: /[^<]*/"] if think else []
    return "\n".join([start, *rules, *extra]) + "\n"
