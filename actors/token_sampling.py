"""Choosing the next token from logits: greedy argmax, or a seeded draw after temperature, top-k and top-p.

Pure torch; each sampled row carries its own `torch.Generator`, so a request's random stream does not depend on
which other requests share its batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from actors.engine import SamplingParams


class SampledRow(Protocol):
    """What choosing a token needs of a decode row (`actors.hf_decode.DecodeRow`, which imports this module)."""

    sampling: SamplingParams
    generator: torch.Generator | None


def choose_tokens(logits: torch.Tensor, rows: list[SampledRow]) -> torch.Tensor:
    """Greedy argmax for rows at temperature 0, a seeded draw for the others.

    Args:
        logits: float32 scores. Shape: (rows, vocab).
        rows: the rows, in the same order; sampled rows carry their own generator.

    Returns:
        Token ids. Shape: (rows,).
    """
    tokens = logits.argmax(dim=-1)
    for i, row in enumerate(rows):
        if row.sampling.temperature > 0:
            tokens[i] = sample_token(logits[i], row.sampling, row.generator)
    return tokens


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token from temperature-scaled logits after top-k then top-p (nucleus) filtering.

    Args:
        logits: float32 scores for one row. Shape: (vocab,).
        params: temperature (> 0), top_k (-1 = off) and top_p (1.0 = off).
        generator: the row's random stream.

    Returns:
        A 0-d token id tensor.
    """
    scores = logits / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        # Drop a token when the tokens ranked above it already reach top_p; the best token always stays.
        drop = (cumulative - sorted_scores.softmax(-1)) >= params.top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[0]
