"""Reference-based and surface text metrics for simplification, and the batch scoring API.

Metric names accepted by `score_corpus`, `score_sentences` and `score_table` (keys they return):

| name | keys | corpus value | sentence value |
|---|---|---|---|
| sari | sari, sari_add, sari_keep, sari_del | `eval.metrics.sari.corpus_sari` | `eval.metrics.sari.sentence_sari` |
| bleu | bleu | sacrebleu corpus BLEU, EASSE's settings | EASSE's `sentence_bleu` |
| fkgl | fkgl | FKGL of all outputs pooled | FKGL of the output |
| dsari | dsari | mean D-SARI (one document per line) | D-SARI |
| compression_ratio | compression_ratio | mean of chars(output)/chars(source) | same ratio |
| exact_copy | exact_copy | share of outputs equal to their source | 1.0 or 0.0 |
| levenshtein | levenshtein | mean Levenshtein similarity | similarity |
| split_rate | split_rate | share of outputs with more sentences than their source | 1.0 or 0.0 |
| bertscore | bertscore_precision/recall/f1 | mean over sentences (`eval.metrics.bertscore`) | per sentence |
| lens, lens_salsa | lens, lens_salsa | mean over sentences (`eval.metrics.lens`) | per sentence |

Choices, each matching EASSE where EASSE has the metric:

- **BLEU** (EASSE `corpus_bleu`): texts are normalised (optional lowercasing, then the '13a'
  tokenizer) and handed to sacrebleu with tokenize='none', force=True, smooth_method='exp',
  effective_order=False. BLEU is case-sensitive by default (`bleu_lowercase=False`), which is
  EASSE's function default and how the BLEU columns of the shared reference tables were made;
  `easse evaluate` on the command line lowercases BLEU too, which `bleu_lowercase=True`
  reproduces. Sentence BLEU follows EASSE's `sentence_bleu`: smooth_method='floor',
  effective_order=True, each reference its own stream.
- **FKGL** (EASSE `corpus_fkgl`): each text is lowercased and '13a'-tokenised, split into
  sentences (`eval.metrics.textnorm.split_sentences`, our stand-in for NLTK Punkt), and every whitespace
  token counts as a word, punctuation included. FKGL = max(0, 0.39·words/sentences +
  11.8·syllables/words - 15.59); 0 for an empty corpus. Syllables follow EASSE's counter
  (itself from the DRESS/nltk_contrib readability scripts), restated in
  `eval.metrics.textnorm.count_syllables`:
  (1) a table of special words with fixed counts; (2) strip *all* trailing 'e's; (3) count runs
  of vowels (a e i o u y); (4) +1 for each of a list of patterns ("ia", "riet", "io", a vowel+"bl"
  ending, three vowels in a row, a leading "mc", "ism" ending, ...); (5) -1 for each of
  "cial", "tia", "cius", "cious", "gui", "ion", "iou", a "sia" ending. Punctuation and numbers
  score 0 (except "60"), and a word can score 0 (EASSE counts "free" as 0, for instance).
- **Compression ratio, Levenshtein similarity, exact copy** (EASSE's quality estimation via
  tseval): computed on the normalised texts (same `lowercase`/`tokenizer` as SARI), per
  sentence, then averaged. Compression ratio = len(output chars)/len(source chars) (0 when the
  source is empty). Levenshtein similarity is python-Levenshtein's `ratio`: 1 - d/(|a|+|b|) where
  d is the edit distance with insertions and deletions costing 1 and substitutions 2 (1.0 for two
  empty strings); `levenshtein_distance` is the classic unit-cost distance.
- **Split rate**: an output counts as split when `split_sentences` finds more sentences in it than
  in its source (raw texts, before normalisation).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval.metrics.dsari import corpus_dsari, document_sari
from eval.metrics.sari import corpus_sari, sentence_sari_scores, transpose_refs
from eval.metrics.textnorm import check_tokenizer, count_sentences, count_syllables, normalize, split_sentences

METRICS = (
    "sari", "bleu", "fkgl", "dsari", "compression_ratio", "exact_copy", "levenshtein", "split_rate",
    "bertscore", "lens", "lens_salsa",
)
NEEDS_REFS = frozenset({"sari", "bleu", "dsari", "bertscore", "lens"})

# ----------------------------------------------------------------------------- FKGL


def _fkgl_counts(text: str, tokenizer: str) -> tuple[int, int, int]:
    words = syllables = sentences = 0
    for sentence in split_sentences(normalize(text, lowercase=True, tokenizer=tokenizer)):
        tokens = sentence.split()
        words += len(tokens)
        syllables += sum(count_syllables(t) for t in tokens)
        sentences += 1
    return words, syllables, sentences


def _fkgl_formula(words: int, syllables: int, sentences: int) -> float:
    if sentences == 0 or words == 0:
        return 0.0
    return max(0.0, 0.39 * words / sentences + 11.8 * syllables / words - 15.59)


def corpus_fkgl(sents: Sequence[str], tokenizer: str = "13a") -> float:
    """Flesch-Kincaid grade level of all texts pooled, as EASSE's `corpus_fkgl`.

    Args:
        sents: texts (usually the system outputs).
        tokenizer: tokenizer applied before counting.

    Returns:
        FKGL (>= 0).
    """
    totals = [0, 0, 0]
    for text in sents:
        totals = [a + b for a, b in zip(totals, _fkgl_counts(text, tokenizer))]
    return _fkgl_formula(*totals)


def sentence_fkgl(text: str, tokenizer: str = "13a") -> float:
    """FKGL of a single text (same counting as `corpus_fkgl`)."""
    return _fkgl_formula(*_fkgl_counts(text, tokenizer))


# ----------------------------------------------------------------------------- BLEU


def _bleu_scorer(sentence_level: bool):
    from sacrebleu.metrics import BLEU

    if sentence_level:
        return BLEU(lowercase=False, force=True, tokenize="none", smooth_method="floor", effective_order=True)
    return BLEU(lowercase=False, force=True, tokenize="none", smooth_method="exp", effective_order=False)


def corpus_bleu(
    sys_sents: Sequence[str], refs_sents: Sequence[Sequence[str | None]], lowercase: bool = False,
    tokenizer: str = "13a",
) -> float:
    """Corpus BLEU with EASSE's `corpus_bleu` settings (module docstring).

    Args:
        sys_sents: system outputs.
        refs_sents: reference streams, shape (n_references, n_sentences); None = no reference.
        lowercase: lowercase before tokenising (EASSE's default is False).
        tokenizer: '13a', 'intl' or 'none'.

    Returns:
        BLEU in 0..100 (0.0 for an empty corpus, which sacrebleu rejects).
    """
    transpose_refs(refs_sents, len(sys_sents))  # validates the layout with clear messages
    if not sys_sents:
        return 0.0
    sys_norm = [normalize(s, lowercase, tokenizer) for s in sys_sents]
    refs_norm = [[None if r is None else normalize(r, lowercase, tokenizer) for r in stream] for stream in refs_sents]
    return _bleu_scorer(sentence_level=False).corpus_score(sys_norm, refs_norm).score


def sentence_bleu(sys_sent: str, ref_sents: Sequence[str], lowercase: bool = False, tokenizer: str = "13a") -> float:
    """Sentence BLEU as EASSE's `sentence_bleu` (floor smoothing, effective order)."""
    refs = [[normalize(r, lowercase, tokenizer)] for r in ref_sents]
    return _bleu_scorer(sentence_level=True).corpus_score([normalize(sys_sent, lowercase, tokenizer)], refs).score


# ----------------------------------------------------------------------------- surface metrics


def compression_ratio(orig: str, sys: str) -> float:
    """Characters of `sys` over characters of `orig` (0.0 if `orig` is empty)."""
    return len(sys) / len(orig) if orig else 0.0


def levenshtein_distance(a: str, b: str) -> int:
    """Unit-cost edit distance (insert, delete, substitute) between two strings.

    >>> levenshtein_distance("kitten", "sitting")
    3
    """
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _lcs_length(a: str, b: str) -> int:
    # Bit-parallel LCS (Allison-Dix / Hyyrö): one big-int step per character of b.
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for ch in b:
        matches = row & masks.get(ch, 0)
        row = ((row + matches) | (row - matches)) & full
    return len(a) - row.bit_count()


def levenshtein_similarity(a: str, b: str) -> float:
    """python-Levenshtein's `ratio`: 1 - indel_distance/(|a|+|b|), i.e. 2·LCS/(|a|+|b|).

    >>> levenshtein_similarity("kitten", "sitting")  # LCS "ittn" = 4 -> 8/13
    0.6153846153846154
    """
    total = len(a) + len(b)
    return 1.0 if total == 0 else 2 * _lcs_length(a, b) / total


def is_split(orig: str, sys: str) -> bool:
    """True when `sys` has more sentences than `orig`."""
    return count_sentences(sys) > count_sentences(orig)


# ----------------------------------------------------------------------------- batch API


def check_metrics(metrics: Sequence[str], has_refs: bool) -> list[str]:
    """Validate metric names (unknown name, or a reference metric without references)."""
    names = [m.strip().lower() for m in metrics if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}: expected some of {', '.join(METRICS)}")
    if not has_refs and NEEDS_REFS.intersection(names):
        raise ValueError(f"metric(s) {', '.join(sorted(NEEDS_REFS.intersection(names)))} need references")
    if not names:
        raise ValueError("no metric requested")
    return names


def _sentence_values(name: str, orig, sys, refs_per_sent, lowercase, tokenizer, bleu_lowercase) -> dict[str, list]:
    if name == "sari":
        scores = sentence_sari_scores(orig, sys, refs_to_streams(refs_per_sent), lowercase, tokenizer)
        return {"sari": [s.sari for s in scores], "sari_add": [s.add for s in scores],
                "sari_keep": [s.keep for s in scores], "sari_del": [s.delete for s in scores]}
    if name == "bleu":
        return {"bleu": [sentence_bleu(s, r, bleu_lowercase, tokenizer) for s, r in zip(sys, refs_per_sent)]}
    if name == "fkgl":
        return {"fkgl": [sentence_fkgl(s, tokenizer) for s in sys]}
    if name == "dsari":
        return {"dsari": [document_sari(o, s, r) for o, s, r in zip(orig, sys, refs_per_sent)]}
    if name == "split_rate":
        return {"split_rate": [float(is_split(o, s)) for o, s in zip(orig, sys)]}
    if name in ("bertscore", "lens", "lens_salsa"):
        return _model_values(name, orig, sys, refs_per_sent)
    pairs = [(normalize(o, lowercase, tokenizer), normalize(s, lowercase, tokenizer)) for o, s in zip(orig, sys)]
    fn = {"compression_ratio": compression_ratio, "levenshtein": levenshtein_similarity,
          "exact_copy": lambda o, s: float(o == s)}[name]
    return {name: [fn(o, s) for o, s in pairs]}


def _model_values(name: str, orig, sys, refs_per_sent) -> dict[str, list]:
    if name == "bertscore":
        from eval.metrics.bertscore import sentence_bertscore

        scores = sentence_bertscore(sys, refs_per_sent)
        return {"bertscore_precision": [s.precision for s in scores],
                "bertscore_recall": [s.recall for s in scores], "bertscore_f1": [s.f1 for s in scores]}
    from eval.metrics.lens import score_lens, score_lens_salsa

    if name == "lens":
        return {"lens": score_lens(orig, sys, refs_per_sent)}
    return {"lens_salsa": score_lens_salsa(orig, sys)}


def _pad(refs_per_sent: Sequence[Sequence[str]]) -> list[list[str | None]]:
    width = max(len(r) for r in refs_per_sent)
    return [list(r) + [None] * (width - len(r)) for r in refs_per_sent]


def refs_to_streams(refs_per_sent: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """References per sentence -> EASSE's reference streams (n_refs x n_sentences), short lists padded with None."""
    if not refs_per_sent:
        return [[]]  # an empty corpus: one empty stream keeps the streams layout valid
    return [list(stream) for stream in zip(*_pad(refs_per_sent))]


def _prepare(orig, sys, refs) -> list[list[str]] | None:
    if len(orig) != len(sys):
        raise ValueError(f"{len(orig)} source sentences but {len(sys)} system outputs")
    return None if refs is None else transpose_refs(refs, len(sys))


def score_sentences(
    metrics: Sequence[str], orig: Sequence[str], sys: Sequence[str], refs: Sequence[Sequence[str | None]] | None,
    lowercase: bool = True, tokenizer: str = "13a", bleu_lowercase: bool = False,
) -> list[dict[str, float]]:
    """Score every sentence with each requested metric.

    Args:
        metrics: metric names (table in the module docstring).
        orig: source sentences.
        sys: system outputs.
        refs: reference streams (n_references × n_sentences), or None for reference-free metrics.
        lowercase: lowercase before tokenising (SARI and the surface metrics).
        tokenizer: '13a', 'intl' or 'none'.
        bleu_lowercase: lowercase for BLEU (EASSE's corpus_bleu default is False).

    Returns:
        One dict per sentence, metric key -> value.
    """
    names = check_metrics(metrics, refs is not None)
    check_tokenizer(tokenizer)
    refs_per_sent = _prepare(orig, sys, refs)
    columns: dict[str, list] = {}
    for name in names:
        columns.update(_sentence_values(name, orig, sys, refs_per_sent, lowercase, tokenizer, bleu_lowercase))
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def score_corpus(
    metrics: Sequence[str], orig: Sequence[str], sys: Sequence[str], refs: Sequence[Sequence[str | None]] | None,
    lowercase: bool = True, tokenizer: str = "13a", bleu_lowercase: bool = False,
) -> dict[str, float]:
    """Corpus-level score of each requested metric (arguments as `score_sentences`).

    Returns:
        Metric key -> corpus value (SARI, BLEU, FKGL and D-SARI by their corpus definitions, the
        other metrics as means of sentence values; an empty corpus gives 0.0 for those).
    """
    names = check_metrics(metrics, refs is not None)
    check_tokenizer(tokenizer)
    refs_per_sent = _prepare(orig, sys, refs)
    result: dict[str, float] = {}
    for name in names:
        if name == "sari":
            score = corpus_sari(orig, sys, refs_to_streams(refs_per_sent), lowercase, tokenizer, return_components=True)
            result.update(sari=score.sari, sari_add=score.add, sari_keep=score.keep, sari_del=score.delete)
        elif name == "bleu":
            result["bleu"] = corpus_bleu(sys, refs_to_streams(refs_per_sent), bleu_lowercase, tokenizer)
        elif name == "fkgl":
            result["fkgl"] = corpus_fkgl(sys, tokenizer)
        elif name == "dsari":
            result["dsari"] = corpus_dsari(orig, sys, refs_to_streams(refs_per_sent))
        else:
            values = _sentence_values(name, orig, sys, refs_per_sent, lowercase, tokenizer, bleu_lowercase)
            result.update({k: sum(v) / len(v) if v else 0.0 for k, v in values.items()})
    return result


def score_table(
    data, metrics: Sequence[str], source_col: str = "source", output_col: str = "output",
    refs_col: str | None = "references", **kwargs,
):
    """Score a pandas DataFrame (or a Parquet file) with one row per sentence.

    Args:
        data: a DataFrame, or a path to a Parquet file.
        metrics: metric names.
        source_col: column of source texts.
        output_col: column of system outputs.
        refs_col: column holding a list of references per row (rows may differ in length), or
            None for reference-free metrics.
        **kwargs: lowercase, tokenizer, bleu_lowercase (as `score_corpus`).

    Returns:
        (corpus scores dict, DataFrame of sentence scores with the input's index).
    """
    import pandas as pd

    where = "the DataFrame"
    if not isinstance(data, pd.DataFrame):
        where = str(data)
        data = pd.read_parquet(Path(data))
    orig = _text_column(data, source_col, where)
    sys = _text_column(data, output_col, where)
    refs = None if refs_col is None else refs_to_streams(_refs_column(data, refs_col, where))
    corpus = score_corpus(metrics, orig, sys, refs, **kwargs)
    sentences = pd.DataFrame(score_sentences(metrics, orig, sys, refs, **kwargs), index=data.index)
    return corpus, sentences


def _text_column(df, col: str, where: str) -> list[str]:
    if col not in df.columns:
        raise ValueError(f"{where}: no column {col!r} (columns: {', '.join(map(str, df.columns))})")
    values = df[col].tolist()
    for i, value in zip(df.index, values):
        if not isinstance(value, str):
            # kept a ValueError: callers catch ValueError for every bad input cell
            raise ValueError(f"{where}: row {i}, column {col!r}: expected text, got {value!r}")  # noqa: TRY004
    return values


def _refs_column(df, col: str, where: str) -> list[list[str]]:
    if col not in df.columns:
        raise ValueError(f"{where}: no column {col!r} (columns: {', '.join(map(str, df.columns))})")
    rows = []
    for i, value in zip(df.index, df[col].tolist()):
        if isinstance(value, str) or not hasattr(value, "__iter__"):
            raise ValueError(f"{where}: row {i}, column {col!r}: expected a list of references, got {value!r}")
        refs = list(value)
        if not refs or not all(isinstance(r, str) for r in refs):
            raise ValueError(f"{where}: row {i}, column {col!r}: needs one or more text references, got {refs!r}")
        rows.append(refs)
    return rows
