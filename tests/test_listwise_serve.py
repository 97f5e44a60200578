"""Listwise judging in the served judge, the pure parts: the listwise template and its validation, the request
checks, the reward mapping by hand, the rollout client's reading of a listwise body, and configs refused naming
the key (the HTTP path through the real app is in tests/test_serve_app.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.engines.base import Completion
from core.config import ConfigError, load_config
from serve import protocol as P
from serve import rewards as R
from serve.judge_prompts import load_judge_prompts, output_format, render_responses
from train.grpo.reward.client import parse_group_body

REPO = Path(__file__).resolve().parents[1]
RUBRICS = str(REPO / "configs" / "data" / "menlo_rubrics.yaml")
POINTWISE = ("menlo_pointwise", {"prompt": "prompt", "response": "response"})
PAIRWISE = ("menlo_pairwise", {"prompt": "prompt", "response_a": "response_a", "response_b": "response_b"})


def prompts(listwise: str = "menlo_listwise", mode: str = "rank"):
    return load_judge_prompts(*POINTWISE, *PAIRWISE, "menlo", RUBRICS, listwise=listwise, listwise_mode=mode)


def test_listwise_template_numbers_the_group_and_asks_for_the_mode_format():
    messages = prompts().listwise_messages("Say thanks.", ["Thanks!", "Cheers.", "Ok"], dimension="tone",
                                           locale="fr_FR")
    system, user = messages[0]["content"], messages[-1]["content"]
    assert "3 AI responses to it, numbered from 1 to 3" in system and "Evaluate the Tone" in system
    assert "Definition: Overall writing style" in system
    assert "RANKING: a > b > c  (the numbers 1 to 3, each exactly once, best response first)" in system
    assert "[Locale]\nfr_FR" in user and "[User Prompt]\nSay thanks." in user
    assert user.endswith("[Response 1]\nThanks!\n\n[Response 2]\nCheers.\n\n[Response 3]\nOk")
    graded = prompts(mode="grade").listwise_messages("p", ["a", "b"], dimension="fluency", locale="en_US")
    assert "GRADES:\n[1]: k\n[2]: k\n" in graded[0]["content"]
    assert render_responses(["x"]) == "[Response 1]\nx"
    with pytest.raises(ValueError, match="listwise mode 'best'"):
        output_format(2, "best")


def test_listwise_template_and_mode_are_validated_under_their_key():
    with pytest.raises(ValueError, match=re.escape("prompts.listwise_mode: 'pairs' is not one of")):
        prompts(mode="pairs")
    # a pairwise template has no {responses} / {n}: refused as a listwise one
    with pytest.raises(ValueError, match=re.escape("prompts.listwise: template 'menlo_pairwise' declares")):
        prompts(listwise="menlo_pairwise")
    with pytest.raises(ValueError, match="prompts.listwise: "):
        prompts(listwise="no_such_template")
    without = prompts(listwise="")
    with pytest.raises(P.RequestError) as err:
        without.listwise_messages("p", ["a", "b"], dimension="tone", locale="en_US")
    assert err.value.field == "scheme"


def test_serve_config_refuses_a_bad_listwise_mode_naming_the_key(capsys):
    from jobs.cli import main

    code = main(["serve", str(REPO / "configs" / "grm.yaml"), "prompts.listwise_mode=pairs", "--print-config"])
    assert code == 2
    assert "prompts.listwise_mode: 'pairs' is not one of ('rank', 'grade')" in capsys.readouterr().err


@pytest.mark.parametrize("body, field", [
    ({"responses": ["a"] * 10}, "responses"),
    ({"responses": ["a"]}, "responses"),
    ({"responses": ["a", "b"], "reference": "r"}, "reference"),
    ({"responses": ["a", "b"], "both_orders": True}, "both_orders"),
])
def test_listwise_group_checks_name_the_field(body, field):
    request = P.GroupRewardRequest(prompt="p", scheme="listwise", **body)
    with pytest.raises(P.RequestError) as err:
        P.check_group(request, P.Limits())
    assert err.value.field == field


def test_rank_verdict_gives_normalised_ranks_in_response_order():
    # RANKING 3 > 1 > 4 > 2: response 3 is best (1), 1 next (2/3), 4 (1/3), 2 worst (0)
    completion = Completion(text="", raw_text="<think> 3 is clearest </think>\nRANKING: 3 > 1 > 4 > 2",
                            prompt_tokens=100, completion_tokens=12)
    out = R.listwise_response(4, "rank", completion, False, "judge")
    assert out.scheme == "listwise" and out.rewards == pytest.approx([2 / 3, 0.0, 1.0, 1 / 3])
    assert out.listwise.order == [2, 0, 3, 1] and out.listwise.parse_status == "ok"
    assert out.listwise.rationale == "3 is clearest"
    assert out.judgments == [] and out.counts.n_judgments == 1 and out.counts.n_null_rewards == 0
    assert [item.mean_grade for item in out.items] == [None] * 4
    assert out.usage.total_tokens == 112


def test_grade_verdict_maps_grades_to_0_1():
    completion = Completion(text="", raw_text="<think> </think>\nGRADES:\n[1]: 5\n[2]: 1\n[3]: 3")
    out = R.listwise_response(3, "grade", completion, True, "judge")
    # (g - 1) / 4
    assert out.rewards == [1.0, 0.0, 0.5] and [i.mean_grade for i in out.items] == [5, 1, 3]
    assert out.listwise.cached is True


@pytest.mark.parametrize("completion, status", [
    (Completion(text="", raw_text="RANKING: 1 > 1 > 2"), "ranking is not a permutation of 1..3: [1, 1, 2]"),
    (Completion(text="", finish_reason="error", error="boom"), "engine_error: boom"),
])
def test_unparsed_listwise_verdict_nulls_every_reward_and_counts_it(completion, status):
    out = R.listwise_response(3, "rank", completion, False, "judge")
    assert out.rewards == [None, None, None] and out.listwise.parse_status == status
    assert (out.counts.n_failed_judgments, out.counts.n_null_rewards) == (1, 3)
    assert all(item.n_failed == 1 and item.errors == [f"listwise: {status}"] for item in out.items)


def test_rollout_client_reads_listwise_rewards_whatever_the_signal():
    body = R.listwise_response(3, "rank", Completion(text="", raw_text="RANKING: 2 > 3 > 1"), False,
                               "judge").model_dump(mode="json")
    for signal in ("own_grade", "margin"):
        outcome = parse_group_body(body, 3, signal)
        assert outcome.rewards == [0.0, 1.0, 0.5] and outcome.components == {"grm_listwise": [0.0, 1.0, 0.5]}
    nulls = R.listwise_response(3, "rank", Completion(text="", raw_text="no verdict"), False, "judge")
    assert parse_group_body(nulls.model_dump(mode="json"), 3).error == "null_rewards"


def test_policy_grpo_refuses_listwise_for_a_group_it_cannot_rank():
    from jobs.policy.grpo import Config

    with pytest.raises(ConfigError, match=re.escape("reward.scheme: listwise ranks 2..9 responses")):
        load_config(Config, REPO / "configs" / "policy_grpo_demo.yaml",
                    ["reward.scheme=listwise", "grpo.group_size=12"])
