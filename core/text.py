"""Normalising the texts users hand us (sentences to simplify, references) before they are checked and used.

`normalise_text`: Unicode NFC, then the characters that no reader sees and no model should get are removed:
control characters (Unicode category Cc: NUL, escape, DEL, the C1 range) other than tab, line feed and carriage
return, and the zero-width space, word joiner and byte-order mark (U+200B, U+2060, U+FEFF). Every other character
stays, so a text without such characters is returned unchanged up to NFC (the TurkCorpus, ASSET, CORD and demo
files are already NFC and hold none of them: their texts and every score computed on them are unchanged).

Zero-width joiners and non-joiners (U+200D, U+200C), direction marks and the soft hyphen (category Cf) carry
meaning inside words (Persian, Indic scripts, emoji sequences, bidirectional text) and are kept; but a text made
only of them and whitespace holds nothing to read, so `is_blank` counts them as invisible.

Pure: no I/O; the readers (`actors.corpus`, `eval.agentsimp.docs`, `eval.craft.cord`, ...) call it.
"""

from __future__ import annotations

import unicodedata

# removed by `normalise_text`: invisible, with no meaning inside a word
ZERO_WIDTH = frozenset("\u200b\u2060\ufeff")
# control characters that are ordinary whitespace, kept
KEPT_CONTROLS = frozenset("\t\n\r")


def _dropped(char: str) -> bool:
    return char in ZERO_WIDTH or (unicodedata.category(char) == "Cc" and char not in KEPT_CONTROLS)


def normalise_text(text: str) -> str:
    """NFC, without control characters (tab, newline, CR kept) and zero-width spaces / word joiners / BOMs.

    >>> normalise_text("caf\\u0065\\u0301 ok")  # e + combining acute -> the one character é
    'café ok'
    >>> normalise_text("a\\x00b\\u200bc\\td\\x1b")
    'abc\\td'
    >>> normalise_text("The cat sat .") == "The cat sat ."
    True
    """
    text = unicodedata.normalize("NFC", text)
    if text.isascii() and text.isprintable():
        return text  # the common case: nothing to drop
    return "".join(char for char in text if not _dropped(char))


def is_blank(text: str) -> bool:
    """True when `text` has nothing to read once normalised: only whitespace, control and format characters.

    >>> is_blank("\\u200b\\u200b"), is_blank("\\x00"), is_blank(" \\u200d\\n"), is_blank("\\u00a0")
    (True, True, True, True)
    >>> is_blank("a"), is_blank("\\u200bx"), is_blank("\\U0001F600")
    (False, False, False)
    """
    return all(char.isspace() or unicodedata.category(char) in ("Cc", "Cf") for char in normalise_text(text))
