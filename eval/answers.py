"""A parsed model answer and the reasoning it is read after: shared by every method's parsers (the judges'
`eval.judging.parse`, AgentSimp's `eval.agentsimp.parse`, ...). Pure.

Model output is data: a parser returns a `Parsed` with a short ``error`` code instead of raising, and keeps the raw
text, so nothing is silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THINK_OPEN_RE = re.compile(r"<\s*think\s*>", re.IGNORECASE)
_THINK_CLOSE_RE = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class Parsed:
    """One parsed value, or an error code.

    Attributes:
        value: The parsed value (``None`` on failure).
        error: ``""`` on success, else an error code (see the module docstring).
        raw: The text that was parsed.
    """

    value: object
    error: str = ""
    raw: str | None = None

    @property
    def ok(self) -> bool:
        return not self.error


def split_think(text: str) -> tuple[str, bool]:
    """Return the answer part of ``text`` and whether a ``<think>`` block was left open.

    Args:
        text: Raw model output.

    Returns:
        ``(answer, unterminated)``: the text after the last ``</think>`` if there is one; otherwise
        the text before an unclosed ``<think>`` (``unterminated=True``); otherwise all of it.

    >>> split_think("<think>maybe [2]</think> Answer: [4]")
    (' Answer: [4]', False)
    >>> split_think("Draft <think>still thinking [2]")
    ('Draft ', True)
    """
    closes = list(_THINK_CLOSE_RE.finditer(text))
    if closes:
        return text[closes[-1].end():], False
    opened = _THINK_OPEN_RE.search(text)
    if opened:
        return text[: opened.start()], True
    return text, False
