"""serve.protocol (pure): reward schemes on hand-worked grade tables, validation rules, judge message building."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from actors.engines.base import Completion, SamplingParams
from core.config import ConfigError, load_config
from eval.reward_wire import JudgmentOut
from serve import protocol as P
from serve import rewards as R
from serve.config import ServeConfig
from serve.judge_prompts import load_judge_prompts

REPO = Path(__file__).resolve().parents[1]
MENLO_OK = ("<think>{why}</think>\n<final_grade_A> FINAL GRADE: {a} - {la} </final_grade_A>\n"
            "<final_grade_B> FINAL GRADE: {b} - {lb} </final_grade_B>")


def judgment(a: int, b: int, grade_a: int | None, grade_b: int | None) -> JudgmentOut:
    ok = grade_a is not None and grade_b is not None
    return JudgmentOut(a=a, b=b, grade_a=grade_a, grade_b=grade_b, parse_status="ok" if ok else "missing_grade_b",
                       rationale="")


def menlo(a: int, b: int, why: str = "because") -> Completion:
    from eval.judging.menlo_parse import MENLO_LABELS

    text = MENLO_OK.format(why=why, a=a, b=b, la=MENLO_LABELS[a], lb=MENLO_LABELS[b])
    return Completion(text=text.split("</think>")[1].strip(), raw_text=text, reasoning=why, prompt_tokens=10,
                      completion_tokens=5)


# ---------------------------------------------------------------------------------------------------------------
# Pairing plans


def test_all_pairs_plan_covers_every_pair_once_with_balanced_positions():
    pairs = R.plan_pairs(4, "all_pairs")
    assert sorted(tuple(sorted(p)) for p in pairs) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    # each response appears 3 times; round-robin parity shows it first at least once and at most twice
    for i in range(4):
        firsts = sum(a == i for a, _ in pairs)
        assert 1 <= firsts <= 2
    assert R.plan_pairs(3, "all_pairs") == [(0, 1), (2, 0), (1, 2)]


def test_both_orders_doubles_the_plan_with_swapped_copies():
    assert R.plan_pairs(2, "all_pairs", both_orders=True) == [(0, 1), (1, 0)]
    assert R.plan_pairs(3, "vs_reference", both_orders=True) == [(0, -1), (-1, 0), (-1, 1), (1, -1), (2, -1),
                                                                 (-1, 2)]


def test_unknown_scheme_is_rejected():
    with pytest.raises(ValueError, match="scheme"):
        R.plan_pairs(3, "round_robin")


# ---------------------------------------------------------------------------------------------------------------
# Rewards on hand-worked tables


def test_all_pairs_reward_is_mean_grade_margin():
    # (0 as A, 1 as B): 4 vs 2   (2 as A, 0 as B): 3 vs 5   (1 as A, 2 as B): 2 vs 2
    table = [judgment(0, 1, 4, 2), judgment(2, 0, 3, 5), judgment(1, 2, 2, 2)]
    items = R.compute_rewards(3, table)
    # r0 = mean(4-2, 5-3) = 2.0 ; r1 = mean(2-4, 2-2) = -1.0 ; r2 = mean(3-5, 2-2) = -1.0
    assert [i.reward for i in items] == [2.0, -1.0, -1.0]
    # MENLO's mean own grade: g0 = (4+5)/2, g1 = (2+2)/2, g2 = (3+2)/2
    assert [i.mean_grade for i in items] == [4.5, 2.0, 2.5]
    assert sum(i.reward for i in items) == 0  # zero-sum when every judgment parsed
    assert all(i.n_judgments == 2 and i.n_failed == 0 and i.errors == [] for i in items)


def test_failed_judgment_is_dropped_from_means_and_counted():
    # (1,2) unparseable: r1 = 2-4 = -2, r2 = 3-5 = -2 from their one good judgment each; r0 unchanged
    table = [judgment(0, 1, 4, 2), judgment(2, 0, 3, 5), judgment(1, 2, None, 2)]
    items = R.compute_rewards(3, table)
    assert [i.reward for i in items] == [2.0, -2.0, -2.0]
    assert [i.n_failed for i in items] == [0, 1, 1]
    assert items[1].errors == ["(1,2): missing_grade_b"]


def test_item_without_any_parsed_judgment_gets_null_not_zero():
    table = [judgment(0, 1, None, None), judgment(2, 0, 3, 5), judgment(1, 2, 1, None)]
    items = R.compute_rewards(3, table)
    assert items[1].reward is None and items[1].mean_grade is None and items[1].n_failed == 2
    # r0 = 5-3 = 2 ; r2 = 3-5 = -2
    assert items[0].reward == 2.0 and items[2].reward == -2.0


def test_vs_reference_reward_is_margin_over_the_reference():
    # (0 vs ref): 4 vs 3 -> +1 ; (ref vs 1): 5 vs 2 -> 2-5 = -3 ; (2 vs ref): 3 vs 3 -> 0
    table = [judgment(0, -1, 4, 3), judgment(-1, 1, 5, 2), judgment(2, -1, 3, 3)]
    items = R.compute_rewards(3, table)
    assert [i.reward for i in items] == [1.0, -3.0, 0.0]
    assert [i.mean_grade for i in items] == [4.0, 2.0, 3.0]


def test_vs_reference_both_orders_averages_the_two_positions():
    # position bias: 0 gets +2 when shown first, 0 when shown second -> mean +1
    table = [judgment(0, -1, 4, 2), judgment(-1, 0, 3, 3)]
    assert R.compute_rewards(1, table)[0].reward == 1.0


def test_group_response_counts_failures():
    completions = [menlo(4, 2), Completion(text="no grades here", raw_text="no grades here", prompt_tokens=7)]
    pairs = [(0, 1), (1, 0)]
    judgments = [R.read_judgment(a, b, c) for (a, b), c in zip(pairs, completions)]
    out = R.group_response("all_pairs", 2, judgments, completions, "judge")
    # only (0,1) parsed: r0 = 4-2 = 2, r1 = 2-4 = -2
    assert out.rewards == [2.0, -2.0]
    assert out.counts.model_dump() == {"n_responses": 2, "n_judgments": 2, "n_failed_judgments": 1,
                                       "n_null_rewards": 0}
    assert judgments[1].parse_status == "missing_grade_a; missing_grade_b"
    assert out.usage.prompt_tokens == 17 and out.usage.total_tokens == 22


def test_engine_error_is_reported_as_the_status():
    broken = Completion(text="", finish_reason="error", error="prompt has 9000 tokens")
    assert R.read_judgment(0, 1, broken).parse_status == "engine_error: prompt has 9000 tokens"
    assert P.score_response(broken, "m", False).grade is None


# ---------------------------------------------------------------------------------------------------------------
# Reading single judgments


def test_score_and_compare_responses_parse_grades_labels_and_rationale():
    text = "Fluent but lossy. Answer: [3]"
    scored = P.score_response(Completion(text=text, raw_text=text), "judge", cached=True)
    assert (scored.grade, scored.label, scored.parse_status, scored.rationale) == (3, "PASS", "ok", "Fluent but lossy.")
    compared = P.compare_response(menlo(2, 5, why="B keeps the meaning."), "judge", cached=False)
    assert (compared.grade_a, compared.grade_b, compared.preference) == (2, 5, "B")
    assert compared.label_b == "EXCELLENT" and compared.format_ok and compared.rationale == "B keeps the meaning."
    tie = P.compare_response(menlo(3, 3), "judge", cached=False)
    assert tie.preference == "tie"


def test_unparseable_pointwise_output_keeps_raw_and_status():
    out = P.score_response(Completion(text="I like it", raw_text="I like it"), "judge", cached=False)
    assert out.grade is None and out.label is None and out.parse_status == "no_score" and out.raw == "I like it"


# ---------------------------------------------------------------------------------------------------------------
# Validation


def test_group_semantic_checks_name_the_field():
    limits = P.Limits(max_group_size=4, max_text_chars=50)
    with pytest.raises(P.RequestError, match="responses: scheme all_pairs needs at least 2") as err:
        P.check_group(P.GroupRewardRequest(prompt="p", responses=["a"]), limits)
    assert err.value.field == "responses"
    with pytest.raises(P.RequestError, match="5 responses exceeds the limit of 4"):
        P.check_group(P.GroupRewardRequest(prompt="p", responses=list("abcde")), limits)
    with pytest.raises(P.RequestError, match="reference: scheme vs_reference needs a reference"):
        P.check_group(P.GroupRewardRequest(prompt="p", responses=["a"], scheme="vs_reference"), limits)
    with pytest.raises(P.RequestError, match=r"responses\[1\]: 51 characters exceeds the limit of 50"):
        P.check_group(P.GroupRewardRequest(prompt="p", responses=["a", "x" * 51]), limits)
    P.check_group(P.GroupRewardRequest(prompt="p", responses=["a"], scheme="vs_reference", reference="r"), limits)


def test_pydantic_rejects_malformed_bodies_naming_the_field():
    with pytest.raises(ValidationError, match="responses"):
        P.GroupRewardRequest(prompt="p")
    with pytest.raises(ValidationError, match="scheme"):
        P.GroupRewardRequest(prompt="p", responses=["a", "b"], scheme="best_of")
    with pytest.raises(ValidationError, match="temperature"):
        P.ScoreRequest(prompt="p", response="r", sampling={"temperature": -1})
    with pytest.raises(ValidationError, match="respons_a"):
        P.CompareRequest(prompt="p", response_a="a", response_b="b", respons_a="typo")
    with pytest.raises(ValidationError, match="stream"):
        P.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    # OpenAI clients send fields we do not use: ignored, not rejected
    P.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], presence_penalty=0.1)


def test_sampling_overrides_are_applied_and_capped():
    default = SamplingParams(temperature=0.0, max_tokens=64, seed=1)
    limits = P.Limits(max_tokens=100)
    got = P.judge_sampling(default, limits, P.SamplingOverride(temperature=0.7, seed=5))
    assert got == SamplingParams(temperature=0.7, max_tokens=64, seed=5)
    with pytest.raises(P.RequestError, match="sampling.max_tokens: 500 exceeds the limit of 100"):
        P.judge_sampling(default, limits, P.SamplingOverride(max_tokens=500))
    assert P.resolve_sampling(default, limits, stop="\n").stop == ("\n",)
    with pytest.raises(P.RequestError, match="stop"):
        P.resolve_sampling(default, limits, stop=[""])


def test_chat_limits():
    limits = P.Limits(max_messages=2, max_text_chars=10)
    msgs = [{"role": "user", "content": "hi"}] * 3
    with pytest.raises(P.RequestError, match="messages: 3 messages exceeds the limit of 2"):
        P.check_chat(P.ChatCompletionRequest(messages=msgs), limits)
    with pytest.raises(P.RequestError, match=r"messages\[0\].content"):
        P.check_chat(P.ChatCompletionRequest(messages=[{"role": "user", "content": "x" * 11}]), limits)


# ---------------------------------------------------------------------------------------------------------------
# Judge messages


def test_messages_are_rendered_from_the_shared_templates():
    prompts = load_judge_prompts("jury_score", {"prompt": "base_sentence", "response": "new_sentence"},
                                   "jury_pairwise", {"prompt": "source", "response_a": "candidate_a",
                                                     "response_b": "candidate_b"})
    score = prompts.score_messages("The cat sat on the mat.", "A cat sat.")
    assert score[0]["role"] == "system" and score[-1]["role"] == "user"
    assert score[-1]["content"] == "Base Sentence: The cat sat on the mat.\nNew Sentence: A cat sat."
    pair = prompts.compare_messages("Orig.", "First.", "Second.")
    assert "[Simplification A]\nFirst." in pair[-1]["content"] and "[Simplification B]\nSecond." in pair[-1]["content"]
    with pytest.raises(P.RequestError, match="reference: .*no reference slot"):
        prompts.score_messages("p", "r", reference="gold")


def test_template_variable_maps_are_checked():
    with pytest.raises(ValueError, match="prompts.pointwise_vars: unknown request field 'answer'"):
        load_judge_prompts("jury_score", {"prompt": "base_sentence", "response": "new_sentence",
                                            "answer": "x"}, "jury_pairwise",
                             {"prompt": "source", "response_a": "candidate_a", "response_b": "candidate_b"})
    with pytest.raises(ValueError, match="prompts.pairwise_vars: template 'jury_pairwise' declares"):
        load_judge_prompts("jury_score", {"prompt": "base_sentence", "response": "new_sentence"},
                             "jury_pairwise", {"prompt": "source", "response_a": "candidate_a",
                                               "response_b": "cand_b"})
    with pytest.raises(ValueError, match="prompts.pairwise: .*not found"):
        load_judge_prompts("jury_score", {"prompt": "base_sentence", "response": "new_sentence"},
                             "no_such_template", {})


MENLO_VARS = ({"prompt": "prompt", "response": "response"},
              {"prompt": "prompt", "response_a": "response_a", "response_b": "response_b"})
RUBRICS = str(REPO / "configs" / "data" / "menlo_rubrics.yaml")


def test_menlo_templates_take_dimension_rubric_and_locale_from_the_request():
    prompts = load_judge_prompts("menlo_pointwise", MENLO_VARS[0], "menlo_pairwise", MENLO_VARS[1], "menlo",
                                   RUBRICS)
    score = prompts.score_messages("Say thanks.", "Thanks!", dimension="tone", locale="fr_FR")
    system, user = score[0]["content"], score[-1]["content"]
    assert "Evaluate the Tone of the response" in system
    assert "Tone: Is the response helpful, insightful, engaging, and fair?" in system
    assert "Definition: Overall writing style" in system and "* Provides no insights whatsoever" in system
    assert "[Locale]\nfr_FR" in user and "[Response]\nThanks!" in user
    labels_only = load_judge_prompts("menlo_pointwise", MENLO_VARS[0], "menlo_pairwise", MENLO_VARS[1], "menlo",
                                       RUBRICS, with_rubric=False)
    system = labels_only.score_messages("p", "r", dimension="tone", locale="fr_FR")[0]["content"]
    assert "3 - PASS" in system and "Definition:" not in system and "* Provides" not in system
    pair = prompts.compare_messages("p", "first", "second", dimension="fluency", locale="en_US")
    assert "Fluency" in pair[0]["content"] and "first" in pair[-1]["content"]
    for kwargs, field in (({"locale": "fr_FR"}, "dimension"), ({"dimension": "humour", "locale": "fr_FR"},
                                                                 "dimension"), ({"dimension": "tone"}, "locale")):
        with pytest.raises(P.RequestError) as err:
            prompts.score_messages("p", "r", **kwargs)
        assert err.value.field == field


def test_context_fields_for_a_template_without_the_slot_are_refused():
    prompts = load_judge_prompts("jury_score", {"prompt": "base_sentence", "response": "new_sentence"},
                                   "jury_pairwise", {"prompt": "source", "response_a": "candidate_a",
                                                     "response_b": "candidate_b"})
    with pytest.raises(P.RequestError, match="dimension: .*no dimension slot"):
        prompts.score_messages("p", "r", dimension="tone")
    with pytest.raises(P.RequestError, match="locale: .*no locale slot"):
        prompts.compare_messages("p", "a", "b", locale="en_US")


def test_menlo_templates_need_the_rubrics_file_and_a_known_format(tmp_path):
    with pytest.raises(ValueError, match="prompts.rubrics: the templates declare"):
        load_judge_prompts("menlo_pointwise", MENLO_VARS[0], "menlo_pairwise", MENLO_VARS[1], "menlo")
    broken = tmp_path / "rubrics.yaml"
    broken.write_text("fluency: {name: Fluency}\n")
    with pytest.raises(ValueError, match="prompts.rubrics: .*rubrics.yaml"):
        load_judge_prompts("menlo_pointwise", MENLO_VARS[0], "menlo_pairwise", MENLO_VARS[1], "menlo", str(broken))
    with pytest.raises(ValueError, match="prompts.pointwise_format: 'stars'"):
        load_judge_prompts("menlo_pointwise", MENLO_VARS[0], "menlo_pairwise", MENLO_VARS[1], "stars", RUBRICS)


@pytest.mark.parametrize("raw, fmt, grade, status, format_ok", [
    ("<think>Warm.</think>\n<final_grade> FINAL GRADE: 4 - GOOD </final_grade>", "menlo", 4, "ok", True),
    ("<think>Warm.</think><final_grade> FINAL GRADE: 4 - PASS </final_grade>", "menlo", 4, "ok", False),
    ("<final_grade> FINAL GRADE: 2 - MINOR FAILURE </final_grade>", "menlo", 2, "ok", False),
    ("<think>Warm.</think> Answer: [4]", "menlo", None, "missing_grade", False),
    ("<think>Warm.</think><final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>", "menlo", None, "missing_grade",
     False),
    ("<think>unfinished", "menlo", None, "unterminated_think", False),
    ("Fluent. Answer: [4]", "answer", 4, "ok", True),
    ("<final_grade> FINAL GRADE: 4 - GOOD </final_grade>", "answer", None, "no_score", False),
])
def test_score_response_reads_the_configured_pointwise_format(raw, fmt, grade, status, format_ok):
    out = P.score_response(Completion(text=raw, raw_text=raw), "judge", False, fmt)
    assert (out.grade, out.parse_status, out.format_ok) == (grade, status, format_ok)
    assert out.label == (None if grade is None else {2: "MINOR FAILURE", 4: "GOOD"}[grade])


def test_think_is_stripped_from_policy_responses():
    assert P.clean_response("<think>plan</think> The answer.", strip_think=True) == "The answer."
    assert P.clean_response("<think>plan</think> The answer.", strip_think=False).startswith("<think>")


# ---------------------------------------------------------------------------------------------------------------
# Config


def test_shipped_configs_load_and_bad_values_name_the_key(tmp_path):
    cfg = load_config(ServeConfig, REPO / "configs" / "grm.yaml")
    assert cfg.serve.auth_token_env == "QUORUM_SERVE_TOKEN" and cfg.user_config()["judge"]["adapter"] == ""
    with pytest.raises(ConfigError, match="autoscaling.max_ongoing_requests"):
        load_config(ServeConfig, REPO / "configs" / "grm.yaml", ["batching.max_batch_size=128"])
    with pytest.raises(ConfigError, match="judge.adapter: .*adapter_config.json"):
        load_config(ServeConfig, REPO / "configs" / "grm.yaml", [f"judge.adapter={tmp_path}"])
    with pytest.raises(ConfigError, match="resources.num_gpus"):
        load_config(ServeConfig, REPO / "configs" / "grm_cluster.yaml", ["resources.num_gpus=0"])
    with pytest.raises(ConfigError, match="sampling.max_tokens"):
        load_config(ServeConfig, REPO / "configs" / "grm.yaml", ["sampling.max_tokens=5000"])


@pytest.mark.parametrize("override, key", [
    ("autoscaling.min_replicas=3", "autoscaling.min_replicas: need 1 <= min_replicas <= max_replicas, got 3..1"),
    ("autoscaling.min_replicas=0", "autoscaling.min_replicas"),
    ("autoscaling.target_ongoing_requests=0", "autoscaling.target_ongoing_requests: must be > 0"),
    ("health.period_s=0", "health.period_s: must be > 0"),
    ("health.timeout_s=-1", "health.timeout_s: must be >= 0"),
    ("shutdown.wait_loop_s=0", "shutdown.wait_loop_s: must be > 0"),
    ("shutdown.timeout_s=60", "shutdown.timeout_s: 60 must be >= serve.request_timeout_s"),
    ("health.max_engine_call_s=30", "health.max_engine_call_s: 30 must be 0 or >= serve.request_timeout_s"),
    ("health.probe_s=1", "health.probe_s"),
])
def test_deployment_settings_are_checked_under_their_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(ServeConfig, REPO / "configs" / "grm.yaml", [override])


def test_deployment_settings_reach_serve_and_the_replicas():
    """configs/grm*.yaml's replica, health and shutdown settings become Serve's deployment options (autoscaling
    when min < max), and the health probe settings travel to the replicas in user_config."""
    from serve.app import deployment_options

    local = deployment_options(load_config(ServeConfig, REPO / "configs" / "grm.yaml", ["health.probe=false"]))
    assert {k: local[k] for k in ("num_replicas", "max_ongoing_requests", "health_check_period_s",
                                  "health_check_timeout_s", "graceful_shutdown_wait_loop_s",
                                  "graceful_shutdown_timeout_s")} == {
        "num_replicas": 1, "max_ongoing_requests": 64, "health_check_period_s": 10.0, "health_check_timeout_s": 30.0,
        "graceful_shutdown_wait_loop_s": 2.0, "graceful_shutdown_timeout_s": 130.0}
    assert local["user_config"]["health"] == {"period_s": 10.0, "timeout_s": 30.0, "probe": False,
                                              "max_engine_call_s": 600.0}
    cluster = deployment_options(load_config(ServeConfig, REPO / "configs" / "grm_cluster.yaml"))
    assert "num_replicas" not in cluster and cluster["autoscaling_config"] == {
        "min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 4.0}
    assert cluster["graceful_shutdown_timeout_s"] >= 600 and cluster["max_ongoing_requests"] == 128


def test_print_config_is_a_valid_serve_config_without_secrets(monkeypatch, capsys):
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from jobs.serve_grm import main

    monkeypatch.setenv("QUORUM_SERVE_TOKEN", "very-secret-token")
    assert main([str(REPO / "configs" / "grm.yaml"), "serve.port=8123", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "very-secret-token" not in text
    schema = ServeDeploySchema.model_validate(yaml.safe_load(text))
    app = schema.applications[0]
    assert app.import_path == "serve.app:build_app" and schema.http_options.port == 8123
    assert app.deployments[0].user_config["auth_token_env"] == "QUORUM_SERVE_TOKEN"
    assert app.args["serve"]["port"] == 8123
    deployment = app.deployments[0]
    assert (deployment.health_check_period_s, deployment.health_check_timeout_s) == (10.0, 30.0)
    assert (deployment.graceful_shutdown_wait_loop_s, deployment.graceful_shutdown_timeout_s) == (2.0, 130.0)
