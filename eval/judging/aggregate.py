"""Jury aggregation and position-bias helpers, as pure functions over plain Python values.

- :func:`aggregate_scores`: one item's scores from several judges -> mean / median / majority
  (paper 001 aggregates by the arithmetic mean; the others are options).
- :func:`vote_best_worst`: several best/worst selections (paper 000 style) -> one best and worst.
- :func:`pairwise_winrate`: A/B/tie outcomes -> win rate of A, ties counted as half.
- :func:`shuffle_order`, :func:`to_original_index`, :func:`to_shown_index`, :func:`apply_order`:
  a candidate order reproducible from ``(seed, key)``, so each item can be shown to the judge in
  its own order and the verdict mapped back. Convention: ``order[shown_position] = original_index``.

This module is pure: it never imports ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass

AGGREGATIONS = ("mean", "median", "majority")


@dataclass(frozen=True)
class ScoreAggregate:
    """Result of :func:`aggregate_scores`.

    Attributes:
        value: The aggregate, or ``None`` when no score was usable.
        n_used: Scores that entered the aggregate.
        n_missing: ``None``/NaN scores that were skipped.
        tie: ``how="majority"`` only: several values shared the top count.
    """

    value: float | None
    n_used: int
    n_missing: int
    tie: bool = False


def _is_missing(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def aggregate_scores(scores: list[float | None], how: str = "mean") -> ScoreAggregate:
    """Aggregate one item's scores from several judges, skipping missing ones.

    Majority ties resolve to the LOWEST tied value (a split jury is read pessimistically) and set
    ``tie=True`` so callers can count or drop them.

    Args:
        scores: One score per judge; ``None`` or NaN marks a failed judgment.
        how: ``"mean"`` (paper 001's default), ``"median"`` (mean of the two middle values for an
            even count) or ``"majority"`` (most frequent value).

    Returns:
        A :class:`ScoreAggregate`.

    Raises:
        ValueError: Unknown ``how``.

    >>> aggregate_scores([4, None, 2, float("nan"), 3])
    ScoreAggregate(value=3.0, n_used=3, n_missing=2, tie=False)
    >>> aggregate_scores([2, 2, 4, 4, 5], how="majority")
    ScoreAggregate(value=2, n_used=5, n_missing=0, tie=True)
    """
    if how not in AGGREGATIONS:
        raise ValueError(f"how must be one of {AGGREGATIONS}, got {how!r}")
    used = [s for s in scores if not _is_missing(s)]
    n_missing = len(scores) - len(used)
    if not used:
        return ScoreAggregate(None, 0, n_missing)
    if how == "mean":
        return ScoreAggregate(sum(used) / len(used), len(used), n_missing)
    if how == "median":
        return ScoreAggregate(statistics.median(used), len(used), n_missing)
    counts = Counter(used)
    top = max(counts.values())
    modes = sorted(v for v, c in counts.items() if c == top)
    return ScoreAggregate(modes[0], len(used), n_missing, tie=len(modes) > 1)


# -----------------------------------------------------------------------------
# Best/worst voting


@dataclass(frozen=True)
class BestWorstVote:
    """Result of :func:`vote_best_worst`.

    Attributes:
        best: Winning candidate index, or ``None`` with no usable vote.
        worst: Losing candidate index (never equal to ``best``), or ``None``.
        tie: The votes could not separate the top candidates for best or for worst, so the
            lowest-index rule decided.
        best_votes: Best-vote count per candidate.
        worst_votes: Worst-vote count per candidate.
        n_used: Votes that were counted.
        n_invalid: Votes skipped because best == worst (self-contradictory).
    """

    best: int | None
    worst: int | None
    tie: bool
    best_votes: tuple[int, ...]
    worst_votes: tuple[int, ...]
    n_used: int
    n_invalid: int


def vote_best_worst(votes: list[tuple[int | None, int | None]], n_candidates: int) -> BestWorstVote:
    """Combine several judges' (best, worst) selections into one.

    Rules:
        - A ``None`` component is a missing vote for that side only; the other side still counts.
        - A vote with ``best == worst`` contradicts itself and is skipped entirely (``n_invalid``).
        - Best: most best votes; ties broken by fewer worst votes, then by lowest index.
        - Worst: chosen among the candidates other than best: most worst votes; ties broken by
          fewer best votes, then by lowest index.
        - ``tie`` is set when the lowest-index rule had to decide either side.
        - A side with no counted vote at all is ``None`` (nothing is invented). If every worst
          vote went to the chosen best, worst falls to the tie-breaks among the others.

    Args:
        votes: One ``(best, worst)`` per judge, indices in original candidate order.
        n_candidates: Number of candidates (>= 2).

    Returns:
        A :class:`BestWorstVote`.

    Raises:
        ValueError: ``n_candidates < 2`` or an index outside ``[0, n_candidates)``.

    >>> v = vote_best_worst([(1, 0), (1, 2), (3, 0)], 4)
    >>> (v.best, v.worst, v.tie)
    (1, 0, False)
    """
    if n_candidates < 2:
        raise ValueError(f"n_candidates must be >= 2, got {n_candidates}")
    best_votes, worst_votes = [0] * n_candidates, [0] * n_candidates
    n_used = n_invalid = 0
    for best, worst in votes:
        for index in (best, worst):
            if index is not None and not 0 <= index < n_candidates:
                raise ValueError(f"vote index {index} out of range for {n_candidates} candidates")
        if best is not None and best == worst:
            n_invalid += 1
            continue
        if best is None and worst is None:
            continue
        n_used += 1
        if best is not None:
            best_votes[best] += 1
        if worst is not None:
            worst_votes[worst] += 1
    best, best_tie = None, False
    if sum(best_votes):
        best, best_tie = _rank_first(range(n_candidates), best_votes, worst_votes)
    worst, worst_tie = None, False
    if sum(worst_votes):
        others = [i for i in range(n_candidates) if i != best]
        worst, worst_tie = _rank_first(others, worst_votes, best_votes)
    return BestWorstVote(best, worst, best_tie or worst_tie, tuple(best_votes), tuple(worst_votes), n_used, n_invalid)


def _rank_first(candidates, for_votes: list[int], against_votes: list[int]) -> tuple[int, bool]:
    """Pick the candidate with most ``for_votes``, then fewest ``against_votes``, then lowest index."""
    ranked = sorted(candidates, key=lambda i: (-for_votes[i], against_votes[i], i))
    first, second = ranked[0], ranked[1] if len(ranked) > 1 else None
    tie = second is not None and (for_votes[first], against_votes[first]) == (for_votes[second], against_votes[second])
    return first, tie


# -----------------------------------------------------------------------------
# Pairwise win rate


@dataclass(frozen=True)
class WinRate:
    """Result of :func:`pairwise_winrate`.

    Attributes:
        win_rate: ``(wins + ties / 2) / (wins + losses + ties)`` for A, or ``None`` if nothing counted.
        wins: Outcomes ``"A"``.
        losses: Outcomes ``"B"``.
        ties: Outcomes ``"tie"``.
        n_missing: ``None`` outcomes (failed judgments), excluded from the rate.
    """

    win_rate: float | None
    wins: int
    losses: int
    ties: int
    n_missing: int


def pairwise_winrate(outcomes: list[str | None]) -> WinRate:
    """Win rate of system A over system B, ties counted as half a win.

    Args:
        outcomes: ``"A"``, ``"B"``, ``"tie"`` or ``None`` (failed judgment) per comparison, with A
            and B already mapped back to the systems (not the shown positions).

    Returns:
        A :class:`WinRate`.

    Raises:
        ValueError: An outcome that is not one of the above (a caller bug, not model output).

    >>> pairwise_winrate(["A", "A", "B", "tie", None])
    WinRate(win_rate=0.625, wins=2, losses=1, ties=1, n_missing=1)
    """
    counts = Counter(outcomes)
    unknown = set(counts) - {"A", "B", "tie", None}
    if unknown:
        raise ValueError(f"unknown outcome(s) {sorted(map(repr, unknown))}")
    wins, losses, ties = counts["A"], counts["B"], counts["tie"]
    total = wins + losses + ties
    rate = (wins + ties / 2) / total if total else None
    return WinRate(rate, wins, losses, ties, counts[None])


# -----------------------------------------------------------------------------
# Position-bias helpers


def shuffle_order(n: int, seed: int, key: str) -> list[int]:
    """A permutation of ``range(n)`` reproducible from ``(seed, key)`` in any process.

    The RNG seed is the first 8 bytes of ``sha256(f"{seed}:{key}")``, not Python's ``hash()``,
    which is salted per process. ``order[shown_position] = original_index``.

    Args:
        n: Number of items.
        seed: Run-level seed.
        key: Item identity, e.g. a source id (add the judge name to vary order across judges).

    Returns:
        The shown order as original indices.

    >>> sorted(shuffle_order(4, seed=0, key="coedit-1"))
    [0, 1, 2, 3]
    >>> shuffle_order(4, 0, "coedit-1") == shuffle_order(4, 0, "coedit-1")
    True
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    order = list(range(n))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


def _check_index(index: int, order: list[int]) -> None:
    if not 0 <= index < len(order):
        raise ValueError(f"index {index} out of range for {len(order)} items")


def to_original_index(shown_index: int, order: list[int]) -> int:
    """Map a position the judge saw back to the original candidate index.

    >>> to_original_index(0, [2, 0, 1])
    2
    """
    _check_index(shown_index, order)
    return order[shown_index]


def to_shown_index(original_index: int, order: list[int]) -> int:
    """Map an original candidate index to the position it was shown at.

    >>> to_shown_index(2, [2, 0, 1])
    0
    """
    _check_index(original_index, order)
    return order.index(original_index)


def apply_order(items: list, order: list[int]) -> list:
    """Reorder ``items`` for display: ``shown[k] = items[order[k]]``.

    >>> apply_order(["a", "b", "c"], [2, 0, 1])
    ['c', 'a', 'b']
    """
    if sorted(order) != list(range(len(items))):
        raise ValueError(f"order {order} is not a permutation of {len(items)} items")
    return [items[i] for i in order]
