"""Group reward callables for GRPO, built on each worker from a plain-data spec.

    reward = build_reward({"kind": "judge", "config": {"near_miss": 0.5}})
    outcomes = reward(rows, completions)      # completions[i] = the G texts sampled for rows[i]
    reward.close()

Kinds:
    judge  MENLO judge training (`train.grpo.reward.judge_training`): each rollout is a judge answer for the row's A/B pair,
           scored against the row's ``gold_a`` / ``gold_b``. Local and pure; never fails.
    grm    policy training against the served generative reward model: each row's G rollouts go to the Serve
           app's ``/reward/group`` in one request (`train.grpo.reward.client`), ``concurrency`` groups at a time so the
           server can batch their judge calls. The GRM sees ``row["judge_prompt"]`` as the prompt, the row's
           ``dimension`` and ``locale`` (with ``send_context``: the template the judge was trained on renders
           them) and ``row["reference"]`` for the vs_reference scheme. ``versus`` judges one answer per row
           against a baseline answer in both orders (policy validation, `train.grpo.validate`).

A spec is data, not a function, so it survives the trip to the Ray Train workers and into the run's config.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor

from train.grpo.batch import GroupOutcome
from train.grpo.reward.client import GroupRewardClient, RewardServiceConfig
from train.grpo.reward.handle import reward_transport
from train.grpo.reward.judge_training import COMPONENTS, JudgeRewardConfig, judge_reward, pointwise_reward

REWARD_KINDS = ("judge", "grm")
ROW_KEYS = {"judge": ("gold_a", "gold_b"), "grm": ("judge_prompt",)}


class JudgeGroupReward:
    """MENLO's judge reward for every rollout; components logged as ``reward/<term>``."""

    def __init__(self, cfg: JudgeRewardConfig):
        self.cfg = cfg

    def __call__(self, rows: list[dict], completions: list[list[str]]) -> list[GroupOutcome]:
        outcomes = []
        for row, texts in zip(rows, completions):
            if row.get("mode") == "pointwise":  # one response, one gold grade (judge_grpo prompt.mode pointwise)
                scored = [pointwise_reward(text, float(row["gold_a"]), self.cfg) for text in texts]
            else:
                scored = [judge_reward(text, float(row["gold_a"]), float(row["gold_b"]), self.cfg) for text in texts]
            components = {name: [getattr(b, name) for b in scored] for name in COMPONENTS if name != "total"}
            components["extract_fail"] = [float(not b.extracted) for b in scored]
            components["format_fail"] = [float(not b.format_ok) for b in scored]
            outcomes.append(GroupOutcome(rewards=[b.total for b in scored], components=components))
        return outcomes

    def close(self) -> None:
        return None


class GRMGroupReward:
    """One `/reward/group` request per prompt, `concurrency` in flight; failures come back as failed outcomes."""

    def __init__(self, cfg: RewardServiceConfig, seed: int = 0):
        self.cfg = cfg
        # a Serve handle when cfg.app names the job's own GRM app (no HTTP proxy needed on this node), else HTTP
        self.client = GroupRewardClient(cfg, seed=seed, transport=reward_transport(cfg))
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="grm-reward")

    def __call__(self, rows: list[dict], completions: list[list[str]]) -> list[GroupOutcome]:
        return [call.result() for call in self.submit(rows, completions)]

    def submit(self, rows: list[dict], completions: list[list[str]]) -> list[Future]:
        """One request per group queued now, without waiting (`train.grpo.overlap` sends each group the moment
        its rollouts exist); each future holds the group's outcome, retries and failures as in `__call__`."""
        return [self._pool.submit(self.client.score, row["judge_prompt"], texts, row.get("reference"),
                                  **self._context(row))
                for row, texts in zip(rows, completions)]

    def versus(self, rows: list[dict], answers: list[str], baselines: list[str]) -> list[GroupOutcome]:
        """Each row's answer judged against its baseline answer, in both orders (the outcome's components hold
        the answer's mean grade margin over the baseline and its mean own grade)."""
        calls = [self._pool.submit(self.client.score, row["judge_prompt"], [answer], baseline,
                                   scheme="vs_reference", both_orders=True, **self._context(row))
                 for row, answer, baseline in zip(rows, answers, baselines)]
        return [call.result() for call in calls]

    def _context(self, row: dict) -> dict:
        if not self.cfg.send_context:
            return {}
        return {"dimension": row.get("dimension") or None, "locale": row.get("locale") or None}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.client.close()


def check_reward_spec(spec: dict) -> None:
    """Raise ValueError naming the bad key of a reward spec (run on the driver before any worker starts)."""
    kind = spec.get("kind")
    if kind not in REWARD_KINDS:
        raise ValueError(f"reward.kind: {kind!r} is not one of {list(REWARD_KINDS)}")
    config = _config(spec)
    config.validate("reward")
    if kind == "grm" and not config.url:
        raise ValueError("reward.url: empty; the job must start the GRM app (or name one) before training")


def check_rows(spec: dict, rows: list[dict]) -> None:
    """Every row carries what the reward reads; raise ValueError naming the first missing key and row."""
    keys = ROW_KEYS[spec["kind"]]
    if spec["kind"] == "grm" and _config(spec).send_context:
        keys = (*keys, "dimension", "locale")
    for i, row in enumerate(rows):
        # a pointwise judge row has one response and one gold grade (gold_a)
        needed = [k for k in keys if not (k == "gold_b" and row.get("mode") == "pointwise")]
        for key in ("prompt_messages", *needed):
            if key not in row or row[key] is None:
                raise ValueError(f"row {i} (id {row.get('id', '?')!r}): missing {key!r}")


def build_reward(spec: dict, seed: int = 0):
    """The callable for `spec` (see the module docstring)."""
    check_reward_spec(spec)
    if spec["kind"] == "judge":
        return JudgeGroupReward(_config(spec))
    return GRMGroupReward(_config(spec), seed=seed)


def _config(spec: dict):
    cls = JudgeRewardConfig if spec["kind"] == "judge" else RewardServiceConfig
    try:
        return cls(**spec.get("config", {}))
    except TypeError as exc:
        known = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ValueError(f"reward.config: {exc} (known keys: {known})") from None
