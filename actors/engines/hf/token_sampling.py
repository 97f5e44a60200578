"""Choosing the next token from logits: greedy argmax, or a seeded draw after temperature, top-k and top-p.

Pure torch; each sampled row carries its own `torch.Generator`, so a request's random stream does not depend on
which other requests share its batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from actors.engines.base import SamplingParams


class SampledRow(Protocol):
    """What choosing a token needs of a decode row (`actors.engines.hf.decode.DecodeRow`, which imports this module)."""

    sampling: SamplingParams
    generator: torch.Generator | None


# Sampling works on each row's candidates in rank order (`torch.topk`), never on a sort or a draw over the whole
# vocabulary: sorting 49k scores per row per step cost more than SmolLM2's forward at batch 16 (83 ms vs ~60 ms on
# one thread), and a multinomial over 49k probabilities ~1 ms per row. Top-p is decided on the best
# `_NUCLEUS_CANDIDATES` tokens first: when their mass reaches top_p, every token ranked below them is dropped by the
# rule anyway, so the kept set is the one a full sort gives. A row whose mass is spread wider takes the full sort.
_NUCLEUS_CANDIDATES = 256


def choose_tokens(logits: torch.Tensor, rows: list[SampledRow]) -> torch.Tensor:
    """Greedy argmax for rows at temperature 0, a seeded draw for the others.

    Rows with the same temperature / top-k / top-p are filtered together in one batched pass; each then draws
    from its own generator, so a row's token does not depend on its batch.

    Args:
        logits: float32 scores. Shape: (rows, vocab).
        rows: the rows, in the same order; sampled rows carry their own generator.

    Returns:
        Token ids. Shape: (rows,).
    """
    tokens = logits.argmax(dim=-1)
    groups: dict[tuple[float, int, float], list[int]] = {}
    for i, row in enumerate(rows):
        if row.sampling.temperature > 0:
            params = row.sampling
            groups.setdefault((params.temperature, params.top_k, params.top_p), []).append(i)
    for (temperature, top_k, top_p), index in groups.items():
        for i, (ids, probs) in zip(index, candidates(logits[index], temperature, top_k, top_p)):
            tokens[i] = ids[torch.multinomial(probs, 1, generator=rows[i].generator)[0]]
    return tokens


def candidates(logits: torch.Tensor, temperature: float, top_k: int = -1,
               top_p: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per row, the tokens that survive temperature, then top-k, then top-p (nucleus), with their probabilities.

    Args:
        logits: float32 scores. Shape: (rows, vocab).
        temperature: > 0.
        top_k: keep the k best tokens (-1 = off).
        top_p: keep the smallest set of best tokens whose mass reaches top_p (1.0 = off); a token is dropped when
            the tokens ranked above it already reach top_p, so the best token always stays.

    Returns:
        One (token ids, probabilities) pair per row, best first; the probabilities sum to 1.
    """
    scores = logits / temperature
    vocab = scores.shape[-1]
    limit = top_k if 0 < top_k < vocab else vocab
    if top_p >= 1.0:
        if limit == vocab:
            return [(torch.arange(vocab, device=scores.device), row.softmax(-1)) for row in scores]
        best, order = torch.topk(scores, limit, dim=-1)
        return list(zip(order, best.softmax(-1)))
    width = min(limit, _NUCLEUS_CANDIDATES)
    best, order = torch.topk(scores, width, dim=-1)
    # the mass of each candidate among the top-k (all tokens when top-k is off)
    total = (torch.topk(scores, limit, dim=-1).values if limit < vocab else scores).logsumexp(-1, keepdim=True)
    mass = (best - total).exp()
    cumulative = mass.cumsum(-1)
    keep = (cumulative - mass) < top_p
    out = []
    for i in range(len(scores)):
        if width < limit and cumulative[i, -1] < top_p:  # the nucleus reaches past the candidates
            ranked, ids = torch.topk(scores[i], limit)
            row_mass = (ranked - total[i]).exp()
            kept = int(((row_mass.cumsum(-1) - row_mass) < top_p).sum())
            out.append((ids[:kept], ranked[:kept].softmax(-1)))
        else:
            kept = int(keep[i].sum())
            out.append((order[i, :kept], best[i, :kept].softmax(-1)))
    return out


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token from temperature-scaled logits after top-k then top-p (nucleus) filtering.

    Args:
        logits: float32 scores for one row. Shape: (vocab,).
        params: temperature (> 0), top_k (-1 = off) and top_p (1.0 = off).
        generator: the row's random stream.

    Returns:
        A 0-d token id tensor.
    """
    [(ids, probs)] = candidates(logits[None], params.temperature, params.top_k, params.top_p)
    return ids[torch.multinomial(probs, 1, generator=generator)[0]]
