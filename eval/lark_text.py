"""Building blocks of the Lark grammars (llguidance's dialect) that constrain decoding: string literals, bounded
repetition, and the free-text floor. Shared by the judges' verdict grammars (`eval.judging.grammar`) and the
CRAFT and AgentSimp grammars. Pure: no llguidance import; the engines compile the strings.
"""

from __future__ import annotations

# below this many tokens free text says nothing useful; a grammar then asks for the bare verdict
MIN_FREE_TOKENS = 8


def lark_string(text: str) -> str:
    """`text` as a Lark string literal (backslashes, quotes and newlines escaped).

    >>> lark_string('say "hi"\\n')
    '"say \\\\"hi\\\\"\\\\n"'
    """
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def up_to(item: str, n: int) -> str:
    """`item` 0 to `n` times, as nested optionals: Lark's `item ~ 0..n` in a form llguidance 1.7 reads too.

    vLLM 0.32 (the `gpu` extra) requires llguidance < 1.8, whose Lark reader has no `~ a..b` ranges; its
    `guidance` backend gets these grammars as they are. Same language either way.

    >>> up_to("x", 3), up_to("x", 0)
    ('(x (x (x)?)?)?', '')
    """
    out = ""
    for _ in range(n):
        out = f"({item} {out})?" if out else f"({item})?"
    return out
