"""AgentSimp (paper 004) evaluation helpers: document scores, the "summary, not simplification" check, stage tables
and cost accounting. All pure; model-based metrics come in as callables.

**Document scores** (`score_document`), each over the whole document (its paragraphs joined with blank lines):

- SARI: EASSE's `corpus_sari` (`eval.metrics.sari`) with the **whole document as one segment** (lowercased sacrebleu
  13a tokens, DELETE scored as F1, EASSE's choice; Xu et al. 2016, which the paper cites, score DELETE by precision:
  `sari_deletion="precision"`), and D-SARI (`eval.metrics.dsari.document_sari`), each against
  each reference *alone*, then the mean over references: Appendix A, "averaging the results from all four
  reference documents per document" (not multi-reference SARI). None without references. D-SARI is the
  reference script's computation on the raw text (`dsari_tokenizer="script"`: `lower().split(" ")`, Punkt
  sentence counts, so a "#"/"##" heading line is not a sentence of its own); "13a" is the knob for sacrebleu's
  tokenizer.
- FKGL of the output (`document_fkgl`; the paper reports it "for reference only"): EASSE's words and syllables
  (lowercased '13a' tokens) over the sentences D-SARI counts (Punkt on the raw text), so both metrics see the same
  number of sentences in one output.
- BERTScore F1 (the issue asks for it; the paper uses BARTScore): `bertscore(candidate, reference)` from the caller
  (the job uses `eval.metrics.bertscore.document_bertscore`, whole documents in windows, with the bundled MiniLM), mean over
  references.
- compression: characters of output / source (`eval.metrics.text.compression_ratio`).

**Summary check** (§3.2.2: ChatGPT "tends to generate summaries instead of simplifying long texts"; the paper has no
test for it). Ours, with two numbers:

- ``length_ratio`` = words(output) / words(source) (words: runs of letters/digits, apostrophes inside).
- ``coverage`` = the share of source sentences (eval.metrics.textnorm.split_sentences) that the output covers: a sentence is
  covered when at least ``min_overlap`` (0.5) of its content-word types occur anywhere in the output. Content
  words are lowercased words that are not in `STOPWORDS`, with "'s" dropped and a plural reduced by
  suffix ("residents" -> "resident", "policies" -> "policy", "buses" -> "bus"; crude: "houses" -> "hous").
  Sentences without a content word do not count. This is a recall of content, blind to paraphrase: a
  simplification that replaces most words of a sentence scores it uncovered, so the threshold is loose.
- ``content_recall`` = the share of the source's content-word types found in the output (reported, not used).
- A document is flagged ``is_summary`` when length_ratio < ``min_length_ratio`` (0.5) **or** coverage <
  ``min_coverage`` (0.5): a summary is short or drops whole sentences' content. All thresholds are arguments.

**Stage names** (Tables 3-4 are built by "evaluating intermediate results"): `PAPER_ROWS` names the stage
behind each row of the paper's tables; the job's tables (per stage, with CIs) and its cost accounting are in
`eval.agentsimp.records`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eval.metrics.dsari import document_sari
from eval.metrics.sari import corpus_sari, sentence_sari
from eval.metrics.text import compression_ratio
from eval.metrics.textnorm import count_punkt_sentences, count_syllables, normalize, split_sentences

_STOPWORDS = (
    "a about above after again against all also am an and any are as at be because been before being below between "
    "both but by can could did do does doing down during each few for from further had has have having he her here "
    "hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of "
    "off on once only or other our ours ourselves out over own same she should so some such than that the their "
    "theirs them themselves then there these they this those through to too under until up very was we were what "
    "when where which while who whom why will with would you your yours yourself yourselves may might must shall "
    "one ones s t"
)
STOPWORDS = frozenset(_STOPWORDS.split())
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)*")
# paper 004's ablation rows -> the stage scored for them (Tables 3 and 4)
# (the final stage is the configuration's own row: "PL", "PL†", "SYNC", "SYNC†")
PAPER_ROWS = {
    "pipeline": (("w/o PF", "aa"), ("w/o AA", "ti"), ("w/o TI", "ma"), ("w/o MA", "cs")),
    "sync": (("w/o PF", "aa"), ("w/o AA", "ci"), ("w/o CI, w/ CS", "cs"), ("w/o CI, w/ TI", "ti"),
             ("w/o CI, w/ MA", "ma")),
}
SCORE_KEYS = ("sari", "dsari", "fkgl", "bertscore", "compression", "length_ratio", "coverage", "content_recall",
              "is_summary")


# ----------------------------------------------------------------------------- words, coverage, summary check


def words(text: str) -> list[str]:
    """Word tokens: runs of letters/digits, with inner apostrophes.

    >>> words("The city's 2 buses—aren't late.")
    ['The', "city's", '2', 'buses', "aren't", 'late']
    """
    return _WORD.findall(text)


def content_words(text: str) -> list[str]:
    """Lowercased words minus `STOPWORDS`, "'s" dropped, plurals reduced (module docstring).

    >>> content_words("The residents' policies and the city's buses are cheaper.")
    ['resident', 'policy', 'city', 'bus', 'cheaper']
    """
    out = []
    for word in words(text.replace("’", "'")):
        word = word.lower().removesuffix("'s").rstrip("'")
        if word.endswith("ies") and len(word) > 4:
            word = word[:-3] + "y"
        elif word.endswith(("ses", "xes", "zes", "ches", "shes")) and len(word) > 4:
            word = word[:-2]
        elif word.endswith("s") and len(word) > 3 and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
        if word not in STOPWORDS:
            out.append(word)
    return out


def length_ratio(source: str, output: str) -> float:
    """words(output) / words(source); 0.0 for a source without words."""
    n = len(words(source))
    return len(words(output)) / n if n else 0.0


def content_recall(source: str, output: str) -> float:
    """Share of the source's content-word types present in the output (1.0 when the source has none)."""
    wanted = set(content_words(source))
    return len(wanted & set(content_words(output))) / len(wanted) if wanted else 1.0


def sentence_coverage(source: str, output: str, min_overlap: float = 0.5) -> float:
    """Share of source sentences with >= `min_overlap` of their content-word types in the output (1.0 if none count).

    >>> sentence_coverage("The council raised bus fares. Parks close at dusk.", "Bus fares went up. The council said so.")
    0.5
    """
    present = set(content_words(output))
    counted = covered = 0
    for sentence in split_sentences(source):
        types = set(content_words(sentence))
        if types:
            counted += 1
            covered += len(types & present) / len(types) >= min_overlap
    return covered / counted if counted else 1.0


@dataclass(frozen=True)
class SummaryCheck:
    """The summary check of one output (module docstring); `reason` says which threshold failed ("" if none)."""

    length_ratio: float
    coverage: float
    content_recall: float
    is_summary: bool
    reason: str


def summary_check(source: str, output: str, min_length_ratio: float = 0.5, min_coverage: float = 0.5,
                  min_overlap: float = 0.5) -> SummaryCheck:
    """Flag an output that looks like a summary of `source`: too short, or covering too few source sentences."""
    ratio, coverage = length_ratio(source, output), sentence_coverage(source, output, min_overlap)
    reasons = ([f"length ratio {ratio:.2f} < {min_length_ratio}"] if ratio < min_length_ratio else []) + (
        [f"coverage {coverage:.2f} < {min_coverage}"] if coverage < min_coverage else [])
    return SummaryCheck(ratio, coverage, content_recall(source, output), bool(reasons), "; ".join(reasons))


# ----------------------------------------------------------------------------- document scores


def document_fkgl(text: str) -> float:
    """FKGL of one document: EASSE's words and syllables, Punkt's sentences on the raw text (module docstring).

    FKGL = max(0, 0.39 * words / sentences + 11.8 * syllables / words - 15.59); 0.0 for a text without words.

    >>> text = "# Road repairs\\n\\nThe council will close the road for necessary repairs. Buses will use another street."
    >>> round(document_fkgl(text), 3)  # 19 tokens ("#" and "." included), 2 sentences (the heading joins), 25 syllables
    3.641
    """
    tokens = normalize(text, lowercase=True).split()
    sentences = count_punkt_sentences(text)
    if not tokens or not sentences:
        return 0.0
    syllables = sum(count_syllables(t) for t in tokens)
    return max(0.0, 0.39 * len(tokens) / sentences + 11.8 * syllables / len(tokens) - 15.59)


def score_document(source: str, output: str, references: Sequence[str] = (),
                   bertscore: Callable[[str, str], float] | None = None, dsari_tokenizer: str = "script",
                   sari_deletion: str = "f1", **check) -> dict[str, float | None]:
    """All scores of one output document (keys `SCORE_KEYS`; None where references or `bertscore` are missing).

    Args:
        source: The original document text (its paragraphs).
        output: The simplified document.
        references: Reference simplifications; each scored alone, then averaged.
        bertscore: (candidate, reference) -> F1, or None to skip.
        dsari_tokenizer: "script" (the reference script's) or "13a" (`eval.metrics.dsari.document_sari`).
        sari_deletion: "f1" (EASSE's `corpus_sari` with the whole document as one segment: lowercased 13a tokens,
            DELETE scored as F1) or "precision" (Xu et al. 2016's DELETE precision: EASSE's `sentence_sari` on the
            same one segment).
        **check: Thresholds for `summary_check`.
    """
    refs = [r for r in references if r is not None]
    summary = summary_check(source, output, **check)

    def mean(values):
        return sum(values) / len(values) if values else None

    return {
        "sari": mean([corpus_sari([source], [output], [[ref]]) if sari_deletion == "f1"
                      else sentence_sari(source, output, [ref]) for ref in refs]),
        "dsari": mean([document_sari(source, output, [ref], tokenizer=dsari_tokenizer) for ref in refs]),
        "fkgl": document_fkgl(output),
        "bertscore": mean([bertscore(output, ref) for ref in refs]) if bertscore else None,
        "compression": compression_ratio(source, output),
        "length_ratio": summary.length_ratio,
        "coverage": summary.coverage,
        "content_recall": summary.content_recall,
        "is_summary": float(summary.is_summary),
    }
