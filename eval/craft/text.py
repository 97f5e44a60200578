"""Text units for CRAFT's constraint tools (paper 002): sentences, words, keyword occurrences.

The paper never says how words and sentences are counted, yet every CORD threshold ("more than 420
tokens", "fewer than 21 sentences", "do not change the 9th sentence") depends on it. The defaults here
(``REFERENCE``) follow the authors' checker code (nusnlp/CRAFT, ``mcts/reward_modeling/rm.py``), so
that constraint accuracies can be compared with the paper's; every place where the paper is silent and
another reading is reasonable is a field of :class:`TextRules`.

Counting rules under ``REFERENCE`` (each one a documented, tested decision):

- **Sentences**: the text is stripped and split on whitespace that follows ``.``, ``!`` or ``?``
  (``(?<=[.!?])\\s+``); empty pieces are dropped. There is no abbreviation list, so ``"e.g. x"`` and
  ``"Dr. Smith"`` split, exactly as in the reference. A *sentence* for sentence-id matching is the
  piece with ONE trailing ``.``/``!``/``?`` removed (``"Wait..."`` -> ``"Wait.."``), as the reference.
  The reference code splits on spaces only (``(?<=[.!?]) +``); we split on any whitespace because 242
  of the 500 CORD originals have paragraph breaks, and a sentence glued across ``"\\n\\n"`` could never
  be found again in a revision (``sentence_split="spaces"`` restores the reference exactly).
- **Words** (``word_count_check``): the reference counts ``nltk.word_tokenize`` tokens, which needs
  NLTK's ``punkt`` data (not on PyPI, downloaded at run time). We apply NLTK's own word tokenizer
  (``NLTKWordTokenizer``, the one ``word_tokenize`` runs on each sentence; pure regexes, no data) to each
  sentence piece above. Punctuation tokens count as words (``"Hello, world."`` is 4), contractions
  split (``"can't"`` -> ``ca`` ``n't``), hyphenated words stay one token (``"well-known"``). On the 500
  CORD originals this equals punkt + the same tokenizer for 374 texts; the mean difference is -0.25
  tokens (range -15..+7) on texts of about 690 tokens, where CORD thresholds are multiples of 20.
  ``word_counter="whitespace"`` counts whitespace tokens instead.
- **Per-sentence length** (``sentence_length_check``): whitespace tokens of each sentence (the
  reference's ``len(s.split())``), so punctuation does not count here, unlike the total word count.
- **Keywords**: occurrences are counted case-insensitively as non-overlapping substrings
  (``str.count`` on lowercased text), so ``"art"`` is found in ``"Smart"``. ``keyword_match=
  "word_boundary"`` counts only occurrences not flanked by a word character. Removal is checked
  case-sensitively (``"Blood"`` is absent from ``"blood"``), as in the reference;
  ``remove_ignore_case=True`` makes it case-insensitive.
- **Unchanged sentences**: original sentence #i (1-based) is unchanged when it is a substring of the
  revision, whitespace and all; ``collapse_whitespace=True`` compares with runs of whitespace collapsed
  to one space on both sides.

Pure module: no model, no data download (NLTK's tokenizer is imported on first use only; it loads
NumPy and SciPy, which the rest of ``eval`` does not need at import time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache

SENTENCE_SPLITTERS = {"whitespace": re.compile(r"(?<=[.!?])\s+"), "spaces": re.compile(r"(?<=[.!?]) +")}
WORD_COUNTERS = ("nltk", "whitespace")
KEYWORD_MATCHES = ("substring", "word_boundary")


@dataclass(frozen=True)
class TextRules:
    """How the checkers count; ``REFERENCE`` (all defaults) is the authors' checker code, except the split.

    Attributes:
        sentence_split: ``"whitespace"`` (default) or ``"spaces"`` (the reference code's ``" +"``).
        word_counter: ``"nltk"`` (NLTK word tokens, punctuation included) or ``"whitespace"``.
        keyword_match: ``"substring"`` (reference) or ``"word_boundary"``.
        remove_ignore_case: check ``remove`` case-insensitively (reference: case-sensitive).
        collapse_whitespace: compare unchanged sentences with whitespace runs collapsed (reference: no).
    """

    sentence_split: str = "whitespace"
    word_counter: str = "nltk"
    keyword_match: str = "substring"
    remove_ignore_case: bool = False
    collapse_whitespace: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (("sentence_split", self.sentence_split, tuple(SENTENCE_SPLITTERS)),
                                     ("word_counter", self.word_counter, WORD_COUNTERS),
                                     ("keyword_match", self.keyword_match, KEYWORD_MATCHES)):
            if value not in allowed:
                raise ValueError(f"TextRules.{name} must be one of {list(allowed)}, got {value!r}")


REFERENCE = TextRules()


def sentence_pieces(text: str, rules: TextRules = REFERENCE) -> list[str]:
    """The text split into sentences, each keeping its final punctuation (what word counts tokenize).

    >>> sentence_pieces("Dr. Smith came.  He left!\\n\\nWhy? ")
    ['Dr.', 'Smith came.', 'He left!', 'Why?']
    """
    return [piece for piece in SENTENCE_SPLITTERS[rules.sentence_split].split(text.strip()) if piece]


def split_sentences(text: str, rules: TextRules = REFERENCE) -> list[str]:
    """Sentences with one trailing ``.``/``!``/``?`` removed: the unit of sentence counts, lengths and ids.

    >>> split_sentences("It works. Really?! e.g. this")
    ['It works', 'Really?', 'e.g', 'this']
    """
    return [piece[:-1] if piece[-1] in ".!?" else piece for piece in sentence_pieces(text, rules)]


@cache
def _nltk_tokenizer():
    # imported here: nltk loads NumPy and SciPy, and only the word counter needs it
    from nltk.tokenize.destructive import NLTKWordTokenizer

    return NLTKWordTokenizer()


def word_tokens(text: str, rules: TextRules = REFERENCE) -> list[str]:
    """The tokens ``word_count_check`` counts (see the module docstring).

    >>> word_tokens("Hello, world. It's well-known.")
    ['Hello', ',', 'world', '.', 'It', "'s", 'well-known', '.']
    """
    if rules.word_counter == "whitespace":
        return text.split()
    tokenize = _nltk_tokenizer().tokenize
    return [token for piece in sentence_pieces(text, rules) for token in tokenize(piece)]


def word_count(text: str, rules: TextRules = REFERENCE) -> int:
    """Number of :func:`word_tokens`."""
    return len(word_tokens(text, rules))


def sentence_lengths(text: str, rules: TextRules = REFERENCE) -> list[int]:
    """Whitespace tokens per sentence, in order (``sentence_length_check``'s unit).

    >>> sentence_lengths("One two, three. Four!")
    [3, 1]
    """
    return [len(sentence.split()) for sentence in split_sentences(text, rules)]


@lru_cache(maxsize=1024)
def _pattern(keyword: str, ignore_case: bool) -> re.Pattern:
    flags = re.IGNORECASE if ignore_case else 0
    # a keyword edge that is not a word character ("U.S.", "(a)") has no boundary to ask for
    left = r"(?<!\w)" if keyword[:1].isalnum() or keyword[:1] == "_" else ""
    right = r"(?!\w)" if keyword[-1:].isalnum() or keyword[-1:] == "_" else ""
    return re.compile(left + re.escape(keyword) + right, flags)


def keyword_count(text: str, keyword: str, rules: TextRules = REFERENCE, ignore_case: bool = True) -> int:
    """Non-overlapping occurrences of ``keyword`` in ``text`` under ``rules.keyword_match``.

    >>> keyword_count("The art of a smart Artist", "art")
    3
    >>> keyword_count("The art of a smart Artist", "art", TextRules(keyword_match="word_boundary"))
    1
    """
    if not keyword:
        return 0
    if rules.keyword_match == "substring":
        return text.lower().count(keyword.lower()) if ignore_case else text.count(keyword)
    return sum(1 for _ in _pattern(keyword, ignore_case).finditer(text))


def contains_sentence(revised: str, sentence: str, rules: TextRules = REFERENCE) -> bool:
    """Whether ``sentence`` (an original sentence, final punctuation removed) occurs in ``revised``."""
    if rules.collapse_whitespace:
        return " ".join(sentence.split()) in " ".join(revised.split())
    return sentence in revised
