"""Jump-forward decoding: the tokens a row's grammar forces are fed in the same forward as its last chosen token.

A judge's verdict is mostly text its grammar fixes: the demo jury's 48 completion tokens are 42 forced ones
("Aspect: Lexical, Best: " ...) around 6 free digits; a pairwise verdict's ~72 are ~55 forced around 16 tokens of
reasoning and two grades. Decoded one token per forward, each forced token costs a whole decode step although its
logits are masked down to one choice. Here the tokens llguidance's matcher forces next (`compute_ff_tokens`) are
recorded on the row at once, and the next forward feeds the row `[last token, forced...]` (k query positions), so
one forward does what k steps did (SGLang's "jump-forward" decoding; vLLM V1 has no equivalent).

Every row of a batch writes at the same KV column (`actors.engines.hf.kv_rows`), so a forward feeds every row the
same width k: a row with fewer tokens is right-aligned and its leading columns are padding (masked, like left
padding, and skipped by the position ids). Since those pads cost compute and columns, k is chosen so that most of
the fed positions are real tokens (`min_fill`): rows whose verdicts run in step (the jury's do, all rows of a call
answering the same grammar) fast-forward together, a lone row's forced text is left to single steps.

Greedy output is what single steps give whenever the forced tokens are the ones the masked argmax would have taken,
i.e. where the grammar allows one tokenisation of the forced text; llguidance forces the canonical tokenisation,
which SmolLM2 chose itself in every verdict of the demo (tests/test_hf_fast_forward.py pins the demo's jury and
pairwise grammars to single steps). `EngineSpec.fast_forward: false` restores single steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def forced_tokens(matcher, budget: int) -> list[int]:
    """The tokens `matcher` forces next, at most `budget` of them ([] without a matcher or once it has stopped)."""
    if matcher is None or budget <= 0 or matcher.is_stopped():
        return []
    return list(matcher.compute_ff_tokens())[:budget]


def feed_width(forced: Sequence[int], remaining: Sequence[int], length: int, capacity: int,
               min_fill: float) -> int:
    """The widest forward (query positions per row) worth running: the largest k with both

    - fill: the real tokens fed, sum(min(1 + forced_i, k)), are at least `min_fill` of the rows x k positions;
    - room: the KV buffer still holds every row's remaining completion after this step:
      length + k + max_i(remaining_i - min(forced_i, k - 1) - 1) <= capacity - 1 (what a merge sizes for).

    k = 1 (a plain step) always qualifies when the buffer was sized by the merge, so the answer is at least 1.

    Args:
        forced: per row, how many forced tokens it could feed after its last chosen token.
        remaining: per row, completion tokens it may still produce (max_tokens minus those it has).
        length: columns written so far; capacity: columns the buffer holds.
        min_fill: the least share of real tokens among the fed positions, in (0, 1].

    >>> feed_width([5, 5, 5], [20, 20, 20], 10, 40, 0.75)   # three rows in step: six tokens each
    6
    >>> feed_width([8, 0, 0, 0], [20, 20, 20, 20], 10, 40, 0.75)   # one row ahead: single steps
    1
    >>> feed_width([3, 3, 2, 2], [20, 20, 20, 20], 10, 40, 0.75)   # 14 real tokens of 16 positions
    4
    >>> feed_width([6, 2], [20, 30], 10, 41, 0.5)   # the second row's pads would leave its 27 tokens no room
    3
    """
    rows = len(forced)
    best = 1
    for k in range(2, 2 + max(forced, default=0)):
        real = sum(min(1 + f, k) for f in forced)
        after = max(r - min(f, k - 1) - 1 for f, r in zip(forced, remaining))
        if real >= min_fill * rows * k and length + k + after <= capacity - 1:
            best = max(best, k)
    return best


def feed_inputs(last: torch.Tensor, positions: torch.Tensor, fed: Sequence[Sequence[int]], width: int,
                pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, position ids and the new columns' mask of a forward `width` positions wide.

    Row i feeds its last chosen token (`last[i]`, at `positions[i]`) and then `fed[i]`, right-aligned: the
    leading `width - 1 - len(fed[i])` positions are pads (mask 0, position 0), its real tokens take consecutive
    positions. The last position of every row is real, so its logits choose the row's next token.

    Shapes: last, positions (rows, 1); returns three (rows, width) tensors (ids and positions long, mask long).

    >>> ids, pos, mask = feed_inputs(torch.tensor([[7], [9]]), torch.tensor([[4], [6]]), [[1, 2], []], 3, 0)
    >>> ids.tolist(), pos.tolist(), mask.tolist()
    ([[7, 1, 2], [0, 0, 9]], [[4, 5, 6], [0, 0, 6]], [[1, 1, 1], [0, 0, 1]])
    """
    rows = last.shape[0]
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, extra in enumerate(fed):
        n = 1 + len(extra)
        ids[i, width - n] = last[i, 0]
        if extra:
            ids[i, width - n + 1:] = torch.tensor(list(extra), dtype=torch.long)
        pos[i, width - n:] = torch.arange(int(positions[i, 0]), int(positions[i, 0]) + n)
        mask[i, width - n:] = 1
    device = last.device
    return ids.to(device), pos.to(device), mask.to(device)
