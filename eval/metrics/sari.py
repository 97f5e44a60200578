"""SARI (Xu et al. 2016), numerically identical to EASSE's `easse.sari`.

SARI compares a system output (sys) with its source (orig) and references (refs) on word
n-grams of order 1..4 and scores three operations: ADD (n-grams in sys but not in orig), KEEP
(n-grams of orig that sys keeps) and DELETE (n-grams of orig that sys drops). SARI is the mean of
the three operation scores, each in 0..100.

Every choice below follows EASSE (feralvam/easse, `easse/sari.py`, `get_corpus_sari_operation_scores`
with its defaults) and was checked against the reference tables in
`shared/data/{turkcorpus,asset}/reference-values.md` (identical to 4 decimals):

- **Preprocessing.** orig, sys and refs are all lowercased (`lowercase=True`) and then tokenised
  with sacrebleu's '13a' tokenizer (see `eval.metrics.textnorm.normalize`); n-grams are runs of
  whitespace tokens. EASSE's `legacy=True` (orig left untouched, a bug of the Java original) is
  not offered.
- **Multiple references.** Per sentence, the n-gram counts of all references are *summed*, and
  the counts of orig and sys are *multiplied by the number of references* R, so that KEEP and
  DELETE weigh each n-gram by how many references keep or delete it:
  - ADD is binary (sets): added = ngrams(sys) - ngrams(orig); correct = added ∩ ngrams(any ref);
    the reference total is |ngrams(any ref) - ngrams(orig)|.
  - KEEP (counts): kept_sys = min(R·orig, R·sys); kept_ref = min(R·orig, Σrefs);
    correct = min(R·orig, R·sys, Σrefs).
  - DELETE (counts): del_sys = max(R·orig - R·sys, 0); del_ref = max(R·orig - Σrefs, 0);
    correct = min(del_sys, del_ref).
  A reference given as None is skipped (the sentence then has fewer references; sacrebleu treats
  None the same way); an empty string is a real, empty reference, as in EASSE.
- **Corpus aggregation.** The nine counts (correct, sys total, ref total for each operation) are
  *summed over all sentences* per n-gram order; corpus SARI is *not* a mean of sentence scores. Then, per order n, precision = correct/sys_total,
  recall = correct/ref_total (0 when the denominator is 0) and F1 (0 unless both are > 0); each
  operation score is the *mean over the 4 orders of the per-order F1* (EASSE's
  `compute_macro_sari`, the behaviour of the Java implementation; EASSE's `use_paper_version`
  averages precision and recall first and is not offered). At corpus level DELETE is an F1 too
  (`use_f1_for_deletion=True`, EASSE's default).
- **Sentence level.** `sentence_sari` is the corpus computation on a one-sentence corpus, with
  DELETE scored by precision only (as in Xu et al.'s sentence-level SARI). That reproduces
  EASSE's documented `sentence_sari` example (26.953601953601954).
- **Xu et al.'s original sentence-level SARI** (`cocoxu/simplification/SARI.py`, `SARIsent`)
  averages KEEP/DELETE precision over n-gram *types* with fractional credit instead of summing
  counts, so it gives different numbers (26.8278 instead of 26.9536 on the example above). It is
  available as `sentence_sari_xu2016`, because D-SARI (`eval.metrics.dsari`) is built on it.

Run the benchmark with `python -m bench.metrics`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

from eval.metrics.textnorm import check_tokenizer, normalize

NGRAM_ORDER = 4

# Index of each count in the per-order statistics list.
ADD_CORRECT, ADD_SYS, ADD_REF, KEEP_CORRECT, KEEP_SYS, KEEP_REF, DEL_CORRECT, DEL_SYS, DEL_REF = range(9)


class SariScore(NamedTuple):
    """SARI and its three operation scores, all in 0..100."""

    sari: float
    add: float
    keep: float
    delete: float


# ----------------------------------------------------------------------------- inputs


def transpose_refs(refs_sents: Sequence[Sequence[str | None]], n_sents: int) -> list[list[str]]:
    """Turn EASSE-style reference streams into one list of references per sentence.

    Args:
        refs_sents: reference streams, shape (n_references, n_sentences); None entries are
            skipped.
        n_sents: number of sentences every stream must have.

    Returns:
        A list of length n_sents with the non-None references of each sentence.

    Raises:
        ValueError: no stream, a stream of the wrong length, or a sentence left without any
            reference.
        TypeError: refs_sents is a flat list of strings instead of a list of streams.
    """
    if isinstance(refs_sents, str) or not len(refs_sents):
        raise ValueError("refs_sents must hold at least one reference stream (a list of sentences)")
    for k, stream in enumerate(refs_sents):
        if isinstance(stream, str):
            raise TypeError(
                f"refs_sents[{k}] is a string: pass a list of reference streams, "
                "each a list with one reference per sentence (EASSE's layout)"
            )
        if len(stream) != n_sents:
            raise ValueError(f"reference stream {k} has {len(stream)} sentences but there are {n_sents} outputs")
    per_sentence = [[ref for ref in refs if ref is not None] for refs in zip(*refs_sents)]
    for i, refs in enumerate(per_sentence):
        if not refs:
            raise ValueError(f"sentence {i} has no reference (every stream holds None there)")
    return per_sentence


def _check_lengths(orig_sents: Sequence[str], sys_sents: Sequence[str]) -> None:
    if len(orig_sents) != len(sys_sents):
        raise ValueError(f"{len(orig_sents)} source sentences but {len(sys_sents)} system outputs")


# ----------------------------------------------------------------------------- statistics


def extract_ngrams(tokens: Sequence[str]) -> list[Counter]:
    """Counts of the n-grams of orders 1..4 (tuples of tokens), one Counter per order."""
    return [Counter(zip(*(tokens[i:] for i in range(n)))) for n in range(1, NGRAM_ORDER + 1)]


def _sum_ref_ngrams(refs_tokens: Sequence[Sequence[str]]) -> list[Counter]:
    return [
        Counter(chain.from_iterable(zip(*(toks[i:] for i in range(n))) for toks in refs_tokens))
        for n in range(1, NGRAM_ORDER + 1)
    ]


def _order_stats(orig: Counter, sys: Counter, refs: Counter, n_refs: int) -> list[int]:
    added = sys.keys() - orig.keys()
    keep_correct = keep_sys = keep_ref = del_correct = del_sys = del_ref = 0
    sys_get, refs_get = sys.get, refs.get
    # Conditional expressions instead of min()/max(): this loop is the hot spot of corpus SARI.
    for gram, count in orig.items():
        o, s, r = count * n_refs, sys_get(gram, 0) * n_refs, refs_get(gram, 0)
        kept = o if o < s else s  # noqa: FURB136
        keep_correct += kept if kept < r else r  # noqa: FURB136
        keep_sys += kept
        keep_ref += o if o < r else r  # noqa: FURB136
        d_sys = o - s if o > s else 0
        d_ref = o - r if o > r else 0
        del_correct += d_sys if d_sys < d_ref else d_ref  # noqa: FURB136
        del_sys += d_sys
        del_ref += d_ref
    add_correct = len(added & refs.keys())
    add_ref = len(refs.keys() - orig.keys())
    return [add_correct, len(added), add_ref, keep_correct, keep_sys, keep_ref, del_correct, del_sys, del_ref]


def compute_sentence_stats(
    orig_tokens: Sequence[str], sys_tokens: Sequence[str], refs_tokens: Sequence[Sequence[str]]
) -> list[list[int]]:
    """EASSE's nine SARI counts for one sentence, per n-gram order.

    Args:
        orig_tokens: source tokens (already normalised).
        sys_tokens: system output tokens.
        refs_tokens: one token list per reference.

    Returns:
        4 lists (orders 1..4) of 9 counts, indexed by ADD_CORRECT .. DEL_REF.
    """
    orig, sys, refs = extract_ngrams(orig_tokens), extract_ngrams(sys_tokens), _sum_ref_ngrams(refs_tokens)
    return [_order_stats(orig[n], sys[n], refs[n], len(refs_tokens)) for n in range(NGRAM_ORDER)]


def _precision_recall_f1(correct: int, sys_total: int, ref_total: int) -> tuple[float, float, float]:
    precision = correct / sys_total if sys_total > 0 else 0.0
    recall = correct / ref_total if ref_total > 0 else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision > 0 and recall > 0 else 0.0
    return precision, recall, f1


def score_stats(stats: Sequence[Sequence[int]], use_f1_for_deletion: bool = True) -> SariScore:
    """Turn (summed) per-order counts into SARI, as EASSE's `compute_macro_sari` does.

    Args:
        stats: 4 lists of 9 counts, as from `compute_sentence_stats` (or their sum).
        use_f1_for_deletion: score DELETE by F1 (corpus level) instead of precision (sentence level).

    Returns:
        The SariScore, each part the mean over orders of the per-order score, times 100.
    """
    add = keep = delete = 0.0
    for order in stats:
        add += _precision_recall_f1(*order[ADD_CORRECT : ADD_REF + 1])[2]
        keep += _precision_recall_f1(*order[KEEP_CORRECT : KEEP_REF + 1])[2]
        del_p, _, del_f1 = _precision_recall_f1(*order[DEL_CORRECT : DEL_REF + 1])
        delete += del_f1 if use_f1_for_deletion else del_p
    add, keep, delete = (100.0 * x / NGRAM_ORDER for x in (add, keep, delete))
    return SariScore((add + keep + delete) / 3, add, keep, delete)


def _sum_stats(all_stats: Sequence[list[list[int]]]) -> list[list[int]]:
    total = [[0] * 9 for _ in range(NGRAM_ORDER)]
    for stats in all_stats:
        for n in range(NGRAM_ORDER):
            total[n] = [a + b for a, b in zip(total[n], stats[n])]
    return total


def compute_corpus_stats(
    orig_sents: Sequence[str],
    sys_sents: Sequence[str],
    refs_sents: Sequence[Sequence[str | None]],
    lowercase: bool = True,
    tokenizer: str = "13a",
) -> list[list[list[int]]]:
    """Normalise a corpus and compute the SARI counts of every sentence.

    Args:
        orig_sents: source sentences.
        sys_sents: system outputs, aligned with orig_sents.
        refs_sents: reference streams (n_references × n_sentences), EASSE's layout.
        lowercase: lowercase before tokenising.
        tokenizer: '13a', 'intl' or 'none'.

    Returns:
        One `compute_sentence_stats` result per sentence.
    """
    _check_lengths(orig_sents, sys_sents)
    check_tokenizer(tokenizer)
    refs_per_sent = transpose_refs(refs_sents, len(orig_sents))

    def toks(text: str) -> list[str]:
        return normalize(text, lowercase, tokenizer).split()

    return [
        compute_sentence_stats(toks(orig), toks(sys), [toks(ref) for ref in refs])
        for orig, sys, refs in zip(orig_sents, sys_sents, refs_per_sent)
    ]


# ----------------------------------------------------------------------------- public scores


def corpus_sari(
    orig_sents: Sequence[str],
    sys_sents: Sequence[str],
    refs_sents: Sequence[Sequence[str | None]],
    lowercase: bool = True,
    tokenizer: str = "13a",
    return_components: bool = False,
) -> float | SariScore:
    """Corpus SARI exactly as EASSE's `corpus_sari` (see the module docstring).

    Args:
        orig_sents: source sentences.
        sys_sents: system outputs, aligned with orig_sents.
        refs_sents: reference streams, shape (n_references, n_sentences).
        lowercase: lowercase everything before tokenising (EASSE default True).
        tokenizer: '13a' (default), 'intl' or 'none'.
        return_components: return a SariScore(sari, add, keep, delete) instead of the float.

    Returns:
        SARI in 0..100, or the SariScore.

    >>> corpus_sari(["About 95 species are currently accepted.", "The cat perched on the mat."],
    ...             ["About 95 you now get in.", "Cat on mat."],
    ...             [["About 95 species are currently known.", "The cat sat on the mat."],
    ...              ["About 95 species are now accepted.", "The cat is on the mat."],
    ...              ["95 species are now accepted.", "The cat sat."]])
    33.17472563619544
    """
    stats = compute_corpus_stats(orig_sents, sys_sents, refs_sents, lowercase, tokenizer)
    score = score_stats(_sum_stats(stats), use_f1_for_deletion=True)
    return score if return_components else score.sari


def sentence_sari(
    orig_sent: str,
    sys_sent: str,
    ref_sents: Sequence[str],
    lowercase: bool = True,
    tokenizer: str = "13a",
    return_components: bool = False,
) -> float | SariScore:
    """Sentence SARI as EASSE's `sentence_sari`: a one-sentence corpus, DELETE by precision.

    Args:
        orig_sent: source sentence.
        sys_sent: system output.
        ref_sents: the references of this sentence (a flat list).
        lowercase: lowercase before tokenising.
        tokenizer: '13a', 'intl' or 'none'.
        return_components: return a SariScore instead of the float.

    Returns:
        SARI in 0..100, or the SariScore.

    >>> sentence_sari("About 95 species are currently accepted.", "About 95 you now get in.",
    ...               ["About 95 species are currently known.", "About 95 species are now accepted.",
    ...                "95 species are now accepted."])
    26.95360195360195
    """
    score = sentence_sari_scores([orig_sent], [sys_sent], [[ref] for ref in ref_sents], lowercase, tokenizer)[0]
    return score if return_components else score.sari


def sentence_sari_scores(
    orig_sents: Sequence[str],
    sys_sents: Sequence[str],
    refs_sents: Sequence[Sequence[str | None]],
    lowercase: bool = True,
    tokenizer: str = "13a",
) -> list[SariScore]:
    """`sentence_sari` of every sentence of a corpus, normalising each text once.

    Args:
        orig_sents: source sentences.
        sys_sents: system outputs.
        refs_sents: reference streams, shape (n_references, n_sentences).
        lowercase: lowercase before tokenising.
        tokenizer: '13a', 'intl' or 'none'.

    Returns:
        One SariScore per sentence.
    """
    stats = compute_corpus_stats(orig_sents, sys_sents, refs_sents, lowercase, tokenizer)
    return [score_stats(s, use_f1_for_deletion=False) for s in stats]


# ----------------------------------------------------------------------------- Xu et al. 2016 original


def _xu_order_scores(orig: Counter, sys: Counter, refs: Counter, n_refs: int) -> tuple[float, float, float]:
    # Fractional credit per n-gram type, then a mean over types (SARI.py's SARIngram).
    kept = {g: min(c, sys[g]) * n_refs for g, c in orig.items() if g in sys}
    kept_all = {g: min(c * n_refs, refs[g]) for g, c in orig.items() if g in refs}
    kept_good = {g: min(k, refs[g]) for g, k in kept.items() if g in refs}
    keep_p = sum(v / kept[g] for g, v in kept_good.items()) / len(kept) if kept else 0.0
    keep_r = sum(v / kept_all[g] for g, v in kept_good.items()) / len(kept_all) if kept_all else 0.0
    deleted = {g: (c - sys.get(g, 0)) * n_refs for g, c in orig.items() if c > sys.get(g, 0)}
    del_good = {g: d - refs.get(g, 0) for g, d in deleted.items() if d > refs.get(g, 0)}
    del_p = sum(v / deleted[g] for g, v in del_good.items()) / len(deleted) if deleted else 0.0
    added = sys.keys() - orig.keys()
    add_good = len(added & refs.keys())
    add_p = add_good / len(added) if added else 0.0
    add_all = len(refs.keys() - orig.keys())
    add_r = add_good / add_all if add_all else 0.0
    return _f1(keep_p, keep_r), del_p, _f1(add_p, add_r)


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision > 0 or recall > 0 else 0.0


def score_xu2016(
    orig_tokens: Sequence[str], sys_tokens: Sequence[str], refs_tokens: Sequence[Sequence[str]]
) -> SariScore:
    """Xu et al.'s `SARIsent` on already tokenised text, scaled to 0..100.

    Args:
        orig_tokens: source tokens.
        sys_tokens: system output tokens.
        refs_tokens: one token list per reference (at least one).

    Returns:
        SariScore with KEEP F1, DELETE precision and ADD F1, each averaged over orders 1..4.
    """
    orig, sys, refs = extract_ngrams(orig_tokens), extract_ngrams(sys_tokens), _sum_ref_ngrams(refs_tokens)
    keep = delete = add = 0.0
    for n in range(NGRAM_ORDER):
        k, d, a = _xu_order_scores(orig[n], sys[n], refs[n], len(refs_tokens))
        keep, delete, add = keep + k, delete + d, add + a
    add, keep, delete = (100.0 * x / NGRAM_ORDER for x in (add, keep, delete))
    return SariScore((add + keep + delete) / 3, add, keep, delete)


def sentence_sari_xu2016(
    orig_sent: str,
    sys_sent: str,
    ref_sents: Sequence[str],
    lowercase: bool = True,
    tokenizer: str = "none",
    return_components: bool = False,
) -> float | SariScore:
    """Xu et al. (2016)'s original sentence-level SARI (`SARIsent`), in 0..100.

    The original lowercases and splits on whitespace, hence tokenizer='none' by default.

    Args:
        orig_sent: source sentence.
        sys_sent: system output.
        ref_sents: references of this sentence.
        lowercase: lowercase before tokenising.
        tokenizer: '13a', 'intl' or 'none'.
        return_components: return a SariScore instead of the float.

    Returns:
        SARI in 0..100, or the SariScore.
    """
    if not ref_sents:
        raise ValueError("sentence_sari_xu2016 needs at least one reference")

    def toks(text: str) -> list[str]:
        return normalize(text, lowercase, tokenizer).split()

    score = score_xu2016(toks(orig_sent), toks(sys_sent), [toks(ref) for ref in ref_sents])
    return score if return_components else score.sari
