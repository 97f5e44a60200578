"""The /reward/group client over real sockets: retries with back-off, then an explicit, counted failure.

The unreachable and silent services are real sockets (a closed port, a listener that never answers). The flaky
service is a plain HTTP server on loopback answering with bodies built by the GRM's own `serve.protocol`
response code, so the client reads exactly what the Serve app sends; the Serve app itself is exercised end to
end in tests/test_grpo_ray.py.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from actors.engines.base import Completion
from serve import rewards as R
from train.grpo.reward.client import GroupRewardClient, RewardServiceAuthError, RewardServiceConfig, backoff_delay

MENLO = ("<think>ok</think><final_grade_A> FINAL GRADE: {a} - X </final_grade_A>"
         "<final_grade_B> FINAL GRADE: {b} - X </final_grade_B>")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused


def group_body(n: int, grades: dict[tuple[int, int], tuple[int, int]] | None = None) -> dict:
    """A real GroupRewardResponse for n responses, judged by the protocol's own pairing and parsing."""
    judgments, completions = [], []
    for a, b in R.plan_pairs(n, "all_pairs"):
        ga, gb = (grades or {}).get((a, b), (4, 2))
        completion = Completion(text="", raw_text=MENLO.format(a=ga, b=gb) if ga else "no grades here")
        judgments.append(R.read_judgment(a, b, completion))
        completions.append(completion)
    return R.group_response("all_pairs", n, judgments, completions, "judge").model_dump()


class FlakyServer:
    """Answers POST /reward/group with the scripted statuses in order, then 200 with `body` forever."""

    def __init__(self, statuses: list[int], body: dict):
        self.statuses, self.body, self.requests = list(statuses), body, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["content-length"])
                outer.requests.append((self.path, json.loads(self.rfile.read(length)), dict(self.headers)))
                status = outer.statuses.pop(0) if outer.statuses else 200
                payload = json.dumps(outer.body if status == 200 else {"error": {"message": "busy"}}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/grm"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sleeps():
    return []


def client_for(url: str, sleeps: list, **changes) -> GroupRewardClient:
    settings = {"retries": 3, "backoff_s": 0.5, "backoff_max_s": 1.5, "timeout_s": 2.0} | changes
    cfg = RewardServiceConfig(url=url, **settings)
    return GroupRewardClient(cfg, sleep=sleeps.append)


def test_unreachable_service_is_retried_with_backoff_then_fails(sleeps):
    client = client_for(f"http://127.0.0.1:{closed_port()}", sleeps)
    outcome = client.score("prompt", ["a", "b"])
    assert not outcome.ok and outcome.rewards is None and outcome.error.startswith("connect")
    assert outcome.attempts == 4
    # 0.5, 1.0, then capped at 1.5 (each with at most 10% jitter)
    assert len(sleeps) == 3 and all(base <= s <= base * 1.1 for s, base in zip(sleeps, (0.5, 1.0, 1.5)))


def test_silent_service_times_out(sleeps):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts connections (kernel backlog) but never answers
        client = client_for(f"http://127.0.0.1:{listener.getsockname()[1]}", sleeps, timeout_s=0.3, retries=1)
        outcome = client.score("prompt", ["a", "b"])
    assert outcome.error == "timeout" and outcome.attempts == 2 and outcome.latency_s >= 0.6


def test_busy_service_recovers_within_the_retries(sleeps, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_TOKEN", "tok-123")
    server = FlakyServer([503, 500], group_body(3))
    try:
        client = client_for(server.url, sleeps, token_env="GRPO_TEST_TOKEN", signal="margin")
        outcome = client.score("prompt", ["a", "b", "c"])
    finally:
        server.close()
    assert outcome.ok and outcome.attempts == 3 and len(sleeps) == 2
    # pairs (0,1), (2,0), (1,2), each graded A=4 B=2: response 0 is A once, B once -> margin 0
    assert outcome.rewards == pytest.approx([0.0, 0.0, 0.0])
    assert outcome.components["grm_mean_grade"] == pytest.approx([3.0, 3.0, 3.0])
    path, body, headers = server.requests[-1]
    assert path == "/grm/reward/group" and body["responses"] == ["a", "b", "c"] and body["scheme"] == "all_pairs"
    assert headers["Authorization"] == "Bearer tok-123"


def test_reward_signal_own_grade_or_margin_and_the_context_sent(sleeps):
    # pairs (0,1), (2,0), (1,2) graded (5,2), (3,4), (2,2):
    #   response 0: own grades 5 (as A), 4 (as B) -> own_grade 4.5; margins +3, +1 -> 2.0
    #   response 1: own 2, 2 -> 2.0; margins -3, 0 -> -1.5
    #   response 2: own 3, 2 -> 2.5; margins -1, 0 -> -0.5 (the margins sum to 0, the own grades do not)
    server = FlakyServer([], group_body(3, {(0, 1): (5, 2), (2, 0): (3, 4), (1, 2): (2, 2)}))
    try:
        paper = client_for(server.url, sleeps).score("p", ["a", "b", "c"], dimension="tone", locale="de_DE")
        margin = client_for(server.url, sleeps, signal="margin").score("p", ["a", "b", "c"])
    finally:
        server.close()
    assert paper.rewards == pytest.approx([4.5, 2.0, 2.5]) and margin.rewards == pytest.approx([2.0, -1.5, -0.5])
    for outcome in (paper, margin):
        assert outcome.components["grm_mean_grade"] == pytest.approx([4.5, 2.0, 2.5])
        assert outcome.components["grm_margin"] == pytest.approx([2.0, -1.5, -0.5])
    (_, with_context, _), (_, without, _) = server.requests
    assert (with_context["dimension"], with_context["locale"]) == ("tone", "de_DE")
    assert "dimension" not in without and "locale" not in without


def test_grm_reward_sends_each_rows_context_and_judges_versus_the_baseline_in_both_orders(sleeps):
    from train.grpo.reward.build import GRMGroupReward

    server = FlakyServer([], group_body(2))
    row = {"judge_prompt": "Wie geht's?", "dimension": "fluency", "locale": "de_DE"}
    reward = GRMGroupReward(RewardServiceConfig(url=server.url, retries=0))
    try:
        reward([row], [["a", "b"]])
        reward.versus([row], ["answer"], ["baseline answer"])
        plain = GRMGroupReward(RewardServiceConfig(url=server.url, retries=0, send_context=False))
        plain([row], [["a", "b"]])
        plain.close()
    finally:
        reward.close()
        server.close()
    (_, group, _), (_, versus, _), (_, bare, _) = server.requests
    assert (group["dimension"], group["locale"], group["scheme"]) == ("fluency", "de_DE", "all_pairs")
    assert versus["responses"] == ["answer"] and versus["reference"] == "baseline answer"
    assert (versus["scheme"], versus["both_orders"], versus["locale"]) == ("vs_reference", True, "de_DE")
    assert "dimension" not in bare and "locale" not in bare


def test_exhausted_retries_report_the_last_status(sleeps):
    server = FlakyServer([503] * 10, group_body(2))
    try:
        outcome = client_for(server.url, sleeps, retries=2).score("p", ["a", "b"])
    finally:
        server.close()
    assert outcome.error == "http_503" and outcome.attempts == 3 and len(server.requests) == 3


def test_refused_request_fails_at_once_and_auth_errors_stop_the_run(sleeps):
    server = FlakyServer([400, 401], group_body(2))
    try:
        client = client_for(server.url, sleeps)
        refused = client.score("p", ["a", "b"])
        with pytest.raises(RewardServiceAuthError, match="token_env"):
            client.score("p", ["a", "b"])
    finally:
        server.close()
    assert refused.error.startswith("http_400") and refused.attempts == 1 and not sleeps


def test_null_rewards_fail_the_group_instead_of_scoring_zero(sleeps):
    # response 1's both judgments are unparseable -> its reward is null -> the whole group is failed
    body = group_body(3, {(0, 1): (0, 0), (1, 2): (0, 0)})
    assert body["rewards"][1] is None and body["rewards"][0] is not None
    server = FlakyServer([], body)
    try:
        outcome = client_for(server.url, sleeps).score("p", ["a", "b", "c"])
    finally:
        server.close()
    assert outcome.error == "null_rewards" and outcome.rewards is None and outcome.failed_judgments == 2
    assert outcome.attempts == 1


def test_missing_token_variable_is_a_config_error(monkeypatch):
    monkeypatch.delenv("GRPO_TEST_TOKEN", raising=False)
    with pytest.raises(RewardServiceAuthError, match="GRPO_TEST_TOKEN"):
        GroupRewardClient(RewardServiceConfig(url="http://127.0.0.1:1", token_env="GRPO_TEST_TOKEN"))


def test_backoff_is_exponential_and_capped():
    import random

    rng = random.Random(1)
    delays = [backoff_delay(k, 1.0, 5.0, rng) for k in range(1, 6)]
    for delay, base in zip(delays, (1, 2, 4, 5, 5)):
        assert base <= delay <= base * 1.1


# -- the Serve-handle transport (train.grpo.reward.handle): the same retries and error kinds, without HTTP ------------

HANDLE_APP = "reward-handle-test"


@pytest.fixture
def scripted_app(ray_local):
    """A Serve app whose `reward_group_in_cluster` answers by the request's prompt: `status N` (then 200 once the
    scripted statuses are used up), `raise`, `sleep`, else a real group body. No HTTP proxy runs."""
    import asyncio

    from ray import serve

    bodies = {n: group_body(n) for n in (2, 3)}  # captured by value: the replica cannot import this module

    @serve.deployment(max_ongoing_requests=8, ray_actor_options={"num_cpus": 0})
    class Scripted:
        def __init__(self):
            self.statuses = {}

        async def reward_group_in_cluster(self, body: dict) -> tuple[int, dict]:
            prompt, n = body["prompt"], len(body["responses"])
            if prompt == "raise":
                raise RuntimeError("boom in the replica")
            if prompt == "sleep":
                await asyncio.sleep(30)
            if prompt.startswith("status"):
                left = self.statuses.setdefault(prompt, [int(s) for s in prompt.split()[1:]])
                if left:
                    return left.pop(0), {"error": {"message": "scripted"}}
            return 200, bodies[n]

    serve.start(proxy_location="Disabled")
    serve.run(Scripted.bind(), name=HANDLE_APP, route_prefix=None)
    yield
    # shut Serve down, not just the app: a later `serve.start` in the same Ray session keeps this one's proxy
    # setting (none), and every HTTP test after it would find no proxy
    serve.shutdown()


@pytest.mark.slow
def test_handle_transport_keeps_the_http_clients_retries_and_error_kinds(scripted_app, sleeps):
    from train.grpo.reward.handle import reward_transport

    cfg = RewardServiceConfig(url="http://unused.invalid:1", app=HANDLE_APP, retries=2, backoff_s=0.5,
                              backoff_max_s=1.5, timeout_s=1.0)
    client = GroupRewardClient(cfg, sleep=sleeps.append, transport=reward_transport(cfg))
    try:
        ok = client.score("fine", ["a", "b", "c"])
        recovered = client.score("status 503 500", ["a", "b"])
        refused = client.score("status 400", ["a", "b"])
        exhausted = client.score("status 503 503 503 503", ["a", "b"])
        crashed = client.score("raise", ["a", "b"])
        slow = client.score("sleep", ["a", "b"])
        with pytest.raises(RewardServiceAuthError):
            client.score("status 401", ["a", "b"])
    finally:
        client.close()
    assert ok.ok and ok.rewards == pytest.approx([3.0, 3.0, 3.0]) and ok.attempts == 1
    assert recovered.ok and recovered.attempts == 3
    assert refused.error.startswith("http_400") and refused.attempts == 1
    assert exhausted.error == "http_503" and exhausted.attempts == 3
    assert crashed.error == "http_500" and crashed.attempts == 3
    assert slow.error == "timeout" and slow.attempts == 3 and slow.latency_s >= 3.0
    # back-off between attempts as over HTTP: 0.5, 1.0 per retried group (each with at most 10% jitter)
    assert len(sleeps) == 2 * 4 and all(0.5 <= s <= 1.1 for s in sleeps)
    with pytest.raises(ValueError, match="reward.app: no Serve application 'no-such-app'"):
        reward_transport(dataclasses.replace(cfg, app="no-such-app"))


def test_an_app_name_needs_the_handle_transport():
    from train.grpo.reward.handle import reward_transport

    with pytest.raises(ValueError, match="reward.app"):
        GroupRewardClient(RewardServiceConfig(url="http://h:1", app="grm"))
    assert reward_transport(RewardServiceConfig(url="http://h:1")) is None  # no app: HTTP to the url
