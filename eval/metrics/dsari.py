"""D-SARI, document-level SARI (Sun, Jin & Wan 2021, "Document-Level Text Simplification:
Dataset, Criteria and Baseline"; reference script `RLSNLP/Document-level-text-simplification/D_SARI.py`).

D-SARI scores one whole document (input I, output O, references R) with Xu et al.'s original
SARI n-gram scores (`eval.metrics.sari.score_xu2016`: KEEP F1, DELETE precision, ADD F1, each averaged
over orders 1..4) and multiplies them by document-level penalties:

    L_I, L_O  = word counts of input and output
    L_R       = int(mean word count of the references)       (truncated, as in the script)
    S_O       = sentence count of the output
    S_R       = int(mean sentence count of the references)   (truncated, as in the script)
    LP_1 = 1 if L_O >= L_R else exp((L_O - L_R) / L_O)          # too-short outputs lose ADD
    LP_2 = 1 if L_O <= L_R else exp((L_R - L_O) / max(L_I - L_R, 1))   # too-long lose KEEP/DEL
    SLP  = exp(-|S_R - S_O| / max(S_R, S_O))                   # wrong sentence count loses KEEP
    D_keep = KEEP · LP_2 · SLP,   D_del = DEL · LP_2,   D_add = ADD · LP_1
    D-SARI = (D_keep + D_del + D_add) / 3                      (we report it in 0..100)

Tokenisation (`tokenizer`):

- **"script" (default): the reference script's own.** `D_SARI.py` takes raw text and builds
  n-grams from `text.lower().split(" ")` and lengths from `len(text.split(" "))`: single spaces
  only, so punctuation stays attached to its word ("fares."), a line break does not separate the
  words around it ("fares.\n\nthe" is one token) and two spaces make an empty token. Sentences:
  `nltk.sent_tokenize` (Punkt) on the raw output and references. We count them with NLTK's Punkt
  algorithm (`eval.metrics.textnorm.punkt_sentences`) given our abbreviation list, because the trained
  English parameters (`punkt_tab`) are not installable offline; Punkt ends sentences only at
  '.', '!' or '?', so a heading line ("# Title", "## Part") joins the next sentence and is not a
  sentence of its own, and a blank line is no boundary.
- **"13a" (knob).** Lowercase, then sacrebleu's '13a' tokenizer (EASSE's preprocessing, as our
  SARI); lengths are 13a tokens. Sentences are counted with Punkt as above.

Other choices:

- **Empty texts.** The script divides by zero when output and references have no sentence
  (SLP); we define SLP = 1 when both sentence counts are 0, and LP_1 = 0 for an output without
  tokens (the script's `split(" ")` never yields one: "" is one empty token).
- **Corpus score.** The script scores one document at a time (`D_SARIsent`); a corpus D-SARI is
  the mean of the document scores.
- **References.** By default all references of a document are used together (multi-reference
  n-gram counts, as in the script). AgentSimp (paper 004) instead scores each reference alone and
  averages; `corpus_dsari(..., per_reference=True)` does that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from eval.metrics.sari import SariScore, score_xu2016, transpose_refs
from eval.metrics.textnorm import count_punkt_sentences, normalize

TOKENIZATIONS = ("script", "13a")


def compute_length_penalties(
    input_len: int, output_len: int, ref_len: int, output_sents: int, ref_sents: int
) -> tuple[float, float, float]:
    """The three D-SARI penalties LP_1, LP_2 and SLP (formulas in the module docstring).

    Args:
        input_len: words in the input document.
        output_len: words in the output document.
        ref_len: mean words per reference (already truncated to int).
        output_sents: sentences in the output.
        ref_sents: mean sentences per reference (already truncated to int).

    Returns:
        (LP_1, LP_2, SLP), each in [0, 1].

    >>> compute_length_penalties(100, 50, 60, 4, 5)  # short output: LP_1 = exp(-10/50)
    (0.8187307530779818, 1, 0.8187307530779818)
    """
    if output_len >= ref_len:
        lp1 = 1
    elif output_len == 0:
        lp1 = 0.0
    else:
        lp1 = math.exp((output_len - ref_len) / output_len)
    lp2 = 1 if output_len <= ref_len else math.exp((ref_len - output_len) / max(input_len - ref_len, 1))
    most = max(ref_sents, output_sents)
    slp = 1.0 if most == 0 else math.exp(-abs(ref_sents - output_sents) / most)
    return lp1, lp2, slp


def tokens(text: str, tokenizer: str = "script") -> list[str]:
    """The tokens D-SARI builds n-grams from and counts as length (module docstring).

    >>> tokens("Bus fares rise.\\n\\nThe  city pays.")
    ['bus', 'fares', 'rise.\\n\\nthe', '', 'city', 'pays.']
    >>> tokens("Bus fares rise.", "13a")
    ['bus', 'fares', 'rise', '.']
    """
    if tokenizer == "script":
        return text.lower().split(" ")
    if tokenizer == "13a":
        return normalize(text, lowercase=True).split()
    raise ValueError(f"unknown D-SARI tokenizer {tokenizer!r}: expected one of {', '.join(TOKENIZATIONS)}")


def document_sari(
    orig_doc: str, sys_doc: str, ref_docs: Sequence[str], return_components: bool = False,
    tokenizer: str = "script",
) -> float | SariScore:
    """D-SARI of one document, in 0..100.

    Args:
        orig_doc: the input document.
        sys_doc: the system's simplified document.
        ref_docs: one or more reference simplifications of the document.
        return_components: return SariScore(d_sari, d_add, d_keep, d_del) instead of the float.
        tokenizer: "script" (the reference script's `lower().split(" ")`) or "13a".

    Returns:
        D-SARI in 0..100, or its penalised components.
    """
    if not ref_docs:
        raise ValueError("document_sari needs at least one reference document")
    orig_toks = tokens(orig_doc, tokenizer)
    sys_toks = tokens(sys_doc, tokenizer)
    refs_toks = [tokens(ref, tokenizer) for ref in ref_docs]
    base = score_xu2016(orig_toks, sys_toks, refs_toks)
    ref_len = int(sum(len(t) for t in refs_toks) / len(refs_toks))
    ref_sents = int(sum(count_punkt_sentences(ref) for ref in ref_docs) / len(ref_docs))
    lp1, lp2, slp = compute_length_penalties(
        len(orig_toks), len(sys_toks), ref_len, count_punkt_sentences(sys_doc), ref_sents
    )
    keep, delete, add = base.keep * lp2 * slp, base.delete * lp2, base.add * lp1
    score = SariScore((add + keep + delete) / 3, add, keep, delete)
    return score if return_components else score.sari


def corpus_dsari(
    orig_docs: Sequence[str],
    sys_docs: Sequence[str],
    refs_docs: Sequence[Sequence[str | None]],
    per_reference: bool = False,
    return_components: bool = False,
    tokenizer: str = "script",
) -> float | SariScore:
    """Mean D-SARI over documents.

    Args:
        orig_docs: input documents.
        sys_docs: output documents, aligned with orig_docs.
        refs_docs: reference streams, shape (n_references, n_documents); None entries skipped.
        per_reference: score each reference alone and average (AgentSimp's protocol) instead
            of scoring all references together.
        return_components: return the mean SariScore instead of the float.
        tokenizer: "script" or "13a" (`document_sari`).

    Returns:
        Mean D-SARI in 0..100, or the mean of each component.
    """
    if len(orig_docs) != len(sys_docs):
        raise ValueError(f"{len(orig_docs)} input documents but {len(sys_docs)} output documents")
    refs_per_doc = transpose_refs(refs_docs, len(orig_docs))
    scores = []
    for orig, out, refs in zip(orig_docs, sys_docs, refs_per_doc):
        if per_reference:
            scores.append(_mean_scores([document_sari(orig, out, [ref], True, tokenizer) for ref in refs]))
        else:
            scores.append(document_sari(orig, out, refs, True, tokenizer))
    mean = _mean_scores(scores) if scores else SariScore(0.0, 0.0, 0.0, 0.0)
    return mean if return_components else mean.sari


def _mean_scores(scores: Sequence[SariScore]) -> SariScore:
    return SariScore(*(sum(parts) / len(scores) for parts in zip(*scores)))
