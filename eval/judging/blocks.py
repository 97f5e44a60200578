"""Paper 000's judge input blocks (format of Figs. 8-10 / notes A.1): the numbered candidates, the word-alignment
section and the parse section a judge template's {candidates} / {alignments} / {parses} slots take. Pure text.
Split from `eval.prompts` (which loads and renders the templates)."""

from __future__ import annotations

import re

from eval.metrics.textnorm import tokenize_for_alignment

# Rendered in place of the whole alignment / parse section when that judge feature is switched off.
# An explicit line tells the judge the material was withheld on purpose, rather than leaving a gap
# that looks like a formatting accident next to the three worked examples that do show it.
ALIGNMENTS_ABSENT = "Word alignments: not provided."
PARSES_ABSENT = "Parses: not provided."
# Rendered for one candidate whose alignment or parse failed upstream (nothing is silently skipped).
FEATURE_UNAVAILABLE = "(not available)"
INDENT = "    "


def render_candidates_block(candidates: list[str]) -> str:
    """Number candidates as in paper 000's judge input.

    Args:
        candidates: Candidate texts in the order shown to the judge.

    Returns:
        ``"0: ...\\n1: ..."``.

    >>> render_candidates_block(["A b.", "C."])
    '0: A b.\\n1: C.'
    """
    return "\n".join(f"{i}: {c}" for i, c in enumerate(candidates))


def render_alignment_block(index: int, source: str, candidate: str, pairs: list[tuple[int, int]] | None) -> str:
    """Render one candidate's alignment block: header, source tokens, candidate tokens, aligned pairs.

    Args:
        index: Candidate index as shown to the judge.
        source: Source sentence.
        candidate: Candidate sentence.
        pairs: ``(src_idx, tgt_idx)`` token pairs (indices into the token lists of
            :func:`tokenize_for_alignment`); rendered sorted by ``(src, tgt)`` as in the paper's
            examples. ``None`` means the aligner failed for this candidate.

    Returns:
        ``"k alignment:\\n    0_w ...\\n    0_v ...\\n    0_w-0_v ..."``.

    Raises:
        ValueError: A pair index is outside its sentence (a caller bug, not model output).

    >>> print(render_alignment_block(1, "We'll go.", "We will go.", [(1, 2), (0, 0), (0, 1)]))
    1 alignment:
        0_we'll 1_go.
        0_we 1_will 2_go.
        0_we'll-0_we 0_we'll-1_will 1_go.-2_go.
    """
    header = f"{index} alignment:"
    if pairs is None:
        return f"{header}\n{INDENT}{FEATURE_UNAVAILABLE}"
    src, tgt = tokenize_for_alignment(source), tokenize_for_alignment(candidate)
    for s, t in pairs:
        if not (0 <= s < len(src) and 0 <= t < len(tgt)):
            raise ValueError(f"alignment pair ({s}, {t}) out of range for {len(src)}x{len(tgt)} tokens")
    lines = [
        " ".join(f"{i}_{w}" for i, w in enumerate(src)),
        " ".join(f"{i}_{w}" for i, w in enumerate(tgt)),
        " ".join(f"{s}_{src[s]}-{t}_{tgt[t]}" for s, t in sorted(pairs)),
    ]
    return "\n".join([header, *(INDENT + line for line in lines)])


def render_alignments_section(
    source: str, candidates: list[str], alignments: list[list[tuple[int, int]] | None] | None
) -> str:
    """Render the alignment blocks of all candidates, or :data:`ALIGNMENTS_ABSENT` when switched off.

    Args:
        source: Source sentence.
        candidates: Candidates in shown order.
        alignments: One pair list (or ``None`` for a failed alignment) per candidate; ``None``
            overall when the alignment feature is off.

    Returns:
        The ``{alignments}`` value for ``judge_policy.yaml``.
    """
    if alignments is None:
        return ALIGNMENTS_ABSENT
    if len(alignments) != len(candidates):
        raise ValueError(f"{len(alignments)} alignments for {len(candidates)} candidates")
    return "\n".join(render_alignment_block(i, source, c, a) for i, (c, a) in enumerate(zip(candidates, alignments)))


def flatten_parse(parse: str) -> str:
    """Put a parse on one line: each whitespace run containing a line break becomes a literal ``\\n`` and a space.

    This mirrors the escaped one-line style of the parses in paper 000's worked examples.

    >>> flatten_parse("(S\\n  (NP (PRP We))\\n  (. .))")
    '(S\\\\n (NP (PRP We))\\\\n (. .))'
    """
    return re.sub(r"[ \t]*\r?\n\s*", r"\\n ", parse.strip())


def render_parses_section(source_parse: str | None, candidate_parses: list[str | None] | None) -> str:
    """Render ``Source parse:`` then ``k parse:`` blocks, or :data:`PARSES_ABSENT` when switched off.

    Args:
        source_parse: PTB parse of the source (``None`` if it failed).
        candidate_parses: One parse (or ``None`` if it failed) per candidate; ``None`` overall when
            the parse feature is off.

    Returns:
        The ``{parses}`` value for ``judge_policy.yaml``.

    >>> print(render_parses_section("(S (NN Hi))", ["(S (UH Hi))", None]))
    Source parse:
        (S (NN Hi))
    0 parse:
        (S (UH Hi))
    1 parse:
        (not available)
    """
    if candidate_parses is None:
        return PARSES_ABSENT
    blocks = [("Source parse:", source_parse)] + [(f"{i} parse:", p) for i, p in enumerate(candidate_parses)]
    rendered = [(head, flatten_parse(p) if p is not None else FEATURE_UNAVAILABLE) for head, p in blocks]
    return "\n".join(f"{head}\n{INDENT}{body}" for head, body in rendered)
