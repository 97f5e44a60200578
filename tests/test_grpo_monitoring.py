"""The reward-hacking monitors' wiring without Ray: the served judge's per-order grades reach the outcome, the
worker's samples become the monitors' sums, alerts go to the log, W&B and the alerts file, and policy_grpo puts
the monitor section and the judge's markers into the reward spec."""

import json
import logging
from pathlib import Path

import pytest

import jobs.policy.grpo as job
from actors.engines.base import Completion
from core.config import load_config
from eval.reward_monitors import JudgeMarkers
from serve.rewards import group_response, plan_pairs, read_judgment
from train.grpo.monitoring import LoopMonitors, read_alerts, sample_groups
from train.grpo.reward.client import parse_group_body

REPO = Path(__file__).resolve().parents[1]
GRADES = "<think>x</think><final_grade_A> FINAL GRADE: {} - X </final_grade_A><final_grade_B> FINAL GRADE: {} - X " \
         "</final_grade_B>"


def completion(text: str) -> Completion:
    return Completion(text=text, raw_text=text, finish_reason="stop", prompt_tokens=1, completion_tokens=1)


def test_the_served_group_response_carries_the_per_order_verdicts():
    # 3 responses, all pairs: (1, 0), (0, 2), (2, 1); the judge gives the first slot 4 and the second 2, except
    # one unparseable judgment, which is no verdict
    pairs = plan_pairs(3, "all_pairs")
    texts = [GRADES.format(4, 2), GRADES.format(4, 2), "no grades"]
    judgments = [read_judgment(a, b, completion(t)) for (a, b), t in zip(pairs, texts)]
    body = json.loads(group_response("all_pairs", 3, judgments, [completion(t) for t in texts], "m").model_dump_json())
    outcome = parse_group_body(body, 3, "margin")
    assert outcome.ok and outcome.verdicts == [(4, 2), (4, 2)]
    # a body from a server that returns no judgments still parses, with no verdicts
    del body["judgments"]
    assert parse_group_body(body, 3, "margin").verdicts == []


def samples_of(groups: list[tuple[list[int], list[float], str, list]]) -> list[dict]:
    samples = []
    for g, (tokens, rewards, error, verdicts) in enumerate(groups):
        for i, (t, r) in enumerate(zip(tokens, rewards)):
            samples.append({"prompt_id": str(g), "completion": f"text {g} {i}", "reward": r, "error": error,
                            "group": g, "tokens": t, **({"verdicts": verdicts} if i == 0 else {})})
    return samples


def test_sample_groups_keeps_scored_groups_and_every_verdict():
    samples = samples_of([([3, 5], [0.0, 1.0], "", [(4, 2)]),
                          ([2, 2], [float("nan"), float("nan")], "null_rewards", [(3, 1)])])
    groups, verdicts = sample_groups(samples)
    assert groups == [([3, 5], [0.0, 1.0])] and verdicts == [(4, 2), (3, 1)]


class FakeRun:
    def __init__(self):
        self.alerts = []

    def alert(self, title, text, level):
        self.alerts.append((title, text, level))


def test_loop_monitors_raise_to_the_log_wandb_and_the_alerts_file(tmp_path, caplog):
    path = tmp_path / "run" / "monitor_alerts.jsonl"
    spec = {"monitor": {"config": {"position_window": 1, "position_min_verdicts": 2, "every": 2},
                        "markers": JudgeMarkers(tags=("final_grade_a",)).to_dict(), "alerts_path": str(path)}}
    run = FakeRun()
    mon = LoopMonitors.build(spec, rank=0, tracker=run)
    calls = []

    def reduce_sums(sums):  # one worker: the all-reduce is the identity; counted to show it runs only when due
        calls.append(sums)
        return sums

    samples = samples_of([([3, 5, 7], [0.0, 1.0, 2.0], "", [(5, 1), (4, 2), (5, 3)])])
    assert mon.step(3, samples, {"reward/mean": 1.0}, reduce_sums) == {} and calls == []  # every 2: not due
    with caplog.at_level(logging.WARNING, logger="quorum.grpo.monitor"):
        metrics = mon.step(2, samples, {"reward/mean": 1.0}, reduce_sums)
    assert len(calls) == 1 and metrics["monitor/position/first_share"] == 1.0
    assert metrics["monitor/length/reward_corr_spearman"] == pytest.approx(1.0)
    assert metrics["monitor/format/quoting_share"] == 0.0
    assert [a[0] for a in run.alerts] == ["quorum monitor: position"] and run.alerts[0][2] == "WARN"
    assert "monitor.position_first_max" in caplog.text
    assert [a["monitor"] for a in read_alerts(path)] == ["position"]
    # rank 1 computes the same state but raises nothing
    other = LoopMonitors.build(spec, rank=1, tracker=None)
    other.step(2, samples, {}, lambda s: s)
    assert [a["monitor"] for a in read_alerts(path)] == ["position"]
    # validation: the policy's answers twice the base model's length (tokens = words here)
    answers = [{"answer": "a b c d", "baseline_answer": "a b"}, {"answer": "x"}]  # the 2nd has no baseline
    val = mon.validation(2, answers, lambda text: len(text.split()), {}, lambda s: s)
    assert val["monitor/length/val_ratio"] == 2.0
    assert [a["monitor"] for a in read_alerts(path)] == ["position", "val_length_ratio"]
    assert LoopMonitors.build({"kind": "grm"}, 0) is None
    assert LoopMonitors.build({"monitor": {"config": {"enabled": False}}}, 0) is None


def test_policy_grpo_puts_the_monitors_into_the_reward_spec(tmp_path):
    cfg = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml",
                      [f"run.root={tmp_path}", "reward.url=http://judge.internal:8000"])
    with job.served_reward(cfg) as (spec, _):
        monitor = spec["monitor"]
    assert monitor["config"]["every"] == 1 and monitor["config"]["position_window"] == 3
    markers = JudgeMarkers.from_dict(monitor["markers"])
    # configs/grm.yaml's pairwise template (menlo_pairwise) and the MENLO rubrics
    assert markers.tags == ("final_grade_a", "final_grade_b") and markers.keywords == ("final grade:",)
    assert markers.quotes("Is the model response coherent, well-versed, clear, and free from grammatical errors?")
    off = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml",
                      [f"run.root={tmp_path}", "reward.url=http://judge.internal:8000", "monitor.enabled=false"])
    with job.served_reward(off) as (spec, _):
        assert "monitor" not in spec


def test_same_family_warning_at_start(tmp_path, caplog):
    cfg = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml", [f"run.root={tmp_path}"])
    run = FakeRun()
    with caplog.at_level(logging.WARNING, logger="quorum.grpo.monitor"):
        (alert,) = job.same_family_check(cfg, type("T", (), {"run": run})())
    assert alert["monitor"] == "same_family" and "smollm2" in alert["message"]  # SmolLM2 judging SmolLM2
    assert run.alerts and "self-preference" in caplog.text
    other = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml",
                        [f"run.root={tmp_path}", "grpo.model=hf:Qwen/Qwen3-0.6B"])
    assert job.same_family_check(other, None) == []
    external = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml",
                           [f"run.root={tmp_path}", "reward.url=http://judge.internal:8000"])
    assert job.same_family_check(external, None) == []  # the judge behind the URL is not known here


def test_divergence_reads_the_judges_own_grade_not_a_margin_reward():
    # margins sum to 0 in every group (reward/mean 0 throughout); the own grade rose 2 -> 3 at a flat win rate
    spec = {"monitor": {"config": {"divergence_evals": 2, "divergence_reward_rise": 0.5}}}
    mon = LoopMonitors.build(spec, rank=1)
    for step, grade in ((1, 2.0), (2, 3.0)):
        mon.step(step, [], {"reward/mean": 0.0, "reward/grm_mean_grade": grade}, lambda s: s)
        metrics = mon.validation(step, [], len, {"val/vs_baseline/score": 0.5}, lambda s: s)
    assert metrics["monitor/divergence/reward_rise"] == 1.0 and metrics["monitor/divergence/alert"] == 1.0
    margin_only = LoopMonitors.build(spec, rank=1)
    for step in (1, 2):
        margin_only.step(step, [], {"reward/mean": 0.0}, lambda s: s)
        metrics = margin_only.validation(step, [], len, {"val/vs_baseline/score": 0.5}, lambda s: s)
    assert metrics["monitor/divergence/reward_rise"] == 0.0 and metrics["monitor/divergence/alert"] == 0.0


def test_a_restarted_worker_keeps_the_base_policys_length(tmp_path):
    spec = {"monitor": {"config": {"length_ratio_max": 1.5}, "alerts_path": str(tmp_path / "run" / "alerts.jsonl")}}
    base = samples_of([([10, 10], [0.0, 0.0], "", [])])
    first = LoopMonitors.build(spec, rank=0)
    assert first.step(1, base, {}, lambda s: s)["monitor/length/rollout_ratio"] == 1.0
    assert json.loads((tmp_path / "run" / "monitor_anchors.json").read_text())["base_length"] == 10.0
    # Ray Train restarts the workers from a checkpoint of a policy that already answers at twice the length: the
    # ratio is still against the base policy's 10 tokens, and the alert fires
    restarted = LoopMonitors.build(spec, rank=0)
    metrics = restarted.step(3, samples_of([([20, 20], [0.0, 0.0], "", [])]), {}, lambda s: s)
    assert metrics["monitor/length/rollout_ratio"] == 2.0 and metrics["monitor/length_ratio/alert"] == 1.0
    assert [a["monitor"] for a in read_alerts(tmp_path / "run" / "alerts.jsonl")] == ["length_ratio"]
    fresh = LoopMonitors.build({"monitor": {"config": {}}}, rank=0)  # no run folder: measured anew
    assert fresh.step(1, samples_of([([20, 20], [0.0, 0.0], "", [])]), {}, lambda s: s)[
        "monitor/length/rollout_ratio"] == 1.0
