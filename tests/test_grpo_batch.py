"""GRPO rollout bookkeeping: failed groups leave the loss, statistics, trimming (hand-worked numbers)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from train.config import GRPOConfig
from train.grpo.batch import (
    GroupOutcome,
    completion_logps,
    failed,
    finish_outcome_metrics,
    micro_batch_slices,
    outcome_advantages,
    outcome_sums,
    trim_completion,
)
from train.grpo.reward.build import JudgeGroupReward, check_reward_spec, check_rows
from train.grpo.reward.judge_training import JudgeRewardConfig


def test_failed_groups_get_zero_advantage_and_leave_the_loss():
    outcomes = [GroupOutcome(rewards=[1.0, 3.0]), failed("timeout", attempts=4), GroupOutcome(rewards=[2.0, 2.0])]
    adv, valid = outcome_advantages(outcomes, group_size=2, normalize_std=False)
    # Dr. GRPO: centred only -> [-1, 1]; failed group masked; equal rewards -> 0 but still valid
    assert adv.tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert valid.tolist() == [True, True, False, False, True, True]
    adv_std, _ = outcome_advantages(outcomes, group_size=2, normalize_std=True)
    # sample std of (1, 3) is sqrt(2): (3 - 2) / sqrt(2)
    assert adv_std[:2].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-5)


def test_a_failed_group_is_never_a_zero_reward_group():
    # all failed: nothing is valid, so nothing trains (a zero-reward group would still be "valid")
    _, valid = outcome_advantages([failed("connect"), failed("null_rewards")], group_size=3)
    assert not valid.any()


@pytest.mark.parametrize("rewards", [[1.0], [1.0, math.nan], [1.0, math.inf]])
def test_a_malformed_reward_list_is_a_bug_not_data(rewards):
    with pytest.raises(ValueError, match="group 0"):
        outcome_advantages([GroupOutcome(rewards=rewards)], group_size=2)


def test_outcome_sums_and_metrics():
    outcomes = [
        GroupOutcome(rewards=[1.0, 3.0], components={"exact_a": [1.0, 0.0]}, attempts=1, latency_s=0.5),
        GroupOutcome(rewards=[2.0, 2.0], components={"exact_a": [1.0, 1.0]}, attempts=2, latency_s=1.5),
        failed("timeout", attempts=4, latency_s=9.0),
        failed("http_400: responses[1]: too long", attempts=1, latency_s=0.1),
    ]
    metrics = finish_outcome_metrics(outcome_sums(outcomes))
    assert metrics["reward/groups"] == 4 and metrics["reward/groups_failed"] == 2
    assert metrics["reward/groups_failed_fraction"] == 0.5
    assert metrics["reward/mean"] == pytest.approx(2.0)               # (1 + 3 + 2 + 2) / 4 scored rollouts
    assert metrics["reward/std_within_group"] == pytest.approx(0.5)   # population std 1 and 0, over 2 groups
    assert metrics["reward/groups_zero_std"] == 1
    assert metrics["reward/exact_a"] == pytest.approx(0.75)
    assert metrics["reward_service/calls"] == 8 and metrics["reward_service/retries"] == 4
    assert metrics["reward_service/latency_s_mean"] == pytest.approx(11.1 / 4)
    assert metrics["reward_service/latency_s_max"] == 9.0
    assert metrics["reward_service/errors/timeout"] == 1 and metrics["reward_service/errors/http_400"] == 1


def test_all_failed_step_has_nan_reward_not_zero():
    metrics = finish_outcome_metrics(outcome_sums([failed("connect", 4, 3.0)]))
    assert math.isnan(metrics["reward/mean"]) and metrics["reward/groups_failed_fraction"] == 1.0


def test_completion_logps_score_only_completion_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 5)
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1]])
    logps, kept = completion_logps(logits, ids, mask)
    full = torch.log_softmax(logits, -1)
    assert kept.tolist() == [[False, True, True]]
    assert logps[0, 0] == 0.0
    assert logps[0, 1:].tolist() == pytest.approx([full[0, 1, 3].item(), full[0, 2, 4].item()], rel=1e-5)


def test_trim_and_micro_batches():
    assert trim_completion([7, 2, 9, 2], {2}, pad_id=0) == ([7, 2], True)
    assert trim_completion([7, 8, 0, 0], {2}, pad_id=0) == ([7, 8], False)
    assert trim_completion([], {2}, pad_id=0) == ([], False)
    assert micro_batch_slices(4, 4) == [slice(0, 4)]


def test_judge_group_reward_logs_every_component():
    ok = ("<think>x</think><final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>"
          "<final_grade_B> FINAL GRADE: 2 - MINOR FAILURE </final_grade_B>")
    (outcome,) = JudgeGroupReward(JudgeRewardConfig())([{"gold_a": 4, "gold_b": 2}], [[ok, "garbage"]])
    assert outcome.rewards == pytest.approx([3.0, -1.2])
    assert outcome.components["extract_fail"] == [0.0, 1.0] and outcome.components["format_fail"] == [0.0, 1.0]
    assert outcome.components["pref_bonus"] == [1.0, 0.0] and outcome.components["format_penalty"] == [0.0, -0.2]


@pytest.mark.parametrize("spec, message", [
    ({"kind": "bandit"}, "reward.kind"),
    ({"kind": "judge", "config": {"smoothing": 0.5}}, "reward.config"),
    ({"kind": "judge", "config": {"near_miss": -1.0}}, "near_miss"),
    ({"kind": "grm", "config": {"url": ""}}, "reward.url"),
    ({"kind": "grm", "config": {"url": "localhost:8000"}}, "reward.url"),
    ({"kind": "grm", "config": {"url": "http://h:1", "retries": -1}}, "reward.retries"),
])
def test_reward_spec_errors_name_the_key(spec, message):
    with pytest.raises(ValueError, match=message):
        check_reward_spec(spec)


def test_rows_missing_reward_fields_are_named():
    with pytest.raises(ValueError, match="row 1 .*'gold_b'"):
        check_rows({"kind": "judge"}, [{"prompt_messages": "q", "gold_a": 1, "gold_b": 2},
                                       {"id": "p2", "prompt_messages": "q", "gold_a": 1}])


@pytest.mark.parametrize("changes, message", [
    ({"group_size": 1}, "group_size"),
    ({"prompts_per_step": 3, "num_workers": 2}, "prompts_per_step"),
    ({"prompts_per_step": 2, "group_size": 3, "micro_batch_size": 4}, "micro_batch_size"),
    ({"loss_agg": "dr_grpo"}, "loss_agg"),
    ({"kl_coef": -0.1}, "kl_coef"),
])
def test_grpo_config_validation_names_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**changes).validate()


def test_grpo_config_grad_accum_follows_the_rollouts():
    cfg = GRPOConfig(group_size=8, prompts_per_step=32, num_workers=4, micro_batch_size=16)
    cfg.validate()
    assert cfg.prompts_per_worker == 8 and cfg.grad_accum == 4
    assert GRPOConfig.from_dict(dataclasses.asdict(cfg)) == cfg


def test_windowed_left_padded_logps_equal_the_full_right_padded_ones(tiny_model_dir):
    # the loop scores a left-padded batch over its trailing completion window only (logits_to_keep); the
    # completion log-probs must be those of the plain right-padded full forward
    from transformers import AutoModelForCausalLM

    from train.grpo.batch import completion_window
    from train.sequences import collate_sequences

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts, completions = [[1, 50, 60, 70, 80], [1, 90]], [[300, 301], [400, 401, 402]]

    def forward(batch, keep=None):
        extra = {"logits_to_keep": keep} if keep else {}
        with torch.no_grad():
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         position_ids=batch["position_ids"], **extra).logits

    right = collate_sequences(prompts, completions, pad_id=0, padding_side="right")
    full, full_mask = completion_logps(forward(right), right["input_ids"], right["loss_mask"])
    left = collate_sequences(prompts, completions, pad_id=0, padding_side="left")
    keep = completion_window(left["loss_mask"])
    assert keep == 4
    windowed, window_mask = completion_logps(forward(left, keep), left["input_ids"][:, -keep:],
                                             left["loss_mask"][:, -keep:])
    for row in range(2):
        torch.testing.assert_close(windowed[row][window_mask[row]], full[row][full_mask[row]], rtol=1e-4, atol=1e-5)
    assert window_mask.sum(-1).tolist() == [2, 3]


# ---------------------------------------------------------------------------------------------------------------
# Validation (train.grpo.batch / train.grpo.validate pure parts)


def test_validation_metrics_are_the_reward_means_under_val():
    from train.grpo.batch import VAL_SCORE, validation_metrics

    # two groups of 2 rollouts scored (rewards 1, 0 and 0.5, 0.5), one group failed: mean over scored rollouts
    totals = {"groups": 3.0, "groups_failed": 1.0, "rollouts_scored": 4.0, "reward_sum": 2.0,
              "component/exact_a_sum": 1.0, "groups_failed/timeout": 1.0}
    metrics = validation_metrics(totals)
    assert metrics[VAL_SCORE] == 0.5 and metrics["val/reward/exact_a"] == 0.25
    assert metrics["val/reward/groups_failed_fraction"] == pytest.approx(1 / 3)
    assert metrics["val/reward_service/errors/timeout"] == 1.0
    assert all(key.startswith("val/") for key in metrics)
    assert math.isnan(validation_metrics({"groups": 1.0, "groups_failed": 1.0})[VAL_SCORE])


def test_only_a_strictly_better_finite_score_is_a_new_best():
    from train.grpo.batch import improved

    assert improved(-1.2, None) and improved(0.1, -0.5)
    assert not improved(0.1, 0.1)  # a tie keeps the earlier adapter
    assert not improved(-0.6, -0.5) and not improved(math.nan, None) and not improved(math.nan, -1.0)


def test_baseline_answers_are_kept_on_disk_for_a_restarted_worker(tmp_path):
    from train.grpo.validate import BaselineAnswers

    rank0, rank1 = BaselineAnswers(str(tmp_path / "b"), 0), BaselineAnswers(str(tmp_path / "b"), 1)
    assert rank0.answers == {}
    rank0.add({0: "zero"})
    rank0.add({2: "two"})
    rank1.add({1: "one"})
    # a restarted worker (any rank, any world size) reads every rank's answers back
    assert BaselineAnswers(str(tmp_path / "b"), 0).answers == {0: "zero", 1: "one", 2: "two"}
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["rank0.json", "rank1.json"]


def test_validation_shards_cover_every_row_once_with_equal_lengths():
    from train.grpo.validate import validation_shard

    for n, world in ((5, 2), (4, 2), (1, 3), (7, 1)):
        shards = [validation_shard(n, rank, world) for rank in range(world)]
        assert len({len(s) for s in shards}) == 1  # same number of generate calls on every rank
        counted = sorted(i for s in shards for i, keep in s if keep)
        assert counted == list(range(n))


# ---------------------------------------------------------------------------------------------------------------
# Policy validation against the baseline (train.grpo.batch versus_*), through the GRM's real reward maths


def _served(texts: dict[int, str], pairs: list[tuple[int, int]], n: int, scheme: str, grade_of) -> dict:
    """The /reward/group body the Serve app computes (serve.rewards) when the judge grades each text grade_of(t)."""
    from actors.engines.base import Completion
    from serve import rewards as R

    judgments, completions = [], []
    for a, b in pairs:
        ga, gb = grade_of(texts[a]), grade_of(texts[b])
        completion = Completion(text="", raw_text=(f"<think>x</think><final_grade_A> FINAL GRADE: {ga} - X "
                                                   f"</final_grade_A><final_grade_B> FINAL GRADE: {gb} - X "
                                                   "</final_grade_B>"))
        judgments.append(R.read_judgment(a, b, completion))
        completions.append(completion)
    return R.group_response(scheme, n, judgments, completions, "judge").model_dump()


def test_zero_sum_margins_cannot_rank_policies_but_the_win_rate_against_the_baseline_does():
    import httpx

    from serve import rewards as R
    from train.grpo.batch import VAL_SCORE, VAL_SCORES, outcome_sums, validation_metrics, versus_metrics, versus_sums
    from train.grpo.reward.client import parse_group_response

    def grade_of(text: str) -> int:  # the judge's taste: the baseline's style earns 3, a good answer 5, a bad one 1
        return {"good": 5, "bad": 1}.get(text.split()[0], 3)

    def old_score(rollouts: list[str]) -> float:
        """Validation as it was: G rollouts, all pairs, reward = mean margin, mean over the rollouts."""
        body = _served(dict(enumerate(rollouts)), R.plan_pairs(len(rollouts), "all_pairs"), len(rollouts),
                       "all_pairs", grade_of)
        outcome = parse_group_response(httpx.Response(200, json=body), len(rollouts), "margin")
        return validation_metrics(outcome_sums([outcome]))[VAL_SCORE]

    def new_score(answers: list[str]) -> dict:
        outcomes = []
        for answer in answers:
            body = _served({0: answer, R.REFERENCE: "base answer"}, R.plan_pairs(1, "vs_reference", True), 1,
                           "vs_reference", grade_of)
            outcomes.append(parse_group_response(httpx.Response(200, json=body), 1))
        return versus_metrics(versus_sums(outcomes))

    winner, loser = ["good one", "good two", "good three"], ["bad one", "bad two", "base two"]
    # every group's margins sum to 0: the old score is 0 for the winner and the loser alike
    assert old_score(winner) == pytest.approx(0.0, abs=1e-12) and old_score(loser) == pytest.approx(0.0, abs=1e-12)
    win, lose = new_score(winner), new_score(loser)
    key = VAL_SCORES["vs_baseline"]
    # winner: 3 wins (5 vs 3 in both orders); loser: 2 losses (1 vs 3) and 1 tie (3 vs 3) -> (0 + 0.5) / 3
    assert win[key] == 1.0 and win["val/vs_baseline/win_rate"] == 1.0
    assert lose[key] == pytest.approx(1 / 6) and lose["val/vs_baseline/loss_rate"] == pytest.approx(2 / 3)
    assert win["val/vs_baseline/grade_mean"] == 5.0 and win["val/vs_baseline/baseline_grade_mean"] == 3.0
    assert lose["val/vs_baseline/grade_mean"] == pytest.approx(5 / 3) and lose["val/vs_baseline/grade_delta"] == \
        pytest.approx(5 / 3 - 3)


def test_versus_metrics_count_failed_prompts_apart():
    from train.grpo.batch import GroupOutcome, failed, versus_metrics, versus_sums

    def judged(margin: float, grade: float) -> GroupOutcome:
        return GroupOutcome(rewards=[grade], components={"grm_margin": [margin], "grm_mean_grade": [grade]},
                            failed_judgments=0)

    # win (+1.5, own 4.5 -> baseline 3), tie (0, own 3), loss (-0.5, own 2.5 -> baseline 3), one timeout
    outcomes = [judged(1.5, 4.5), judged(0.0, 3.0), judged(-0.5, 2.5), failed("timeout", 4)]
    outcomes[1].failed_judgments = 1  # one of its two orders did not parse; the other decided the tie
    sums = versus_sums(outcomes)
    assert (sums["vs_win"], sums["vs_tie"], sums["vs_loss"], sums["vs_failed"]) == (1.0, 1.0, 1.0, 1.0)
    metrics = versus_metrics(sums)
    prefix = "val/vs_baseline/"
    assert metrics[prefix + "score"] == pytest.approx(0.5)  # (1 + 0.5) / 3 judged prompts
    assert metrics[prefix + "win_rate"] == metrics[prefix + "tie_rate"] == metrics[prefix + "loss_rate"] == \
        pytest.approx(1 / 3)
    assert metrics[prefix + "grade_mean"] == pytest.approx(10 / 3) and metrics[prefix + "baseline_grade_mean"] == 3.0
    assert metrics[prefix + "prompts"] == 4 and metrics[prefix + "prompts_failed"] == 1
    assert metrics[prefix + "errors/timeout"] == 1 and metrics[prefix + "judgments_failed"] == 1
    assert math.isnan(versus_metrics(versus_sums([failed("timeout")]))[prefix + "score"])


# ---------------------------------------------------------------------------------------------------------------
# Prompts: truncation keeps the system turn, Qwen3's thinking switch


def _chars(messages: list[dict]) -> list[str]:
    """A character 'tokenizer' with a 2-char header per turn and a 2-char generation prompt."""
    return list("".join(f"{m['role'][0]}:{m['content']}" for m in messages) + "a:")


def test_fit_prompt_shortens_the_user_turn_never_the_system_turn():
    from train.sequences import fit_prompt

    messages = [{"role": "system", "content": "RUBRIC"}, {"role": "user", "content": "abcdefghij"}]
    # s:RUBRIC (8) + u:abcdefghij (12) + a: (2) = 22 ids
    assert fit_prompt(messages, _chars, list, "".join, 22) == (_chars(messages), False)
    ids, truncated = fit_prompt(messages, _chars, list, "".join, 16)  # 6 over: the user turn keeps "abcd"
    assert truncated and "".join(ids) == "s:RUBRICu:abcda:"
    with pytest.raises(ValueError, match="max_prompt_length"):
        fit_prompt(messages, _chars, list, "".join, 11)  # 12 ids even with an empty user turn


def test_encode_prompt_truncates_the_user_turn_and_passes_the_thinking_switch(tiny_model_dir):
    import json

    from transformers import AutoTokenizer

    from train.config import GRPOConfig
    from train.sequences import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Qwen3's switch, reduced to its effect: non-thinking mode opens the answer with an empty think block
    tokenizer.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
                               "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    row = {"prompt_messages": json.dumps([{"role": "system", "content": "Grade with the rubric."},
                                          {"role": "user", "content": "word " * 200}])}
    ids, truncated = encode_prompt(tokenizer, row, GRPOConfig(max_prompt_length=40))
    text = tokenizer.decode(ids)
    assert truncated and len(ids) <= 40
    assert text.startswith("<system>Grade with the rubric.\n<user>word")
    assert text.endswith("<assistant><think></think>")
    ids, truncated = encode_prompt(tokenizer, row, GRPOConfig(max_prompt_length=4096, thinking=True))
    assert not truncated and tokenizer.decode(ids).endswith("<assistant>")
    assert GRPOConfig().thinking is False
