"""The client distribution (clients/, `quorum_clients`) on its own: what the judge reads, the failure policies of the
TRL, OpenRLHF and verl forms, and the errors they surface, against a stub of the service at the world's edge
(tests/reward_stub.py). The trainers' own code paths run in tests/test_trainer_clients_e2e.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from quorum_clients import openrlhf, text, trl, verl
from quorum_clients.http import ClientConfig, RewardServiceClient, neutral_reward, resolve_failed_reward

from tests.reward_stub import RewardStub, grade

REPO = Path(__file__).resolve().parents[1]
FAST = {"retries": 1, "backoff_s": 0.01, "timeout_s": 2.0}


@pytest.fixture
def stub():
    with RewardStub() as running:
        yield running


# ---------------------------------------------------------------------------------------------------------------
# The distribution


def test_the_distribution_imports_nothing_of_quorum_nor_torch_nor_ray(tmp_path):
    """What a trainer's process loads: the four modules, and nothing heavy or of quorum with them."""
    code = (f"import sys; sys.path.insert(0, {str(REPO / 'clients')!r})\n"
            "import quorum_clients.trl, quorum_clients.verl, quorum_clients.openrlhf, quorum_clients.text\n"
            "print([m for m in ('torch', 'ray', 'transformers', 'pydantic', 'serve', 'core', 'eval') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "[]"


def test_serve_clients_are_the_distributions_modules():
    import serve.clients.http
    import serve.clients.openrlhf
    import serve.clients.trl
    import serve.clients.verl

    assert serve.clients.trl is trl and serve.clients.verl is verl and serve.clients.openrlhf is openrlhf
    assert serve.clients.http.RewardServiceClient is RewardServiceClient


# ---------------------------------------------------------------------------------------------------------------
# What the judge reads


@pytest.mark.parametrize("prompt", [
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n",
    ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nName a river.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}],
])
def test_chat_markup_is_stripped_and_roles_kept(prompt):
    assert text.prompt_text(prompt) == "System: Be brief.\n\nUser: Name a river."


def test_a_single_user_turn_is_its_text_and_end_tokens_leave_a_response():
    assert text.prompt_text("<start_of_turn>user\nName a river.<end_of_turn>\n<start_of_turn>model\n") == "Name a river."
    assert text.prompt_text("<s>[INST] Name a river. [/INST]") == "Name a river."
    assert text.response_text("The Nile.<|im_end|>") == "The Nile."
    assert text.response_text("The Nile.</s>") == "The Nile."
    assert text.response_text([{"role": "assistant", "content": "The Nile."}]) == "The Nile."
    assert text.prompt_text("plain words") == "plain words"


def test_a_message_without_text_is_refused_not_judged_as_none():
    completion = [{"role": "assistant", "content": "Let me look.", "tool_calls": []},
                  {"role": "tool", "content": None}]
    with pytest.raises(text.TextError, match=r"completions\[1\] \(tool\): content None"):
        text.response_text(completion, "completions")


# ---------------------------------------------------------------------------------------------------------------
# The HTTP client: failures name the service's message


def test_failed_requests_carry_the_services_message(stub):
    client = RewardServiceClient(ClientConfig(url=stub.url, **FAST), sleep=lambda s: None)
    stub.mode = "503"
    from quorum_clients.http import GroupJob

    [result] = client.groups([GroupJob("p", ["a", "b"])])
    assert result.rewards == [None, None]
    assert result.error == "http_503: judge engine unavailable: no replica is ready (after 2 attempts)"
    assert len(stub.requests) == 2  # retried once
    stub.mode = "400"
    [result] = client.groups([GroupJob("p", ["a"])])
    assert result.error == "http_400: responses: a group needs at least 2 responses" and len(stub.requests) == 3


def test_failed_reward_is_on_the_scale_or_neutral():
    assert neutral_reward("score") == 3.0 and neutral_reward("all_pairs", "margin") == 0.0
    assert neutral_reward("listwise") == 0.5
    assert resolve_failed_reward("neutral", "all_pairs", "own_grade") == 3.0
    assert resolve_failed_reward(None, "score", "own_grade") is None
    with pytest.raises(ValueError, match=r"outside the score/own_grade reward scale \[1.0, 5.0\]"):
        resolve_failed_reward(0, "score", "own_grade")


# ---------------------------------------------------------------------------------------------------------------
# TRL


def call_trl(reward, prompts, completions, trainer=None, **columns):
    metrics, extra = {}, {}
    log_metric = (trainer._log_metric if trainer is not None
                  else (lambda name, value: metrics.setdefault(name, []).append(value)))
    out = reward(prompts=prompts, completions=completions, completion_ids=[[0]] * len(prompts),
                 trainer_state=SimpleNamespace(global_step=1), log_metric=log_metric,
                 log_extra=lambda name, values: extra.setdefault(name, values), **columns)
    return out, metrics, extra


def test_trl_groups_and_normalises_before_judging(stub):
    reward = trl.QuorumReward(stub.url, scheme="all_pairs", **FAST)
    prompts = [[{"role": "user", "content": "Name a river."}]] * 2 + [[{"role": "user", "content": "Name a sea."}]] * 2
    completions = [[{"role": "assistant", "content": c}] for c in
                   ["The Nile.<|im_end|>", "The long slow Nile in Egypt.", "Red.", "The Red Sea."]]
    out, metrics, _ = call_trl(reward, prompts, completions)
    assert out == [grade("The Nile."), grade("The long slow Nile in Egypt."), grade("Red."), grade("The Red Sea.")]
    # the groups are sent concurrently: in no particular order
    assert sorted((p, b["prompt"], b["responses"]) for p, b in stub.requests) == [
        ("/reward/group", "Name a river.", ["The Nile.", "The long slow Nile in Egypt."]),
        ("/reward/group", "Name a sea.", ["Red.", "The Red Sea."])]
    assert metrics["quorum/rows"] == [4.0] and metrics["quorum/failed_rows"] == [0.0]


def test_trl_stops_within_the_window_naming_the_services_error(stub):
    """The judge down: no reward for any completion. The first two calls return None (TRL: NaN, zero advantage)
    and are counted; the third, when the window is full, raises with the service's message."""
    stub.mode = "503"
    reward = trl.QuorumReward(stub.url, failure_window=3, max_failed_fraction=0.5, **FAST)
    reward.client._sleep = lambda s: None
    for _ in range(2):
        out, metrics, extra = call_trl(reward, ["p", "p"], ["a", "b"])
        assert out == [None, None] and metrics["quorum/failed_rows"] == [2.0]
        assert extra["quorum_error"][0].startswith("http_503: judge engine unavailable")
    with pytest.raises(trl.RewardServiceFailure, match=r"6 of 6 completions got no reward over the last 3 calls .*"
                                                       r"judge engine unavailable: no replica is ready"):
        call_trl(reward, ["p", "p"], ["a", "b"])


def test_trl_fail_fast_counts_only_failures_above_the_fraction(stub):
    reward = trl.QuorumReward(stub.url, failure_window=2, max_failed_fraction=0.5, **FAST)
    call_trl(reward, ["p", "p"], ["a", "b"])
    stub.mode = "null"  # the service answers, but no judgment of either parsed: half the window's rows fail
    out, _, extra = call_trl(reward, ["p", "p"], ["a", "b"])
    assert out == [None, None] and extra["quorum_error"] == ["no judgment of this completion parsed"] * 2
    stub.mode = "ok"
    call_trl(reward, ["p", "p"], ["a", "b"])  # 2 of 4 over the window: not above 0.5


def test_trl_refuses_nan_beside_other_reward_functions_summed_by_nansum(stub):
    class Trainer:  # what the function reads of TRL's GRPOTrainer: the reward functions and how they are combined
        multi_objective_aggregation = "sum_then_normalize"

        def __init__(self, funcs):
            self.reward_funcs = funcs

        def _log_metric(self, name, value):
            pass

    reward = trl.QuorumReward(stub.url, **FAST)
    with pytest.raises(ValueError, match="nansum"):
        call_trl(reward, ["p", "p"], ["a", "b"], trainer=Trainer([reward, len]))
    assert stub.requests == []  # refused before anything was judged
    stub.mode = "null"
    lenient = trl.QuorumReward(stub.url, failed_reward="neutral", **FAST)
    out, _, _ = call_trl(lenient, ["p", "p"], ["a", "b"], trainer=Trainer([lenient, len]))
    assert out == [3.0, 3.0]
    alone = trl.QuorumReward(stub.url, **FAST)
    assert call_trl(alone, ["p", "p"], ["a", "b"], trainer=Trainer([alone]))[0] == [None, None]


def test_trl_num_generations_cuts_groups_and_checks_them(stub):
    reward = trl.QuorumReward(stub.url, num_generations=2, **FAST)
    call_trl(reward, ["p", "p", "p", "p"], ["a", "b", "c d e", "f"])
    assert [len(b["responses"]) for _, b in stub.requests] == [2, 2]  # the same prompt twice: still two groups
    with pytest.raises(ValueError, match="num_generations does not match"):
        call_trl(reward, ["p", "q"], ["a", "b"])


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF


QUERY_PROMPT = "<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n"


def openrlhf_func(url: str, monkeypatch, **env):
    """The module as OpenRLHF loads it: spec_from_file_location under the name "reward_func"."""
    monkeypatch.setenv("QUORUM_REWARD_URL", url)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


@pytest.mark.parametrize("mode", ["401", "503", "timeout", "null"])
def test_openrlhf_never_returns_none_and_counts_the_failure(stub, monkeypatch, mode, caplog):
    stub.mode, stub.delay_s = mode, 3
    func = openrlhf_func(f"{stub.url}/openrlhf?retries=1&backoff_s=0.01&timeout_s=1&caller=r", monkeypatch)
    out = func([QUERY_PROMPT + "The Nile.<|im_end|>"], [QUERY_PROMPT], [None])
    assert out == {"rewards": [3.0], "scores": [3.0], "extra_logs": {"quorum_failed": [1.0]}}
    expected = {"401": "answered 401 (missing or wrong bearer token)", "503": "http_503: judge engine unavailable",
                "timeout": "timeout: no answer", "null": "no judgment of this response parsed"}[mode]
    assert expected in caplog.text


def test_openrlhf_judges_the_response_with_the_token(stub, monkeypatch):
    func = openrlhf_func(f"{stub.url}/openrlhf?dimension=fluency&locale=en_US&caller=r", monkeypatch,
                         QUORUM_SERVE_TOKEN="s3cret")
    out = func([QUERY_PROMPT + "The long slow Nile.<|im_end|>"], [QUERY_PROMPT], [None])
    assert out == {"rewards": [2.0], "scores": [2.0], "extra_logs": {"quorum_failed": [0.0]}}
    [(path, body)] = stub.requests
    assert path == "/score" and body["prompt"] == "Name a river." and body["response"] == "The long slow Nile."
    assert body["dimension"] == "fluency" and body["caller"]["name"] == "r"


def test_openrlhf_refuses_the_empty_label_under_vs_reference(stub, monkeypatch):
    func = openrlhf_func(f"{stub.url}?scheme=vs_reference&failed_reward=1", monkeypatch)
    out = func([QUERY_PROMPT + "The Nile."], [QUERY_PROMPT], [""])
    assert out["rewards"] == [1.0] and out["extra_logs"]["quorum_failed"] == [1.0]
    assert stub.requests == []  # never judged against an empty reference


@pytest.mark.parametrize("url, message", [
    ("http://h:1/openrlhf?scheme=all_pairs", "one rollout per call"),
    ("http://h:1/openrlhf?failed_reward=0", "outside the score/own_grade reward scale"),
    ("http://h:1/openrlhf?dimenssion=fluency", "unknown parameter"),
    ("h:1/openrlhf", "expected http"),
])
def test_openrlhf_configuration_that_cannot_work_fails_when_loaded(monkeypatch, url, message):
    with pytest.raises(ValueError, match=message):
        openrlhf_func(url, monkeypatch)


# ---------------------------------------------------------------------------------------------------------------
# verl


def test_verl_group_function_judges_the_rows_raw_prompt(stub):
    messages = [{"role": "user", "content": "Name a river."}]
    rows = verl.compute_score_batch(data_sources=["Dahoas/full-hh-rlhf"] * 2, solution_strs=["The Nile.", "Nile"],
                                    ground_truths=["unused", "unused"], extra_infos=[{"split": "train", "index": 0}] * 2,
                                    prompts=[messages, messages], url=stub.url, **FAST)
    assert [r["score"] for r in rows] == [grade("The Nile."), grade("Nile")]
    [(_, body)] = stub.requests
    assert body["prompt"] == "Name a river." and body["responses"] == ["The Nile.", "Nile"]


def test_verl_failed_judgment_raises_or_takes_the_declared_fallback(stub):
    stub.mode = "null"
    info = {"question": "Name a river."}
    with pytest.raises(verl.RewardJudgmentError, match="no judgment parsed"):
        verl.compute_score("s", "The Nile.", None, info, url=stub.url, **FAST)
    out = verl.compute_score("s", "The Nile.", None, info, url=stub.url, failed_reward="neutral", **FAST)
    assert out == {"score": 3.0, "quorum_failed": 1.0}
    with pytest.raises(ValueError, match="ground_truth ''"):
        verl.compute_score("s", "The Nile.", "", info, url=stub.url, scheme="vs_reference", **FAST)


def test_verl_file_path_load_imports_only_the_installed_package(tmp_path):
    """verl's load_extern_object given a file path runs spec_from_file_location on it under a name of its own."""
    code = (f"import importlib.util, sys; sys.path.insert(0, {str(REPO / 'clients')!r})\n"
            f"spec = importlib.util.spec_from_file_location('custom_module_1', {str(REPO / 'clients/quorum_clients/verl.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(callable(m.compute_score_batch), 'serve' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["True", "False"]
