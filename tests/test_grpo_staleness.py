"""Bounded staleness of GRPO rollouts (train.grpo.staleness, ``grpo.rollout.max_staleness``): the order of a step's
work, the policy each batch comes from and the staleness counter.

A scripted policy (a version number the update bumps), rollout engine and judge stand at the edge of the world;
the pipeline, `start_rollouts` / `collect_rewards` and `GRMGroupReward`'s thread pool are the real code. The judge
holds back the answer to each step's last group until the next step's generation starts, or `hold_s` passes: with
``max_staleness: 1`` the answer comes as soon as the next step starts generating (early); on-policy it comes only
after `hold_s` (the step waits), and the next step's generation starts after it.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from core.config import ConfigError
from train.config import GRPOConfig, RolloutSection
from train.grpo.batch import GroupOutcome
from train.grpo.overlap import start_rollouts
from train.grpo.staleness import StepPipeline

G, PROMPTS = 2, 3


class World:
    """The policy, rollout engine, judge and an ordered log of what happened (sequence, event, step, detail)."""

    def __init__(self, hold_s: float):
        self.version = 0  # GRPO updates applied to the training policy
        self.synced = -1  # the version the rollout engine samples with
        self.hold_s = hold_s
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self.log: list[tuple[int, str, int, int]] = []
        self.generating: dict[int, threading.Event] = {}
        self.pool = ThreadPoolExecutor(max_workers=4)
        self.cfg = SimpleNamespace(overlap=True)

    def record(self, event: str, step: int, detail: int = -1) -> None:
        with self._lock:
            self.log.append((next(self._seq), event, step, detail))

    def started(self, step: int) -> threading.Event:
        with self._lock:
            return self.generating.setdefault(step, threading.Event())

    def seq(self, event: str, step: int) -> int:
        (found,) = [s for s, e, st, _ in self.log if e == event and st == step]
        return found

    # -- the caller's callables

    def sync(self) -> None:
        self.synced = self.version
        self.record("sync", self.version)

    def launch(self, step: int):
        self.record("generate", step, self.synced)  # the policy version that samples this step
        self.started(step).set()
        rows = [{"step": step, "group": g} for g in range(PROMPTS)]

        def generate(prompts, first):
            return [[step, self.synced, first + i, j] for i in range(len(prompts)) for j in range(G)], [True] * (
                len(prompts) * G)

        flight = start_rollouts(generate, lambda ids: [" ".join(map(str, r)) for r in ids], self, rows,
                                [[g] for g in range(PROMPTS)], G, per_call=1, overlap=True)
        return flight, {"generated_by": self.synced}

    def behaviour(self, batch) -> int:
        self.record("behaviour", batch.step, self.version)
        return self.version  # "log-probs" of the policy as it is now

    def update(self, step: int) -> None:
        self.record("update", step, self.version)
        self.version += 1

    # -- the judge (a served reward's `submit`)

    def submit(self, rows: list[dict], groups: list[list[str]]) -> list[Future]:
        return [self.pool.submit(self.judge, row, texts) for row, texts in zip(rows, groups)]

    def judge(self, row: dict, texts: list[str]) -> GroupOutcome:
        if row["group"] == PROMPTS - 1:  # the step's last group: answered late unless the next step starts
            self.started(row["step"] + 1).wait(self.hold_s)
        self.record("answer", row["step"], row["group"])
        return GroupOutcome(rewards=[float(len(t)) for t in texts])


def run(max_staleness: int, total: int = 4, start: int = 0, hold_s: float = 0.5):
    world = World(hold_s)
    world.version = start  # a resumed attempt: `start` updates already applied
    pipe = StepPipeline(world.sync, world.launch, world.behaviour, world, max_staleness, total)
    took = []
    try:
        for step in range(start, total):
            took.append(pipe.take(step))
            world.update(step)
    finally:
        world.pool.shutdown(wait=True)
    return world, took


def last_answer(world: World, step: int) -> int:
    return max(s for s, e, st, d in world.log if e == "answer" and st == step)


def test_with_staleness_one_the_next_steps_generation_starts_before_the_last_answer():
    world, took = run(max_staleness=1)
    for step in range(3):
        assert world.seq("generate", step + 1) < last_answer(world, step), world.log
        # and the update of step t comes after its last answer, the next batch's behaviour log-probs before it
        assert world.seq("behaviour", step + 1) < world.seq("update", step)
        assert last_answer(world, step) < world.seq("update", step)
    assert [t.staleness for t in took] == [0, 1, 1, 1]
    # every step trains on rewards of its own rollouts, in prompt order
    assert [[o.rewards for o in t.got.outcomes] for t in took] == [
        [[float(len(s)) for s in t.got.texts[g * G:(g + 1) * G]] for g in range(PROMPTS)] for t in took]


def test_on_policy_the_next_generation_waits_for_the_update():
    world, took = run(max_staleness=0)
    for step in range(3):
        assert last_answer(world, step) < world.seq("update", step) < world.seq("generate", step + 1), world.log
    assert [t.staleness for t in took] == [0, 0, 0, 0]
    assert all(t.batch.behaviour is None for t in took)
    assert [d for _, e, _, d in world.log if e == "generate"] == [0, 1, 2, 3]  # each step sampled by its own θ_t


def test_a_stale_batch_comes_from_the_policy_before_the_previous_update():
    world, took = run(max_staleness=1)
    for t in took:
        # generated by θ_version, behaviour log-probs of that same θ, trained on θ_step
        assert t.batch.extra["generated_by"] == t.batch.version == t.batch.step - t.staleness
        if t.staleness:
            assert t.batch.behaviour == t.batch.version
    # the rollout engine was synced with θ_t before it sampled step t + 1 (vLLM: the adapter of the last update)
    for step in range(3):
        assert world.seq("update", step - 1) < world.seq("sync", step) < world.seq("generate", step + 1) if step else (
            world.seq("sync", 0) < world.seq("generate", 1))
    assert [d for _, e, _, d in world.log if e == "generate"] == [0, 0, 1, 2]


def test_the_last_step_generates_nothing_ahead_and_a_resumed_attempt_starts_on_policy():
    world, took = run(max_staleness=1, total=5, start=2)
    assert [t.batch.step for t in took] == [2, 3, 4]
    assert [t.staleness for t in took] == [0, 1, 1]  # the pending batch is not checkpointed
    assert sorted(st for _, e, st, _ in world.log if e == "generate") == [2, 3, 4]
    assert took[0].generated_tokens == 2 * PROMPTS * G * 4 and took[-1].generated_tokens == 0
    assert took[-1].generate_s == 0.0 and took[-1].behaviour_s == 0.0


def test_the_knob_is_validated():
    assert GRPOConfig().rollout.max_staleness == 0  # off by default: the paper's on-policy update
    RolloutSection(max_staleness=1).validate("grpo.rollout")
    for bad in (2, -1, True, "1", 0.5):
        with pytest.raises(ConfigError, match=r"grpo\.rollout\.max_staleness"):
            RolloutSection(max_staleness=bad).validate("grpo.rollout")
    with pytest.raises(ValueError, match="max_staleness"):
        StepPipeline(lambda: None, lambda s: None, lambda b: None, None, 2, 3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_grpo_run_one_step_off_policy_trains_on_behaviour_log_probs(ray_local, tiny_model_dir, tmp_path):
    """Real GRPO (Ray Train, DeepSpeed, LoRA, hf rollouts, MENLO's local judge reward) with max_staleness 1: it
    completes, logs grpo/staleness 0 then 1 and counts the off-policy steps. With one pass per step the PPO ratio of
    an on-policy step is exactly 1 (approx_kl 0); a stale step's "old" log-probs are the previous policy's, taken
    before the update, so once the entropy bonus has moved the LoRA its ratio is not 1."""
    from train.grpo.trainer import run_grpo

    rows = [{"id": f"r{i}", "prompt_messages": [{"role": "user", "content": f"Compare answers {i} and {i + 1}."}],
             "gold_a": 4, "gold_b": 2} for i in range(4)]
    cfg = GRPOConfig(model=tiny_model_dir, num_workers=1, group_size=2, prompts_per_step=2, micro_batch_size=4,
                     max_steps=3, max_prompt_length=48, max_completion_length=4, lr=0.05, weight_decay=0.0,
                     entropy_coef=0.05, num_iterations=1, checkpoint_every=1, keep_checkpoints=3,
                     system_instruction="Judge.", rollout=RolloutSection(max_staleness=1))
    result = run_grpo(cfg, rows, {"kind": "judge", "config": {}}, run_dir=str(tmp_path / "run"))
    steps = {m["step"]: m for m in result.history}
    assert sorted(steps) == [1, 2, 3]
    assert [steps[s]["grpo/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert [steps[s]["grpo/off_policy_steps"] for s in (1, 2, 3)] == [0.0, 1.0, 2.0]
    assert steps[1]["approx_kl"] == 0.0 and steps[1]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert steps[3]["approx_kl"] > 0.0  # the behaviour policy is not the one being updated
    assert all(steps[s]["updates_skipped"] == 0 for s in steps) and result.adapter_dir
