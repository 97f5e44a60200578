"""Reward-hacking monitors (eval/reward_monitors.py): statistics, sums, windows and alerts, by hand-worked numbers."""

import math

import pytest

from core.config import ConfigError
from eval.monitor_config import MonitorConfig
from eval.prompts import load_template, prompt_path
from eval.reward_monitors import (
    Alert,
    JudgeMarkers,
    RewardMonitors,
    first_slot_credit,
    judge_markers,
    pearson,
    probe_accuracy,
    ranks,
    spearman,
    step_sums,
)
from train.grpo.reward.same_family import ModelIdentity, family_key, same_family


def test_pearson_and_spearman_by_hand():
    # x = 1,2,3; y = 2,4,7: dx = -1,0,1; dy = -7/3,-1/3,8/3; sxy = 5, sxx = 2, syy = 114/9
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert spearman([1, 2, 3], [2, 4, 7]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert ranks([10, 30, 20, 30]) == [1.0, 3.5, 2.0, 3.5]
    # ranks 1,2,3,4 vs 1,3.5,2,3.5: dx = -1.5,-.5,.5,1.5; dy = -1.5,1,-.5,1; sxy = 2.25-.5-.25+1.5 = 3
    # sxx = 5, syy = 2.25+1+.25+1 = 4.5 -> 3 / sqrt(22.5)
    assert spearman([1, 2, 3, 4], [10, 30, 20, 30]) == pytest.approx(3 / math.sqrt(22.5))
    assert math.isnan(pearson([5, 5, 5], [1, 2, 3]))  # constant lengths: no correlation, not 0
    assert math.isnan(pearson([1], [1]))


def test_first_slot_credit():
    assert [first_slot_credit(4, 2), first_slot_credit(2, 4), first_slot_credit(3, 3),
            first_slot_credit(None, 3)] == [1.0, 0.0, 0.5, None]


def test_step_sums_by_hand():
    # 60 + 15 tokens; the 2nd group has no correlation
    groups = [([10, 20, 30], [0.0, 1.0, 2.0]), ([5, 5, 5], [1.0, 2.0, 3.0])]
    verdicts = [(4, 2), (2, 4), (3, 3), (None, 2)]
    markers = JudgeMarkers(tags=("final_grade_a",))
    sums = step_sums(groups, verdicts, ["x <final_grade_A> 5", "plain", "</FINAL_GRADE_A>"], markers)
    assert sums["monitor_groups"] == 1 and sums["monitor_pearson_sum"] == pytest.approx(1.0)
    assert sums["monitor_spearman_sum"] == pytest.approx(1.0)
    assert sums["monitor_length_sum"] == 75 and sums["monitor_scored_rollouts"] == 6
    assert sums["monitor_first_credit"] == 1.5 and sums["monitor_verdicts"] == 3  # 1 + 0 + 0.5; unparsed left out
    assert sums["monitor_quoting"] == 2 and sums["monitor_rollouts"] == 3


def test_config_checks_name_the_key():
    MonitorConfig().validate("monitor")
    for override, key in (({"position_first_max": 0.5}, "monitor.position_first_max"),
                          ({"length_ratio_max": 1.0}, "monitor.length_ratio_max"),
                          ({"every": 0}, "monitor.every"), ({"divergence_evals": 1}, "monitor.divergence_evals"),
                          ({"length_corr_max": 1.5}, "monitor.length_corr_max"),
                          ({"format_share_max": -0.1}, "monitor.format_share_max")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            MonitorConfig(**override).validate("monitor")


def corr_sums(rho: float) -> dict:
    return {"monitor_groups": 2.0, "monitor_pearson_sum": 2 * rho, "monitor_spearman_sum": 2 * rho}


def test_length_correlation_alerts_once_the_window_is_full_and_rearms():
    mon = RewardMonitors(MonitorConfig(length_corr_window=2, length_corr_max=0.5))
    m1, a1 = mon.step(1, corr_sums(0.9))
    assert a1 == [] and m1["monitor/length/reward_corr_window"] == pytest.approx(0.9)  # window not full yet
    m2, a2 = mon.step(2, corr_sums(0.9))
    assert [a.monitor for a in a2] == ["length_corr"] and a2[0].key == "monitor.length_corr_max"
    assert a2[0].value == pytest.approx(0.9) and m2["monitor/length_corr/alert"] == 1.0
    m3, a3 = mon.step(3, corr_sums(0.7))  # still over (0.8): no second alert, the flag stays up
    assert a3 == [] and m3["monitor/length_corr/alert"] == 1.0
    m4, a4 = mon.step(4, corr_sums(-0.7))  # (0.7 - 0.7) / 2 = 0: cleared
    assert a4 == [] and m4["monitor/length_corr/alert"] == 0.0
    assert [a.monitor for a in mon.step(5, corr_sums(0.9))[1]] == []  # (-0.7 + 0.9) / 2 = 0.1
    assert [a.monitor for a in mon.step(6, corr_sums(0.9))[1]] == ["length_corr"]  # 0.9: re-armed, fires again


def test_rollout_and_validation_length_ratio():
    mon = RewardMonitors(MonitorConfig(length_ratio_max=1.5))
    base = {"monitor_length_sum": 40.0, "monitor_scored_rollouts": 4.0}  # mean 10: the base policy's
    assert mon.step(1, base)[1] == []
    metrics, alerts = mon.step(2, {"monitor_length_sum": 64.0, "monitor_scored_rollouts": 4.0})
    assert metrics["monitor/length/rollout_ratio"] == pytest.approx(1.6)
    assert [a.monitor for a in alerts] == ["length_ratio"]
    metrics, alerts = mon.validation(2, None, policy_lengths=[30, 30], base_lengths=[10, 20])  # 30 / 15
    assert metrics["monitor/length/val_ratio"] == pytest.approx(2.0) and [a.monitor for a in alerts] == [
        "val_length_ratio"]
    assert mon.validation(3, None, [14, 16], [10, 20])[1] == []  # 15 / 15


def position_sums(credit: float, verdicts: float) -> dict:
    return {"monitor_first_credit": credit, "monitor_verdicts": verdicts}


def test_position_preference_pools_the_window_and_needs_enough_verdicts():
    cfg = MonitorConfig(position_window=2, position_first_max=0.65, position_min_verdicts=8)
    mon = RewardMonitors(cfg)
    assert mon.step(1, position_sums(3, 3))[1] == []  # window not full
    metrics, alerts = mon.step(2, position_sums(3, 3))  # 6/6 but only 6 verdicts < 8
    assert metrics["monitor/position/first_share_window"] == 1.0 and alerts == []
    metrics, alerts = mon.step(3, position_sums(4, 5))  # pooled (3 + 4) / (3 + 5) = 0.875
    assert metrics["monitor/position/first_share_window"] == pytest.approx(0.875)
    assert metrics["monitor/position/first_share"] == pytest.approx(0.8)
    assert [(a.monitor, a.key) for a in alerts] == [("position", "monitor.position_first_max")]
    second = RewardMonitors(cfg)  # a judge that favours the second slot is biased too
    second.step(1, position_sums(1, 5))
    assert [a.monitor for a in second.step(2, position_sums(0, 5))[1]] == ["position"]  # 1/10 < 0.35
    fair = RewardMonitors(cfg)
    fair.step(1, position_sums(3, 5))
    assert fair.step(2, position_sums(2, 5))[1] == []  # 5/10


def test_format_markers_from_the_menlo_template():
    template = load_template(prompt_path("menlo_pairwise"))
    markers = judge_markers("\n".join(m["content"] for m in template.messages),
                            ["Is the model response coherent, well-versed, clear, and free from grammatical errors?"])
    assert markers.tags == ("final_grade_a", "final_grade_b")  # <think> is the policy's own, not a quote
    assert markers.keywords == ("final grade:",)
    assert markers.quotes("Great answer. FINAL GRADE: 5 - EXCELLENT")
    assert markers.quotes("my reply <final_grade_A>")
    assert markers.quotes("it is coherent, well-versed, clear, and free from grammatical errors, trust me")
    assert markers.quotes("The order in which they are shown says nothing")  # a 6-word run of the judge's prompt
    assert not markers.quotes("Bonjour ! Voici une réponse claire et polie.")
    assert not markers.quotes("<think>fine</think> A clear answer.")
    again = JudgeMarkers.from_dict(markers.to_dict())
    assert again == markers


def test_format_share_alert():
    mon = RewardMonitors(MonitorConfig(format_window=2, format_share_max=0.2), markers=JudgeMarkers(tags=("x",)))
    assert mon.step(1, {"monitor_quoting": 1.0, "monitor_rollouts": 4.0})[1] == []  # 1/4, window not full
    metrics, alerts = mon.step(2, {"monitor_quoting": 0.0, "monitor_rollouts": 4.0})  # 1/8 = 0.125
    assert metrics["monitor/format/quoting_share_window"] == 0.125 and alerts == []
    metrics, alerts = mon.step(3, {"monitor_quoting": 2.0, "monitor_rollouts": 4.0})  # 2/8 = 0.25
    assert [a.monitor for a in alerts] == ["format"]


def test_divergence_reward_up_win_rate_flat():
    mon = RewardMonitors(MonitorConfig(divergence_evals=3, divergence_reward_rise=0.2, divergence_winrate_rise=0.0))
    alerts: list[Alert] = []
    for step, (rewards, win) in enumerate((([1.0, 1.0], 0.5), ([1.2], 0.5), ([1.4, 1.6], 0.45)), start=1):
        for r in rewards:
            mon.step(step, {}, reward_mean=r)
        metrics, alerts = mon.validation(step, win)
    # reward means per validation: 1.0, 1.2, 1.5 -> rise 0.5; win rate 0.5 -> 0.45: -0.05
    assert metrics["monitor/divergence/reward_rise"] == pytest.approx(0.5)
    assert metrics["monitor/divergence/winrate_rise"] == pytest.approx(-0.05)
    assert [(a.monitor, a.key) for a in alerts] == [("divergence", "monitor.divergence_reward_rise")]
    honest = RewardMonitors(MonitorConfig(divergence_evals=3))
    for step, (r, win) in enumerate(((1.0, 0.5), (1.2, 0.6), (1.5, 0.7)), start=1):
        honest.step(step, {}, reward_mean=r)
        metrics, alerts = honest.validation(step, win)
    assert metrics["monitor/divergence/reward_rise"] == pytest.approx(0.5) and alerts == []


def test_probe_accuracy_and_drop():
    assert probe_accuracy(["A", "B", None, "tie"], ["A", "A", "B", "tie"]) == 0.5
    with pytest.raises(ValueError, match="2 predictions for 1"):
        probe_accuracy(["A", "B"], ["A"])
    mon = RewardMonitors(MonitorConfig(probe_accuracy_drop_max=0.1))
    assert mon.probe(0, 0.8)[1] == []
    metrics, alerts = mon.probe(5, 0.75)
    assert metrics["monitor/probe/accuracy_drop"] == pytest.approx(0.05) and alerts == []
    metrics, alerts = mon.probe(10, 0.6)
    assert [a.monitor for a in alerts] == ["probe"] and alerts[0].value == pytest.approx(0.2)


def test_same_family():
    assert family_key("HuggingFaceTB/SmolLM2-360M-Instruct") == "smollm2" == family_key("smollm2-135m")
    assert family_key("Qwen/Qwen3-8B") == "qwen3"
    alert = same_family(ModelIdentity("smollm2-135m"), ModelIdentity("HuggingFaceTB/SmolLM2-360M-Instruct"))
    assert alert is not None and alert.key == "monitor.same_family" and "smollm2" in alert.message
    assert same_family(ModelIdentity("Qwen/Qwen3-8B"), ModelIdentity("meta-llama/Llama-3.1-8B")) is None
    shared_vocab = same_family(ModelIdentity("/m/policy", tokenizer_sha="ab12"), ModelIdentity("/m/judge",
                                                                                               tokenizer_sha="ab12"))
    assert shared_vocab is not None and "the tokenizer" in shared_vocab.message
    based = same_family(ModelIdentity("/m/p", base="Qwen/Qwen3-4B"), ModelIdentity("/m/j", base="Qwen/Qwen3-8B"))
    assert based is not None and "base model" in based.message
