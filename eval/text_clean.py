"""Cleaning model answers into a bare simplification: preambles, quotes, labels and trailing chatter go.

Instruction models wrap answers ("Here is the simplified sentence: ..."), quote them, or add a note after a blank
line. The rules below are deliberately conservative: they only remove text that is clearly not part of the
sentence, and an answer that becomes empty is reported as such (the caller keeps and counts it).
"""

from __future__ import annotations

import re

_PREAMBLE = re.compile(
    r"^\s*(?:sure[,!.]?\s*|certainly[,!.]?\s*|okay[,!.]?\s*)?"
    r"(?:here(?:'s| is| are)\s+(?:a\s+|the\s+|my\s+|one\s+)?(?:possible\s+)?(?:simpl\w*|rewritten|revised|shorter|easier)"
    r"[^:\n]{0,60}:\s*"
    r"|(?:simplified|simpler|rewritten|revised)\s*(?:sentence|version|text)?\s*:\s*"
    r"|(?:output|answer|result)\s*:\s*)",
    re.IGNORECASE,
)
_QUOTES = [('"', '"'), ("“", "”"), ("'", "'"), ("«", "»")]
_TRAILING_NOTE = re.compile(r"\n\s*\n.*", re.DOTALL)


def clean_simplification(text: str) -> str:
    """Strip wrappers from a generated simplification.

    >>> clean_simplification('Here is the simplified sentence: "The cat sat."')
    'The cat sat.'
    >>> clean_simplification("Simplified: Dogs bark.\\n\\nNote: I replaced a word.")
    'Dogs bark.'
    """
    text = text.strip()
    text = _TRAILING_NOTE.sub("", text).strip()
    for _ in range(2):
        stripped = _PREAMBLE.sub("", text, count=1).strip()
        if stripped == text:
            break
        text = stripped
    # an answer that starts with its label on its own line: keep what follows the label
    if "\n" in text and text.split("\n", 1)[0].rstrip().endswith(":"):
        text = text.split("\n", 1)[1].strip()
    for left, right in _QUOTES:
        if len(text) > 1 and text.startswith(left) and text.endswith(right) and text.count(left) <= 2:
            text = text[1:-1].strip()
    return re.sub(r"[ \t]+", " ", text).strip()
