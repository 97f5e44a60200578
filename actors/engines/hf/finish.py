"""When a decode row's completion ends: EOS, its grammar complete or broken, a stop string, max_tokens.

Split from `actors.engines.hf.decode`, which records every chosen token here (a sampled one, or one its grammar
forces, `actors.engines.hf.fast_forward`); `row` is its `DecodeRow`.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.engines.hf.constrained import advance

# Tokens decoded around the end of a completion when looking for a stop string (longest stop + this margin).
_STOP_WINDOW_MARGIN = 8


def record_token(row, token: int, eos_ids: frozenset[int], decode: Callable[[list[int]], str]) -> None:
    """Append `token` to `row` and decide whether the row is finished (EOS, stop string, max_tokens)."""
    if row.finish_reason:
        return
    row.token_ids.append(token)
    if row.matcher is not None:
        row.error = advance(row.matcher, token)
        if row.error:
            row.finish_reason = "error"
            return
        if row.matcher.is_stopped():
            # the grammar is complete (its last token may be EOS or the verdict's closing text)
            row.finish_reason = "stop"
            return
    if token in eos_ids:
        row.finish_reason = "stop"
        return
    if row.sampling.stop and find_stop(row, decode) >= 0:
        row.finish_reason = "stop"
        return
    if len(row.token_ids) >= row.sampling.max_tokens:
        row.finish_reason = "length"


def find_stop(row, decode: Callable[[list[int]], str]) -> int:
    """Set and return `row.stop_at` if a stop string now appears in the completion.

    Only the last few tokens are decoded each step (a stop string is new only near the end); on a hit the
    whole completion is decoded once to locate its earliest stop string.
    """
    longest = max(len(s) for s in row.sampling.stop)
    tail = decode(row.token_ids[-(longest + _STOP_WINDOW_MARGIN) :])
    if not any(s in tail for s in row.sampling.stop):
        return -1
    text = decode(row.token_ids)
    hits = [text.find(s) for s in row.sampling.stop if s in text]
    row.stop_at = min(hits) if hits else -1
    return row.stop_at
