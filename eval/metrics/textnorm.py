"""Text processing shared by the simplification metrics: tokenising, sentence splitting, syllables.

`normalize` reproduces EASSE's `easse.utils.preprocessing.normalize` for the tokenizers it
supports through sacrebleu: optional lowercasing first, then sacrebleu's '13a' (mteval-v13a,
the WMT default), 'intl' (international punctuation) or 'none' (leave the text as is). EASSE's
'moses' and 'penn' tokenizers need sacremoses, which we do not ship; asking for them raises.
'plain' is accepted as an alias of 'none' (EASSE's CLI offers that name).

`split_sentences` is our own rule-based splitter. EASSE counts sentences with NLTK's Punkt
model; NLTK and its model data are not installed here and cannot be downloaded at run time, so
FKGL, the split rate and D-SARI use these rules instead:

1. A blank line (paragraph break) always ends a sentence.
2. A whitespace token whose last character, after any closing quotes/brackets, is '.', '!'
   or '?' ends a sentence, except
   - a '.' after a known abbreviation ("Mr.", "e.g.", "U.S.", month names, ...), after a
     single letter (an initial: "J. Smith"), or after a word with an inner period, and
   - an ellipsis ("...", "…"), which ends a sentence only when the next token starts with an
     upper-case letter.
3. A stand-alone '.' token (tokenised text such as TurkCorpus, "the cat sat .") ends a
   sentence like an attached one does, which is also what Punkt does.
4. A piece without any letter (a stray closing quote, a list number "1 .") is not a sentence of
   its own: it joins the sentence before it, or the one after it when it comes first.

On one-sentence-per-line corpora (TurkCorpus, ASSET) this agrees with Punkt on almost every
line; on messy text it can differ by a sentence here and there.

`punkt_sentences` is NLTK's Punkt algorithm itself (`nltk.tokenize.punkt.PunktSentenceTokenizer`,
what `nltk.sent_tokenize` runs), for metrics whose reference script counts sentences with
`nltk.sent_tokenize` on raw text (D-SARI's `D_SARI.py`). Punkt ends a sentence only at '.', '!'
or '?' (plus closing quotes/brackets) followed by whitespace: a line break, even a blank line, is
whitespace like any other, so a heading line without final punctuation ("# Road works") joins the
sentence after it. Its trained English parameters (the `punkt_tab` data) are not installed and
cannot be downloaded here, so the tokenizer gets this module's abbreviation list instead of the
learned one; its other heuristics (initials, ellipses, numbers) are Punkt's own.

`count_syllables` restates EASSE's syllable counter for FKGL (rules in `eval.metrics.text`).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

TOKENIZERS = ("13a", "intl", "none", "plain")

_ABBREVIATIONS = frozenset([
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "cf", "al", "no", "nos",
    "vol", "fig", "figs", "inc", "ltd", "co", "corp", "dept", "est", "approx", "gen", "gov", "sen", "rep", "rev", "lt",
    "col", "sgt", "capt", "cmdr", "adm", "maj", "pres", "u.s", "u.k", "u.n", "a.m", "p.m", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
])
_CLOSERS = "\"')]}»”’"
_OPENERS = "\"'([{«“‘"
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


@cache
def _load_tokenizer(name: str):
    # sacrebleu's tokenizers keep their own lru_cache per instance, so one shared instance per
    # name makes repeated normalisation of the same corpus (tests, benches) nearly free.
    if name == "13a":
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        return Tokenizer13a()
    if name == "intl":
        from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

        return TokenizerV14International()
    return None


def check_tokenizer(tokenizer: str) -> None:
    """Raise a ValueError naming the supported tokenizers if `tokenizer` is not one of them.

    Args:
        tokenizer: tokenizer name.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}: expected one of {', '.join(TOKENIZERS)}")


def normalize(sentence: str, lowercase: bool = True, tokenizer: str = "13a") -> str:
    """Lowercase (optionally) then tokenise a sentence the way EASSE does.

    Args:
        sentence: raw text.
        lowercase: lowercase before tokenising.
        tokenizer: '13a', 'intl', or 'none'/'plain' (no tokenisation).

    Returns:
        The tokens joined by single spaces ('none' returns the text unchanged apart from case).

    >>> normalize("Hello, World.")
    'hello , world .'
    """
    check_tokenizer(tokenizer)
    if lowercase:
        sentence = sentence.lower()
    tok = _load_tokenizer(tokenizer)
    return sentence if tok is None else tok(sentence)


def _ends_sentence(token: str, next_token: str | None) -> bool:
    core = token.rstrip(_CLOSERS)
    if not core or core[-1] not in ".!?…":
        return False
    if core.endswith(("...", "…")):
        return next_token is not None and next_token.lstrip(_OPENERS)[:1].isupper()
    if core[-1] != ".":
        return True
    word = core.lstrip(_OPENERS)[:-1].lower()
    if not word:
        return True  # a stand-alone "." token
    if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return False
    return "." not in word


def _split_paragraph(paragraph: str) -> list[str]:
    tokens = paragraph.split()
    sentences, current = [], []
    for i, token in enumerate(tokens):
        current.append(token)
        next_token = tokens[i + 1] if i + 1 < len(tokens) else None
        if _ends_sentence(token, next_token):
            sentences.append(" ".join(current))
            current = []
    if current:
        sentences.append(" ".join(current))
    return _attach_letterless(sentences)


def _attach_letterless(pieces: list[str]) -> list[str]:
    merged: list[str] = []
    pending = ""  # letterless pieces seen before the first real sentence
    for piece in pieces:
        if any(ch.isalpha() for ch in piece):
            merged.append(f"{pending} {piece}".strip())
            pending = ""
        elif merged:
            merged[-1] = f"{merged[-1]} {piece}"
        else:
            pending = f"{pending} {piece}".strip()
    if pending:
        merged.append(pending)
    return merged


def split_sentences(text: str) -> list[str]:
    """Split text into sentences with the rules in the module docstring.

    Args:
        text: any text; whitespace inside a sentence is collapsed to single spaces.

    Returns:
        The sentences in order; an empty or blank text gives an empty list.

    >>> split_sentences("Mr. Smith left. He was tired! Really?")
    ['Mr. Smith left.', 'He was tired!', 'Really?']
    """
    sentences = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        sentences.extend(_split_paragraph(paragraph))
    return sentences


def count_sentences(text: str) -> int:
    """Number of sentences `split_sentences` finds in `text`."""
    return len(split_sentences(text))


@cache
def _punkt():
    # imported here: nltk loads NumPy and SciPy, and only the Punkt counters need it
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(_ABBREVIATIONS)
    return PunktSentenceTokenizer(params)


def punkt_sentences(text: str) -> list[str]:
    """Sentences of raw `text` by NLTK's Punkt (module docstring): line breaks do not end a sentence.

    >>> punkt_sentences("# Road works\\n\\nMr. Lee closes the road. Buses divert!")
    ['# Road works\\n\\nMr. Lee closes the road.', 'Buses divert!']
    """
    return _punkt().tokenize(text) if text.strip() else []


def count_punkt_sentences(text: str) -> int:
    """Number of sentences `punkt_sentences` finds in `text` (0 for a blank text)."""
    return len(punkt_sentences(text))


# ----------------------------------------------------------------------------- syllables (FKGL)

_SPECIAL_SYLLABLES = {
    "the": 1, "tottered": 2, "chummed": 1, "peeped": 1, "moustaches": 2, "shamefully": 3, "messieurs": 2,
    "satiated": 4, "sailmaker": 4, "sheered": 1, "disinterred": 3, "propitiatory": 6, "bepatched": 2,
    "particularized": 5, "caressed": 2, "trespassed": 2, "sepulchre": 3, "flapped": 1, "hemispheres": 3,
    "pencilled": 2, "motioned": 2, "poleman": 2, "slandered": 2, "sombre": 2, "etc": 4, "sidespring": 2,
    "mimes": 1, "effaces": 2, "mr": 2, "mrs": 2, "ms": 1, "dr": 2, "st": 1, "sr": 2, "jr": 2, "truckle": 2,
    "foamed": 1, "fringed": 2, "clattered": 2, "capered": 2, "mangroves": 2, "suavely": 2, "reclined": 2,
    "brutes": 1, "effaced": 2, "quivered": 2, "h'm": 1, "veriest": 3, "sententiously": 4, "deafened": 2,
    "manoeuvred": 3, "unstained": 2, "gaped": 1, "stammered": 2, "shivered": 2, "discoloured": 3,
    "gravesend": 2, "60": 2, "lb": 1, "unexpressed": 3, "greyish": 2, "unostentatious": 5,
}
_SYLLABLE_PLUS = [re.compile(p) for p in (
    "ia", "riet", "dien", "iu", "io", "ii", "[aeiouy]bl$", "mbl$", "[aeiou]{3}", "^mc", "ism$",
    r"(.)(?!\1)([aeiouy])\2l$", "[^l]llien", "^coad.", "^coag.", "^coal.", "^coax.",
    r"(.)(?!\1)[gq]ua(.)(?!\2)[aeiou]", "dnt$",
)]
_SYLLABLE_MINUS = [re.compile(p) for p in ("cial", "tia", "cius", "cious", "gui", "ion", "iou", "sia$", ".ely$")]
_VOWEL_RUN = re.compile("[aeiouy]+")


@lru_cache(maxsize=100_000)
def count_syllables(word: str) -> int:
    """Syllables in one word by EASSE's rules (listed in `eval.metrics.text`' module docstring).

    >>> [count_syllables(w) for w in ("the", "cat", "table", "simple", "ion", "free", ",")]
    [1, 1, 2, 1, 1, 0, 0]
    """
    word = word.lower().strip()
    if word in _SPECIAL_SYLLABLES:
        return _SPECIAL_SYLLABLES[word]
    word = word.rstrip("e")
    count = len(_VOWEL_RUN.findall(word))
    count += sum(1 for p in _SYLLABLE_PLUS if p.search(word))
    count -= sum(1 for p in _SYLLABLE_MINUS if p.search(word))
    return count


def tokenize_for_alignment(text: str) -> list[str]:
    """Split like the paper's alignment display: lowercased, whitespace split, punctuation attached.

    >>> tokenize_for_alignment("We'll slip you  through, device.")
    ["we'll", 'slip', 'you', 'through,', 'device.']
    """
    return text.lower().split()
