"""Token choice: the nucleus from a topk of candidates equals the one a full sort gives; batched rows draw from
their own streams."""

from __future__ import annotations

import pytest
import torch

import actors.engines.hf.token_sampling as ts
from actors.engines.base import SamplingParams
from actors.engines.hf.token_sampling import candidates, choose_tokens


def nucleus_by_full_sort(scores: torch.Tensor, top_k: int, top_p: float) -> list[int]:
    """The reference rule on one row: sort everything, cut to top-k, drop a token once the mass above it reaches
    top_p."""
    ranked, ids = torch.sort(scores, descending=True)
    if top_k > 0:
        ranked, ids = ranked[:top_k], ids[:top_k]
    mass = ranked.softmax(-1)
    return ids[(mass.cumsum(-1) - mass) < top_p].tolist()


def test_hand_worked_nucleus_and_top_k():
    # softmax([3, 2, 1, 0]) = [0.644, 0.237, 0.087, 0.032]; token 1 stays (0.644 above it is under 0.8), token 2
    # goes (0.881 above it); renormalized: 0.644 / 0.881 = 0.731, 0.237 / 0.881 = 0.269
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    [(ids, probs)] = candidates(logits, temperature=1.0, top_p=0.8)
    assert ids.tolist() == [0, 1]
    assert probs.tolist() == pytest.approx([0.731, 0.269], abs=1e-3)
    [(ids, probs)] = candidates(logits, temperature=1.0, top_k=3)
    assert ids.tolist() == [0, 1, 2]
    assert probs.tolist() == pytest.approx([0.665, 0.245, 0.090], abs=1e-3)
    # temperature 0.5 doubles the gaps: softmax([6, 4, 2, 0]) = [0.867, 0.117, 0.016, 0.002]: 0.867 >= 0.8
    [(ids, _)] = candidates(logits, temperature=0.5, top_p=0.8)
    assert ids.tolist() == [0]
    [(ids, probs)] = candidates(logits, temperature=1.0)
    assert ids.tolist() == [0, 1, 2, 3] and float(probs.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("top_k,top_p", [(-1, 0.95), (-1, 0.5), (50, 0.9), (500, 0.99)])
def test_candidates_equal_the_full_sort_rule(spread, top_k, top_p):
    # flat rows (spread 0.3) need far more than the 256 candidates and take the full sort; peaked ones do not
    generator = torch.Generator().manual_seed(int(spread * 10) + top_k)
    logits = torch.randn(6, 3000, generator=generator) * spread
    for row, (ids, probs) in zip(logits, candidates(logits, 1.0, top_k, top_p)):
        assert ids.tolist() == nucleus_by_full_sort(row, top_k, top_p)
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)


def test_rows_past_the_candidate_window_take_the_full_sort(monkeypatch):
    monkeypatch.setattr(ts, "_NUCLEUS_CANDIDATES", 2)
    # four equal tokens: the mass above each is 0, .25, .5, .75, all under 0.8, so all four stay; the best two
    # hold only 0.5, so the row must not be cut at the window
    [(ids, probs)] = candidates(torch.zeros(1, 4), temperature=1.0, top_p=0.8)
    assert sorted(ids.tolist()) == [0, 1, 2, 3]
    assert probs.tolist() == pytest.approx([0.25] * 4)


class Row:
    def __init__(self, sampling: SamplingParams, seed: int):
        self.sampling = sampling
        self.generator = torch.Generator().manual_seed(seed)


def test_a_rows_draw_depends_on_its_own_stream_not_its_batch():
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)) * 4
    hot, cold = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.0)
    mixed = [Row(hot, 7), Row(cold, 0), Row(SamplingParams(temperature=0.7, top_k=20), 3), Row(hot, 7), Row(hot, 9)]
    tokens = choose_tokens(logits, mixed).tolist()
    # rows 0 and 3 share params and seed but not logits; alone, each draws what it drew in the batch
    for i in (0, 3, 4, 2):
        alone = choose_tokens(logits[i:i + 1], [Row(mixed[i].sampling, {0: 7, 3: 7, 4: 9, 2: 3}[i])]).tolist()
        assert alone == [tokens[i]]
    assert tokens[1] == int(logits[1].argmax())
    # every sampled token is inside its row's nucleus
    assert tokens[0] in nucleus_by_full_sort(logits[0], -1, 0.9)
    assert tokens[2] in nucleus_by_full_sort(logits[2] / 0.7, 20, 1.0)
