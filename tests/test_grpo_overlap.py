"""Rewards that overlap rollouts (train.grpo.overlap): the order of events and identical outcomes either way.

The rollout engine and the reward service's transport are scripted (the edge of the world); everything between
them is the real code: `rollout_and_reward`, `GRMGroupReward`'s thread pool, `GroupRewardClient`'s retries and
body parsing, `outcome_advantages`.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
from test_vllm_rollout import RecordingLLM, fake_vllm  # noqa: F401 (the fake vllm module fixture)

from core.config import ConfigError
from train.config import GRPOConfig, RolloutSection
from train.grpo.batch import outcome_advantages
from train.grpo.overlap import generation_calls, reward_overlaps, rollout_and_reward
from train.grpo.reward.build import GRMGroupReward, JudgeGroupReward
from train.grpo.reward.client import GroupRewardClient, RewardServiceAuthError, RewardServiceConfig
from train.grpo.reward.judge_training import JudgeRewardConfig
from train.grpo.rollout_vllm import VLLMRollout

G = 4


class Events:
    """A log of (sequence number, event) shared by the scripted engine and transport."""

    def __init__(self):
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.log: list[tuple[int, str, int]] = []
        self.sent = {}

    def record(self, kind: str, index: int) -> None:
        with self._lock:
            self.log.append((next(self._counter), kind, index))
            if kind == "sent":
                self.sent.setdefault(index, threading.Event()).set()

    def sent_event(self, index: int) -> threading.Event:
        with self._lock:
            return self.sent.setdefault(index, threading.Event())

    def seq(self, kind: str, index: int) -> int:
        return min(s for s, k, i in self.log if k == kind and i == index)


class ScriptedEngine:
    """Completions that are a function of (prompt, sample): token ids prompt_id*100 + j. Before returning a call
    it gives each earlier group's request up to `wait_s` to be sent (never needed for correctness: it only makes
    the overlapped order observable without a race)."""

    def __init__(self, events: Events, wait_s: float):
        self.events, self.wait_s, self.calls = events, wait_s, []

    def generate(self, prompts: list[list[int]], first: int):
        self.calls.append((first, len(prompts)))
        for earlier in range(first):
            self.events.sent_event(earlier).wait(self.wait_s)
        ids = [[p[0] * 100 + j, p[0] * 100 + j + 1] for p in prompts for j in range(G)]
        for g in range(first, first + len(prompts)):
            self.events.record("generated", g)
        return ids, [j % 2 == 0 for j in range(len(ids))]


def decode(ids: list[list[int]]) -> list[str]:
    return [" ".join(map(str, row)) for row in ids]


class ScriptedTransport:
    """A /reward/group service: each response graded by a hash of its text; `fail_first` groups answer 503 once;
    `status` forces every answer (401 = bad token)."""

    def __init__(self, events: Events, fail_first: tuple[int, ...] = (), status: int = 200):
        self.events, self.fail_first, self.status = events, set(fail_first), status
        self._lock = threading.Lock()

    def post(self, body: dict):
        group = int(body["prompt"].split()[-1])
        self.events.record("sent", group)
        if self.status != 200:
            return self.status, {"error": {"message": "no"}}, ""
        with self._lock:
            if group in self.fail_first:
                self.fail_first.discard(group)
                return 503, {"error": {"message": "busy"}}, ""
        grades = [int(hashlib.sha256(r.encode()).hexdigest(), 16) % 7 + 1 for r in body["responses"]]
        mean = sum(grades) / len(grades)
        items = [{"mean_grade": float(g)} for g in grades]
        return 200, {"rewards": [g - mean for g in grades], "items": items, "counts": {}}, ""

    def close(self) -> None:
        return None


def served_reward(events: Events, overlap: bool, **transport) -> GRMGroupReward:
    cfg = RewardServiceConfig(url="http://127.0.0.1:9", overlap=overlap, backoff_s=0.0, concurrency=2,
                              send_context=False)
    reward = GRMGroupReward(cfg)
    reward.client.close()
    reward.client = GroupRewardClient(cfg, sleep=lambda s: None, transport=ScriptedTransport(events, **transport))
    return reward


def step(overlap: bool, per_call: int, n_prompts: int = 5, wait_s: float = 5.0, **transport):
    events = Events()
    engine = ScriptedEngine(events, wait_s)
    reward = served_reward(events, overlap, **transport)
    rows = [{"judge_prompt": f"prompt {g}"} for g in range(n_prompts)]
    prompts = [[g, 7, 8] for g in range(n_prompts)]
    try:
        got = rollout_and_reward(engine.generate, decode, reward, rows, prompts, G, per_call,
                                 reward_overlaps(reward))
    finally:
        reward.close()
    return got, events, engine


@pytest.mark.parametrize("per_call", [1, 2])
def test_each_groups_request_is_sent_before_the_next_call_finishes(per_call):
    got, events, engine = step(overlap=True, per_call=per_call)
    assert engine.calls == [(s.start, s.stop - s.start) for s in generation_calls(5, per_call)]
    for g in range(4):
        last_of_call = (g // per_call + 1) * per_call - 1  # the group whose call ends with g's
        if last_of_call + 1 < 5:
            assert events.seq("sent", g) < events.seq("generated", last_of_call + 1), events.log
    assert [o.ok for o in got.outcomes] == [True] * 5


def test_without_overlap_every_request_waits_for_the_last_rollout():
    got, events, _ = step(overlap=False, per_call=1, wait_s=0.2)
    last_generated = events.seq("generated", 4)
    assert all(events.seq("sent", g) > last_generated for g in range(5)), events.log
    assert got.reward_hidden_s == 0.0 and got.reward_span_s == got.reward_wait_s


def test_overlap_changes_nothing_but_the_clock():
    """Same rollouts, same rewards, same advantages, with and without overlap, for each call size."""
    results = {}
    for per_call in (0, 1, 2):
        for overlap in (False, True):
            got, _, _ = step(overlap=overlap, per_call=per_call, wait_s=0.05)
            adv, valid = outcome_advantages(got.outcomes, G, normalize_std=True)
            results[per_call, overlap] = got, adv, valid
    reference, ref_adv, ref_valid = results[0, False]
    assert len(set(map(tuple, (o.rewards for o in reference.outcomes)))) > 1  # the script tells groups apart
    for got, adv, valid in results.values():
        assert got.completions == reference.completions and got.finished == reference.finished
        assert got.texts == reference.texts
        assert [o.rewards for o in got.outcomes] == [o.rewards for o in reference.outcomes]
        assert [o.components for o in got.outcomes] == [o.components for o in reference.outcomes]
        assert torch.equal(adv, ref_adv) and torch.equal(valid, ref_valid)


def test_retries_and_failures_keep_the_clients_semantics():
    got, _, _ = step(overlap=True, per_call=1, fail_first=(1, 3))
    assert [o.attempts for o in got.outcomes] == [1, 2, 1, 2, 1]
    assert all(o.ok for o in got.outcomes)
    with pytest.raises(RewardServiceAuthError):
        step(overlap=True, per_call=2, wait_s=0.05, status=401)
    got, _, _ = step(overlap=True, per_call=2, wait_s=0.05, status=400)
    assert [o.error.split(":")[0] for o in got.outcomes] == ["http_400"] * 5 and not any(o.ok for o in got.outcomes)


def test_a_local_reward_is_scored_call_by_call():
    reward = JudgeGroupReward(JudgeRewardConfig())
    assert not reward_overlaps(reward)
    rows = [{"gold_a": 4, "gold_b": 2}, {"gold_a": 1, "gold_b": 5}]
    events = Events()
    engine = ScriptedEngine(events, 0.0)
    on = rollout_and_reward(engine.generate, decode, reward, rows, [[0], [1]], G, 1, overlap=True)
    off = rollout_and_reward(engine.generate, decode, reward, rows, [[0], [1]], G, 1, overlap=False)
    assert [o.rewards for o in on.outcomes] == [o.rewards for o in off.outcomes]


def test_an_engine_that_returns_the_wrong_count_is_refused():
    def short(prompts, first):
        return [[1]], [True]

    with pytest.raises(RuntimeError, match="returned 1 completions for 2 prompts x 4"):
        rollout_and_reward(short, decode, JudgeGroupReward(JudgeRewardConfig()), [{}, {}], [[0], [1]], G, 0, True)


def test_calls_and_config_keys():
    assert generation_calls(0, 2) == []
    with pytest.raises(ValueError):
        generation_calls(3, -1)
    assert RewardServiceConfig().overlap is True
    assert GRPOConfig().rollout.prompts_per_generate == 0
    with pytest.raises(ConfigError, match="reward.overlap"):
        RewardServiceConfig(url="http://x:1", overlap="yes").validate("reward")
    with pytest.raises(ConfigError, match="grpo.rollout.prompts_per_generate"):
        RolloutSection(prompts_per_generate=-1).validate("grpo.rollout")
    with pytest.raises(ConfigError, match="grpo.rollout.prompts_per_generate"):
        RolloutSection(prompts_per_generate=1.5).validate("grpo.rollout")


def test_vllm_rollouts_sample_with_the_same_seeds_whatever_the_call_size(fake_vllm, monkeypatch, tmp_path):  # noqa: F811
    """Prompt i of a step samples with seed * 1000 + i in one call or in several (`first`)."""
    seeds: list[int] = []

    class SeedRecordingLLM(RecordingLLM):
        def generate(self, prompts, params, lora_request=None, use_tqdm=True):
            seeds.extend(p["seed"] for p in params)
            return super().generate(prompts, params, lora_request, use_tqdm)

    monkeypatch.setattr(sys.modules["vllm"], "LLM", SeedRecordingLLM)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    cfg = GRPOConfig(rollout=RolloutSection(kind="vllm"), use_gpu=True, group_size=2)
    rollout = VLLMRollout(SimpleNamespace(pad_token_id=0, eos_token_id=0), cfg, "/m", str(tmp_path), 0,
                          sleep_mode=False)
    rollout.version = 1
    prompts = [[1], [2], [3], [4], [5]]
    rollout.generate(None, prompts, 2, seed=3)
    whole, seeds[:] = list(seeds), []
    for part in generation_calls(len(prompts), 2):
        rollout.generate(None, prompts[part], 2, seed=3, first=part.start)
    assert seeds == whole == [3000 + i for i in range(5)]
