"""Wire format of the GRM service's group reward (`POST /reward/group`), shared by the server (`serve.rewards`) and
the rollout-side client (`train.reward_client`), which sit side by side above this module.

Pure pydantic: no ray, no torch. The request model with the server's own limits is `serve.protocol.GroupRewardRequest`;
its body is the client's `GroupRewardClient.body`.
"""

from __future__ import annotations

from pydantic import BaseModel

SCHEMES = ("all_pairs", "vs_reference")
REWARD_DEFINITIONS = {
    "all_pairs": "mean over judgments of grade_i - grade_opponent (range -4..4)",
    "vs_reference": "mean over judgments of grade_i - grade_reference (range -4..4)",
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
