"""Wire format of the GRM service's group reward (`POST /reward/group`), shared by the server (`serve.rewards`) and
the rollout-side client (`train.grpo.reward.client`), which sit side by side above this module.

Pure pydantic: no ray, no torch. The request model with the server's own limits is `serve.protocol.GroupRewardRequest`;
its body is the client's `GroupRewardClient.body`.
"""

from __future__ import annotations

from pydantic import BaseModel

# all_pairs is the paper's (MENLO §5); listwise (one judge call ranks or grades the whole group) is quorum's extension
SCHEMES = ("all_pairs", "vs_reference", "listwise")
REWARD_DEFINITIONS = {
    "all_pairs": "mean over judgments of grade_i - grade_opponent (range -4..4)",
    "vs_reference": "mean over judgments of grade_i - grade_reference (range -4..4)",
    "listwise": "one call for the group: normalised rank (n - 1 - position_i) / (n - 1), or (grade_i - 1) / 4 "
                "(range 0..1)",
}


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class JudgmentOut(BaseModel):
    # response indices shown as A and B; -1 is the reference
    a: int
    b: int
    grade_a: int | None
    grade_b: int | None
    parse_status: str
    rationale: str
    cached: bool = False


class ListwiseOut(BaseModel):
    # "rank" or "grade"; `order`: 0-based response indices, best first (rank); `grades`: per response (grade)
    mode: str
    order: list[int] | None
    grades: list[int] | None
    parse_status: str
    rationale: str
    cached: bool = False


class ItemReward(BaseModel):
    index: int
    reward: float | None
    mean_grade: float | None
    n_judgments: int
    n_failed: int
    errors: list[str]


class GroupCounts(BaseModel):
    n_responses: int
    n_judgments: int
    n_failed_judgments: int
    n_null_rewards: int


class GroupRewardResponse(BaseModel):
    scheme: str
    reward_definition: str
    rewards: list[float | None]
    items: list[ItemReward]
    judgments: list[JudgmentOut]
    counts: GroupCounts
    model: str
    usage: Usage
    # the one verdict of scheme "listwise" (its `judgments` are then empty); None for the pairwise schemes
    listwise: ListwiseOut | None = None
