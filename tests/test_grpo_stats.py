"""The per-step statistics GRPO logs beside the mean reward (train/grpo/stats.py) and the clip fraction's two
sides (train/grpo/advantages.py), with hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from train.grpo.advantages import grpo_policy_loss
from train.grpo.stats import extrema_sums, finish_stats, rank_metrics, step_stat_sums


def test_score_advantage_and_length_statistics():
    rewards = [[1.0, 0.0], [0.5, 0.5]]  # two scored groups; a failed third group has no rewards
    advantages = torch.tensor([0.7, -0.7, 0.0, 0.0, 9.0, 9.0])
    valid = torch.tensor([True, True, True, True, False, False])  # the failed group's rows are not counted
    sums = step_stat_sums(rewards, advantages, valid, prompt_lengths=[10, 30, 20], response_lengths=[4, 8, 2, 6])
    metrics = finish_stats(sums)
    assert metrics["score/max"] == 1.0 and metrics["score/min"] == 0.0 and metrics["score/mean"] == 0.5
    assert metrics["score/std"] == pytest.approx(math.sqrt(0.125))  # (0.25 + 0.25 + 0 + 0) / 4
    assert metrics["advantage/max"] == pytest.approx(0.7) and metrics["advantage/min"] == pytest.approx(-0.7)
    assert metrics["advantage/mean"] == pytest.approx(0.0)
    assert metrics["advantage/std"] == pytest.approx(math.sqrt(0.49 * 2 / 4))
    assert (metrics["prompt_length/mean"], metrics["prompt_length/max"], metrics["prompt_length/min"]) == (20, 30, 10)
    assert (metrics["response_length/mean"], metrics["response_length/max"], metrics["response_length/min"]) == (
        5, 8, 2)


def test_a_worker_without_scores_leaves_the_extrema_to_the_others():
    empty = extrema_sums("score", [])
    assert (empty["score_max"], empty["score_min"]) == (-math.inf, math.inf)
    # what reduce_sums does over two workers: max of maxes, min of mins, sums summed
    other = extrema_sums("score", [0.25, 0.75])
    reduced = {k: (max if k.endswith("_max") else min if k.endswith("_min") else sum)([empty[k], other[k]])
               for k in empty}
    assert finish_stats(reduced) == {"score/mean": 0.5, "score/std": 0.25, "score/max": 0.75, "score/min": 0.25}
    nothing = finish_stats(empty)
    assert all(math.isnan(v) for v in nothing.values())


def test_per_rank_keys_survive_a_sum_over_workers():
    assert rank_metrics(3, {"tokens_per_s": 12.5}) == {"perf/rank3/tokens_per_s": 12.5}


def test_the_clip_fraction_splits_into_its_high_and_low_sides():
    # token ratios exp(logps - old): 1.5 (A > 0: clipped high), 0.5 (A < 0: clipped low), 1.0, 0.5 with A > 0 (not
    # clipped: the min keeps the unclipped term)
    old = torch.zeros(1, 4)
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0, 0.5]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    _, metrics = grpo_policy_loss(logps, old, advantages, torch.ones(1, 4), clip_eps_low=0.2, clip_eps_high=0.2)
    assert metrics["clip_fraction_high"].item() == pytest.approx(0.25)
    assert metrics["clip_fraction_low"].item() == pytest.approx(0.25)
    assert metrics["clip_fraction"].item() == pytest.approx(0.5)
