"""Group rewards of the GRM service (`/reward/group`, MENLO paper 003 §5: a pairwise GRM scores GRPO rollouts):

- `all_pairs`: every pair of the G responses is judged once (both orders with `both_orders`). Response i's reward
  is its **mean grade margin**, the mean over its judgments of ``grade_i - grade_opponent``, in [-4, 4]. Unlike
  MENLO's mean own grade (also returned, as `mean_grade`) the margin cancels a judge's overall leniency per pair,
  and with every judgment parsed the rewards of a group sum to 0.
- `vs_reference`: each response is judged against the reference; reward = mean of ``grade_i - grade_reference``,
  on the same scale.

Positions alternate so each response is shown as A about as often as B (round-robin parity: pair (i, j), i < j,
puts i first when i + j is odd). A judgment whose grades cannot be parsed is left out of the means and listed in
the item's `errors`; an item with no parsed judgment gets ``reward = None``, never a silent 0.

- `listwise` (quorum's extension): one judge call ranks the whole group under a grammar that admits only a
  permutation of 1..n (or grades it, one grade per response); reward = the normalised rank, 1 for the best and 0
  for the worst (or ``(grade - 1) / 4``), in [0, 1] (`eval.judging.listwise`). An unparsed answer gives every response
  ``reward = None``, counted.

Pure: no ray, no torch.
"""

from __future__ import annotations

import itertools

from actors.engines.base import Completion
from eval.judging import listwise as L
from eval.judging.menlo_parse import parse_menlo_grades
from eval.reward_wire import (
    REWARD_DEFINITIONS,
    SCHEMES,
    GroupCounts,
    GroupRewardResponse,
    ItemReward,
    JudgmentOut,
    ListwiseOut,
)
from serve.protocol import extract_rationale, judge_text, status_of, usage_of

REFERENCE = -1
def plan_pairs(n: int, scheme: str, both_orders: bool = False) -> list[tuple[int, int]]:
    """(A, B) index pairs to judge; `REFERENCE` (-1) stands for the reference.

    >>> plan_pairs(3, "all_pairs")
    [(0, 1), (2, 0), (1, 2)]
    >>> plan_pairs(2, "vs_reference")
    [(0, -1), (-1, 1)]
    """
    if scheme == "all_pairs":
        pairs = [(i, j) if (i + j) % 2 else (j, i) for i, j in itertools.combinations(range(n), 2)]
    elif scheme == "vs_reference":
        pairs = [(i, REFERENCE) if i % 2 == 0 else (REFERENCE, i) for i in range(n)]
    else:
        raise ValueError(f"scheme: {scheme!r} is not one of {SCHEMES}")
    if both_orders:
        return [pair for a, b in pairs for pair in ((a, b), (b, a))]
    return pairs


def read_judgment(a: int, b: int, completion: Completion, cached: bool = False) -> JudgmentOut:
    raw = judge_text(completion)
    grades = parse_menlo_grades(raw)
    return JudgmentOut(a=a, b=b, grade_a=grades.grade_a, grade_b=grades.grade_b,
                       parse_status=status_of(completion, grades.error), rationale=extract_rationale(raw),
                       cached=cached)


def compute_rewards(n: int, judgments: list[JudgmentOut]) -> list[ItemReward]:
    """Per-response reward = mean grade margin over its parsed judgments (see module docstring).

    A judgment counts only when both grades parsed (`parse_status == "ok"`); the reference side earns nothing.
    """
    margins: list[list[int]] = [[] for _ in range(n)]
    grades: list[list[int]] = [[] for _ in range(n)]
    errors: list[list[str]] = [[] for _ in range(n)]
    for j in judgments:
        for idx, own, other in ((j.a, j.grade_a, j.grade_b), (j.b, j.grade_b, j.grade_a)):
            if idx == REFERENCE:
                continue
            if j.parse_status != "ok":
                errors[idx].append(f"({j.a},{j.b}): {j.parse_status}")
            else:
                margins[idx].append(own - other)
                grades[idx].append(own)
    return [
        ItemReward(index=i, reward=_mean(margins[i]), mean_grade=_mean(grades[i]),
                   n_judgments=len(margins[i]) + len(errors[i]), n_failed=len(errors[i]), errors=errors[i])
        for i in range(n)
    ]


def group_response(scheme: str, n: int, judgments: list[JudgmentOut], completions: list[Completion],
                   model: str) -> GroupRewardResponse:
    items = compute_rewards(n, judgments)
    counts = GroupCounts(
        n_responses=n, n_judgments=len(judgments),
        n_failed_judgments=sum(j.parse_status != "ok" for j in judgments),
        n_null_rewards=sum(item.reward is None for item in items),
    )
    return GroupRewardResponse(scheme=scheme, reward_definition=REWARD_DEFINITIONS[scheme],
                               rewards=[item.reward for item in items], items=items, judgments=judgments,
                               counts=counts, model=model, usage=usage_of(completions))


def listwise_response(n: int, mode: str, completion: Completion, cached: bool, model: str) -> GroupRewardResponse:
    """The group's rewards from its one listwise verdict; each item's `mean_grade` is its grade (mode "grade") or
    None (mode "rank": a ranking has no grade)."""
    raw = judge_text(completion)
    verdict = L.parse_ranking(raw, n) if mode == "rank" else L.parse_grades(raw, n)
    status = status_of(completion, verdict.error)
    rewards: list[float | None] = [None] * n
    if status == "ok":
        rewards = L.rank_rewards(verdict.order, n) if mode == "rank" else L.grade_rewards(verdict.grades)
    grades = verdict.grades if status == "ok" and verdict.grades else [None] * n
    failed = status != "ok"
    items = [ItemReward(index=i, reward=rewards[i], mean_grade=grades[i], n_judgments=1, n_failed=int(failed),
                        errors=[f"listwise: {status}"] if failed else []) for i in range(n)]
    counts = GroupCounts(n_responses=n, n_judgments=1, n_failed_judgments=int(failed),
                         n_null_rewards=n if failed else 0)
    out = ListwiseOut(mode=mode, order=verdict.order, grades=verdict.grades, parse_status=status,
                      rationale=extract_rationale(raw), cached=cached)
    return GroupRewardResponse(scheme="listwise", reward_definition=REWARD_DEFINITIONS["listwise"], rewards=rewards,
                               items=items, judgments=[], counts=counts, model=model, usage=usage_of([completion]),
                               listwise=out)


def caller_rewards(out: GroupRewardResponse, signal: str) -> list[float | None]:
    """The reward per response a caller trains on: the body's `rewards` (margins; listwise: normalised ranks) or,
    with signal "own_grade" on a pairwise scheme, each item's `mean_grade`. None where no judgment parsed."""
    if signal == "own_grade" and out.scheme != "listwise":
        return [item.mean_grade for item in out.items]
    return list(out.rewards)


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None
