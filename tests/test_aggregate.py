"""Tests for eval.judging.aggregate on hand-made vote tables (working in the comments)."""

from __future__ import annotations

import doctest
import hashlib
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from eval.judging import aggregate
from eval.judging.aggregate import (
    BestWorstVote,
    ScoreAggregate,
    aggregate_scores,
    apply_order,
    pairwise_winrate,
    shuffle_order,
    to_original_index,
    to_shown_index,
    vote_best_worst,
)

NAN = float("nan")


def test_doctests_pass():
    assert doctest.testmod(aggregate).failed == 0


# -----------------------------------------------------------------------------
# aggregate_scores


@pytest.mark.parametrize(
    "scores, how, expected",
    [
        # (4 + 2 + 3) / 3 = 3.0; None and NaN skipped
        ([4, None, 2, NAN, 3], "mean", ScoreAggregate(3.0, 3, 2)),
        # seven judges, paper 001's mean: (4+3+4+5+4+4+3) / 7 = 27 / 7
        ([4, 3, 4, 5, 4, 4, 3], "mean", ScoreAggregate(27 / 7, 7, 0)),
        # sorted 1 2 4 5 -> (2 + 4) / 2
        ([5, 1, 4, 2], "median", ScoreAggregate(3.0, 4, 0)),
        # sorted 1 3 5 -> 3
        ([3, None, 1, 5], "median", ScoreAggregate(3, 3, 1)),
        # 4 appears twice, 3 and 5 once
        ([4, 4, 3, 5], "majority", ScoreAggregate(4, 4, 0)),
        # 2 and 4 both twice -> lowest tied value, flagged
        ([2, 2, 4, 4, 5], "majority", ScoreAggregate(2, 5, 0, tie=True)),
        # all distinct -> every value ties at count 1 -> lowest
        ([5, 3, 4], "majority", ScoreAggregate(3, 3, 0, tie=True)),
        ([None, NAN], "mean", ScoreAggregate(None, 0, 2)),
        ([], "median", ScoreAggregate(None, 0, 0)),
        ([None], "majority", ScoreAggregate(None, 0, 1)),
    ],
)
def test_aggregate_scores(scores, how, expected):
    got = aggregate_scores(scores, how=how)
    assert (got.n_used, got.n_missing, got.tie) == (expected.n_used, expected.n_missing, expected.tie)
    if expected.value is None:
        assert got.value is None
    else:
        assert math.isclose(got.value, expected.value)


def test_aggregate_scores_rejects_unknown_method():
    with pytest.raises(ValueError, match="how must be one of"):
        aggregate_scores([1, 2], how="mode")


# -----------------------------------------------------------------------------
# vote_best_worst


def bw(best, worst, tie, best_votes, worst_votes, n_used, n_invalid=0):
    return BestWorstVote(best, worst, tie, tuple(best_votes), tuple(worst_votes), n_used, n_invalid)


@pytest.mark.parametrize(
    "votes, n, expected",
    [
        # best votes c1=2 c3=1 -> 1; worst votes c0=2 c2=1 -> 0
        ([(1, 0), (1, 2), (3, 0)], 4, bw(1, 0, False, [0, 2, 0, 1], [2, 0, 1, 0], 3)),
        # best: c0 and c1 both 2 best votes; c0 has 1 worst vote, c1 none -> c1.
        # worst among {0, 2, 3}: c3 has 2 -> 3
        ([(0, 2), (1, 0), (1, 3), (0, 3)], 4, bw(1, 3, False, [2, 2, 0, 0], [1, 0, 1, 2], 4)),
        # best: c0 (2 best, 2 worst) vs c2 (2 best, 0 worst) -> c2.
        # worst among {0, 1}: both 2 worst votes; c1 has fewer best votes (0 < 2) -> 1
        ([(0, 1), (0, 1), (2, 0), (2, 0)], 3, bw(2, 1, False, [2, 0, 2], [2, 2, 0], 4)),
        # c0 and c1 identical on both counts -> lowest index 0, tie; worst among {1, 2}: c1 -> 1
        ([(0, 1), (1, 0)], 3, bw(0, 1, True, [1, 1, 0], [1, 1, 0], 2)),
        # (2, 2) contradicts itself: skipped and counted as invalid
        ([(2, 2), (1, 0)], 3, bw(1, 0, False, [0, 1, 0], [1, 0, 0], 1, n_invalid=1)),
        # None sides: best c1=2; worst c0=1 c2=1, both 0 best votes -> lowest index 0, tie
        ([(None, 0), (1, None), (1, 2)], 3, bw(1, 0, True, [0, 2, 0], [1, 0, 1], 3)),
        # only worst votes: no best is invented
        ([(None, 3)], 4, bw(None, 3, False, [0, 0, 0, 0], [0, 0, 0, 1], 1)),
        # nothing usable
        ([(None, None), (1, 1)], 3, bw(None, None, False, [0, 0, 0], [0, 0, 0], 0, n_invalid=1)),
        ([], 2, bw(None, None, False, [0, 0], [0, 0], 0)),
        # best c0=3; worst among {1, 2}: c1=2 beats c2=1
        ([(0, 2), (0, 1), (1, 0), (0, 1)], 3, bw(0, 1, False, [3, 1, 0], [1, 2, 1], 4)),
        # best c0=2 c1=1 -> 0; worst among {1, 2}: c1=2 -> 1
        ([(0, 1), (0, 1), (1, 0)], 3, bw(0, 1, False, [2, 1, 0], [1, 2, 0], 3)),
        # best c0=2 c2=1 -> 0; worst among {1, 2}: c2=2 -> 2
        ([(0, 2), (0, 2), (2, 0)], 3, bw(0, 2, False, [2, 0, 1], [1, 0, 2], 3)),
        # best: c0 and c2 both 2, c0 has 3 worst votes and c2 one -> 2; worst among {0, 1}: c0=3 -> 0
        ([(0, 1), (0, 2), (1, 0), (2, 0), (2, 0)], 3, bw(2, 0, False, [2, 1, 2], [3, 1, 1], 5)),
    ],
)
def test_vote_best_worst(votes, n, expected):
    assert vote_best_worst(votes, n) == expected


def test_vote_best_worst_worst_falls_to_tie_breaks_when_winner_got_all_worst_votes():
    # best votes c0=2, c1=1; worst votes only on c0 (the winner) -> among {1, 2} no worst votes,
    # fewer best votes picks c2 (0 < 1); the vote decided it, so no tie.
    assert vote_best_worst([(0, None), (0, None), (1, 0)], 3) == bw(0, 2, False, [2, 1, 0], [1, 0, 0], 3)


def test_vote_best_worst_rejects_bad_input():
    with pytest.raises(ValueError, match="out of range"):
        vote_best_worst([(0, 4)], 4)
    with pytest.raises(ValueError, match="out of range"):
        vote_best_worst([(-1, 0)], 4)
    with pytest.raises(ValueError, match=">= 2"):
        vote_best_worst([], 1)


# -----------------------------------------------------------------------------
# pairwise_winrate


@pytest.mark.parametrize(
    "outcomes, rate, counts",
    [
        # (2 + 1/2) / 4 = 0.625, the None is excluded
        (["A", "A", "B", "tie", None], 0.625, (2, 1, 1, 1)),
        (["B", "B"], 0.0, (0, 2, 0, 0)),
        (["tie", "tie", "tie"], 0.5, (0, 0, 3, 0)),
        # (1 + 0) / 3
        (["A", "B", "B"], 1 / 3, (1, 2, 0, 0)),
        ([None, None], None, (0, 0, 0, 2)),
        ([], None, (0, 0, 0, 0)),
    ],
)
def test_pairwise_winrate(outcomes, rate, counts):
    got = pairwise_winrate(outcomes)
    assert (got.wins, got.losses, got.ties, got.n_missing) == counts
    assert got.win_rate == rate if rate is None else math.isclose(got.win_rate, rate)


def test_pairwise_winrate_rejects_unknown_outcome():
    with pytest.raises(ValueError, match="unknown outcome"):
        pairwise_winrate(["A", "a"])


# -----------------------------------------------------------------------------
# Position bias


def test_shuffle_order_is_a_reproducible_permutation():
    for n in range(7):
        order = shuffle_order(n, seed=3, key=f"item-{n}")
        assert sorted(order) == list(range(n))
        assert order == shuffle_order(n, seed=3, key=f"item-{n}")
    orders = {tuple(shuffle_order(5, seed=0, key=f"src-{i}")) for i in range(20)}
    assert len(orders) > 1  # the key matters
    assert len({tuple(shuffle_order(5, seed=s, key="src-0")) for s in range(20)}) > 1  # so does the seed


def test_shuffle_order_derivation_is_pinned():
    # Spelled out so another implementation can reproduce it: sha256("seed:key"), first 8 bytes
    # big-endian seed random.Random, then Random.shuffle(range(n)).
    expected = list(range(4))
    random.Random(int.from_bytes(hashlib.sha256(b"0:coedit-000123").digest()[:8], "big")).shuffle(expected)
    assert shuffle_order(4, 0, "coedit-000123") == expected == [3, 0, 2, 1]
    assert shuffle_order(6, 1234, "asset-17/judge=qwen") == [4, 3, 5, 1, 2, 0]


def test_shuffle_order_ignores_python_hash_salt():
    code = "from eval.judging.aggregate import shuffle_order; print(shuffle_order(6, 1234, 'asset-17/judge=qwen'))"
    repo = Path(__file__).resolve().parents[1]
    outputs = set()
    for salt in ("1", "987"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                             check=False)
        assert out.returncode == 0, out.stderr
        outputs.add(out.stdout.strip())
    assert outputs == {"[4, 3, 5, 1, 2, 0]"}


def test_index_mapping_round_trip():
    order = [2, 0, 3, 1]  # shown position k holds original candidate order[k]
    assert [to_original_index(k, order) for k in range(4)] == [2, 0, 3, 1]
    assert [to_shown_index(i, order) for i in range(4)] == [1, 3, 0, 2]
    for k in range(4):
        assert to_shown_index(to_original_index(k, order), order) == k
    with pytest.raises(ValueError):
        to_original_index(4, order)
    with pytest.raises(ValueError):
        to_shown_index(-1, order)


def test_position_bias_end_to_end():
    candidates = ["a", "b", "c", "d"]
    order = [2, 0, 3, 1]
    assert apply_order(candidates, order) == ["c", "a", "d", "b"]
    # the judge picked shown 1 ("a") as best and shown 2 ("d") as worst
    best, worst = to_original_index(1, order), to_original_index(2, order)
    assert (candidates[best], candidates[worst]) == ("a", "d")
    with pytest.raises(ValueError, match="not a permutation"):
        apply_order(candidates, [0, 1, 1, 2])
