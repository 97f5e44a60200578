"""Per-step statistics of a GRPO worker that OpenRLHF and verl users read beside the mean reward: score range,
advantage and length distributions, and per-rank figures (pure; the loop reduces them over workers).

Every function returns a dict of sums and extrema that `train.grpo.loop.reduce_sums` all-reduces by suffix:
``*_max`` with max, ``*_min`` with min, everything else summed. A key that carries one rank's name
(``.../rank<r>/...``) is held by that rank alone, so its sum over workers is that rank's own value.
`finish_stats` turns the reduced dict into logged metrics; an extremum no worker saw (inf) becomes NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

Metrics = dict[str, float]


def extrema_sums(name: str, values: Iterable[float]) -> Metrics:
    """Sum, count, max and min of `values` under `name` (an empty list gives -inf / inf extrema).

    >>> extrema_sums("x", [2.0, -1.0, 5.0])
    {'x_sum': 6.0, 'x_sq_sum': 30.0, 'x_count': 3.0, 'x_max': 5.0, 'x_min': -1.0}
    """
    values = [float(v) for v in values]
    return {f"{name}_sum": sum(values), f"{name}_sq_sum": sum(v * v for v in values), f"{name}_count": float(len(values)),
            f"{name}_max": max(values, default=-math.inf), f"{name}_min": min(values, default=math.inf)}


def step_stat_sums(rewards: Sequence[Sequence[float]], advantages: torch.Tensor, valid: torch.Tensor,
                   prompt_lengths: Sequence[int], response_lengths: Sequence[int]) -> Metrics:
    """One worker's step: the scored rewards (one list per successful group), the advantages of the rollouts of
    successful groups, and the prompt and response lengths in tokens."""
    return (extrema_sums("score", [r for group in rewards for r in group])
            | extrema_sums("advantage", advantages[valid.bool()].tolist())
            | extrema_sums("prompt_length", prompt_lengths)
            | extrema_sums("response_length", response_lengths))


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.nan


def finish_stats(totals: Metrics) -> Metrics:
    """Reduced `step_stat_sums` -> ``<group>/mean``, ``/std`` (population), ``/max``, ``/min``.

    >>> finish_stats(extrema_sums("score", [1.0, 3.0]))
    {'score/mean': 2.0, 'score/std': 1.0, 'score/max': 3.0, 'score/min': 1.0}
    """
    metrics = {}
    for name in ("score", "advantage", "prompt_length", "response_length"):
        count = totals.get(f"{name}_count", 0.0)
        if f"{name}_count" not in totals:
            continue
        mean = totals[f"{name}_sum"] / count if count else math.nan
        var = max(totals[f"{name}_sq_sum"] / count - mean * mean, 0.0) if count else math.nan
        metrics |= {f"{name}/mean": mean, f"{name}/std": math.sqrt(var), f"{name}/max": _finite(totals[f"{name}_max"]),
                    f"{name}/min": _finite(totals[f"{name}_min"])}
    return metrics


def rank_metrics(rank: int, values: Metrics) -> Metrics:
    """`values` under this rank's own keys (``perf/rank<r>/<name>``), kept apart by the sum over workers."""
    return {f"perf/rank{rank}/{name}": value for name, value in values.items()}
