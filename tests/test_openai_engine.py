"""OpenAIEngine against a real local HTTP server (tests/fake_openai_server.py): ordering, concurrency bound,
retries, timeouts, auth, secret hygiene, reasoning parsing. Backoffs are tiny so the file runs in a few seconds."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.factory import build_engine
from actors.engines.openai_api import (
    OpenAIEngine,
    build_chat_body,
    compute_backoff_s,
    parse_chat_response,
    parse_retry_after,
)
from tests.fake_openai_server import REASONING, FakeOpenAIServer

KEY_ENV = "QUORUM_TEST_FAKE_API_KEY"
SECRET = "sk-quorum-test-9f8e7d6c5b4a"


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def fresh_server(server):
    server.reset()
    yield


def make_spec(server, **overrides) -> EngineSpec:
    fields = {
        "kind": "openai",
        "model": "fake-model",
        "base_url": server.base_url,
        "max_concurrency": 4,
        "timeout_s": 5.0,
        "max_retries": 2,
        "retry_backoff_s": 0.01,
    }
    fields.update(overrides)
    return EngineSpec(**fields)


def ask(text: str, request_id: str = "", **sampling) -> ChatRequest:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    return ChatRequest(messages=messages, sampling=SamplingParams(**sampling), request_id=request_id)


# ----- happy path, ordering, concurrency -----


def test_generate_maps_request_and_response_fields(server):
    with build_engine(make_spec(server, served_model_name="served-name")) as engine:
        [done] = engine.generate([ask("hello there", temperature=0.7, top_p=0.9, max_tokens=7, seed=3, stop=("\n",))])
    assert done.text == "ECHO: HELLO THERE"
    assert done.raw_text == "ECHO: HELLO THERE"
    assert done.finish_reason == "stop" and done.error == ""
    # usage counts words: "be brief" + "hello there" = 4 prompt, "ECHO: HELLO THERE" = 3 completion
    assert (done.prompt_tokens, done.completion_tokens) == (4, 3)
    body = server.calls[0].body
    assert body["model"] == "served-name"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.7, 0.9, 7, 3)
    assert body["stop"] == ["\n"]
    assert "top_k" not in body and "chat_template_kwargs" not in body


def test_top_k_sent_only_when_set_and_thinking_flag():
    request = ask("x", top_k=20)
    body = build_chat_body("m", request, thinking=True)
    assert body["top_k"] == 20
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert "top_k" not in build_chat_body("m", ask("x"))


def test_grammar_travels_as_vllms_structured_outputs_field():
    body = build_chat_body("m", ask("x", grammar='start: "yes" | "no"\n'))
    assert body["structured_outputs"] == {"grammar": 'start: "yes" | "no"\n'}
    assert "structured_outputs" not in build_chat_body("m", ask("x"))


@pytest.mark.parametrize("vllm_server", [True, False])
def test_grammar_is_sent_only_to_a_server_declared_vllm(server, caplog, vllm_server):
    grammar = 'start: "yes" | "no"\n'
    with caplog.at_level(logging.WARNING), OpenAIEngine(make_spec(server, structured_outputs=vllm_server)) as engine:
        engine.generate([ask("a", grammar=grammar), ask("b", grammar=grammar)])
    sent = [c.body.get("structured_outputs") for c in server.calls]
    # a hosted API rejects unknown fields: it gets the plain request, and the run log says the grammar stayed home
    assert sent == ([{"grammar": grammar}] * 2 if vllm_server else [None, None])
    warned = [r for r in caplog.records if "judge grammars are not sent" in r.getMessage()]
    assert len(warned) == (0 if vllm_server else 1)


def test_order_preserved_when_later_requests_finish_first(server):
    # Earlier rows sleep longer, so the server answers them last.
    texts = [f"row {i} [sleep={0.05 * (5 - i):.2f}]" for i in range(6)]
    with OpenAIEngine(make_spec(server, max_concurrency=6)) as engine:
        done = engine.generate([ask(t) for t in texts])
    assert [c.text for c in done] == [f"ECHO: {t.upper()}" for t in texts]


def test_concurrency_bound_respected(server):
    with OpenAIEngine(make_spec(server, max_concurrency=3)) as engine:
        done = engine.generate([ask(f"r{i} [sleep=0.1]") for i in range(12)])
    assert all(c.finish_reason == "stop" for c in done)
    # 12 slow requests through a bound of 3: the server sees 3 at once, never more.
    assert 2 <= server.max_in_flight <= 3


def test_empty_batch_returns_empty_list(server):
    with OpenAIEngine(make_spec(server)) as engine:
        assert engine.generate([]) == []
    assert server.calls == []


# ----- retries and failures -----


def test_5xx_retried_then_succeeds(server):
    server.inject("status_500", times=2, match="flaky")
    with OpenAIEngine(make_spec(server, max_retries=2)) as engine:
        [done] = engine.generate([ask("flaky row")])
    assert done.text == "ECHO: FLAKY ROW"
    assert [c.status for c in server.calls] == [500, 500, 200]


def test_retries_exhausted_gives_error_completion_and_keeps_other_rows(server, caplog):
    server.inject("status_500", times=None, match="doomed")
    with OpenAIEngine(make_spec(server, max_retries=2)) as engine:
        done = engine.generate([ask("ok 1"), ask("doomed row", request_id="r-doomed"), ask("ok 2")])
    assert [c.finish_reason for c in done] == ["stop", "error", "stop"]
    assert done[1].text == "" and "HTTP 500" in done[1].error and "injected 500" in done[1].error
    assert len(server.calls_matching("doomed")) == 3  # first try + 2 retries
    assert "r-doomed" in caplog.text


def test_400_not_retried(server):
    server.inject("status_400", times=None, match="bad")
    with OpenAIEngine(make_spec(server, max_retries=3)) as engine:
        [done] = engine.generate([ask("bad request")])
    assert done.finish_reason == "error" and "HTTP 400" in done.error
    assert len(server.calls) == 1


def test_429_waits_for_retry_after(server):
    server.inject("status_429", times=1, retry_after="0.4")
    with OpenAIEngine(make_spec(server, retry_backoff_s=0.001)) as engine:
        start = time.monotonic()
        [done] = engine.generate([ask("busy")])
        elapsed = time.monotonic() - start
    assert done.text == "ECHO: BUSY"
    assert [c.status for c in server.calls] == [429, 200]
    # Own backoff would be ~1 ms; only Retry-After explains waiting this long.
    assert elapsed >= 0.4


def test_timeout_retried_then_succeeds(server):
    server.inject("sleep", times=1, sleep_s=1.5)
    with OpenAIEngine(make_spec(server, timeout_s=0.3, max_retries=1)) as engine:
        [done] = engine.generate([ask("slow once")])
    assert done.text == "ECHO: SLOW ONCE"
    assert len(server.calls) == 2


def test_timeout_exhausted_gives_error_completion(server):
    server.inject("sleep", times=None, sleep_s=1.0)
    with OpenAIEngine(make_spec(server, timeout_s=0.2, max_retries=1)) as engine:
        start = time.monotonic()
        [done] = engine.generate([ask("always slow")])
        elapsed = time.monotonic() - start
    assert done.finish_reason == "error" and "timeout after 0.2s" in done.error
    assert len(server.calls) == 2
    assert elapsed < 1.0  # the client gave up; it did not wait for the server


def test_connection_refused_is_an_error_completion():
    spec = EngineSpec(kind="openai", base_url="http://127.0.0.1:9/v1", max_retries=1, retry_backoff_s=0.01)
    with OpenAIEngine(spec) as engine:
        [done] = engine.generate([ask("anyone?")])
    assert done.finish_reason == "error" and "ConnectError" in done.error


def test_malformed_200_is_an_error_completion(server):
    server.inject("garbage", times=None)
    with OpenAIEngine(make_spec(server)) as engine:
        [done] = engine.generate([ask("x")])
    assert done.finish_reason == "error" and "choices[0].message" in done.error
    assert len(server.calls) == 1


def test_bad_messages_field_is_an_error_completion(server):
    with OpenAIEngine(make_spec(server)) as engine:
        bad = ChatRequest(messages="not a list")  # type: ignore[arg-type]
        done = engine.generate([bad, ask("fine")])
    assert done[0].finish_reason == "error" and "request.messages" in done[0].error
    assert done[1].text == "ECHO: FINE"


# ----- auth and secret hygiene -----


def test_bearer_header_from_env_var(server, monkeypatch):
    server.reset(api_key=SECRET)
    monkeypatch.setenv(KEY_ENV, SECRET)
    with OpenAIEngine(make_spec(server, api_key_env=KEY_ENV)) as engine:
        [done] = engine.generate([ask("authorised")])
    assert done.text == "ECHO: AUTHORISED"
    assert server.calls[0].headers["authorization"] == f"Bearer {SECRET}"


def test_no_auth_header_without_api_key_env(server):
    with OpenAIEngine(make_spec(server)) as engine:
        engine.generate([ask("anonymous")])
    assert "authorization" not in server.calls[0].headers


def test_missing_env_var_error_names_the_variable(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=KEY_ENV):
        OpenAIEngine(make_spec(server, api_key_env=KEY_ENV))


def test_wrong_key_fails_at_once_and_never_leaks(server, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)  # includes httpx/httpcore debug records
    wrong = SECRET + "-wrong"
    server.reset(api_key=SECRET)
    monkeypatch.setenv(KEY_ENV, wrong)
    with OpenAIEngine(make_spec(server, api_key_env=KEY_ENV, max_retries=3)) as engine:
        [done] = engine.generate([ask("let me in", request_id="r-auth")])
        engine_repr = repr(engine) + str(engine)
    assert done.finish_reason == "error" and "HTTP 401" in done.error
    assert len(server.calls) == 1  # 401 is not retried
    # The fake server echoed the presented key in its 401 body; it must be scrubbed everywhere.
    assert "invalid api key: Bearer ***" in done.error
    assert "r-auth" in caplog.text  # the failure was logged...
    for text in (done.error, repr(done), engine_repr, caplog.text, *(r.getMessage() for r in caplog.records)):
        assert wrong not in text and SECRET not in text


def test_retry_logs_never_contain_key(server, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    server.reset(api_key=SECRET)
    server.inject("status_500", times=None, match="leak")
    monkeypatch.setenv(KEY_ENV, SECRET)
    with OpenAIEngine(make_spec(server, api_key_env=KEY_ENV, max_retries=2)) as engine:
        [done] = engine.generate([ask("leak check")])
    assert done.finish_reason == "error"
    assert "retry 1" in caplog.text and "retry 2" in caplog.text
    assert SECRET not in caplog.text


def test_key_with_control_characters_rejected_without_echo(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-abc\r\ndef")
    with pytest.raises(ValueError) as info:
        OpenAIEngine(make_spec(server, api_key_env=KEY_ENV))
    assert KEY_ENV in str(info.value) and "abc" not in str(info.value)


# ----- reasoning / thinking -----


@pytest.mark.parametrize("marker", ["[think]", "[reasoning_content]", "[reasoning]"])
def test_reasoning_separated_from_answer(server, marker):
    with OpenAIEngine(make_spec(server)) as engine:
        [done] = engine.generate([ask(f"why {marker}")])
    assert done.text == f"ECHO: WHY {marker.upper()}"
    assert done.reasoning == REASONING
    if marker == "[think]":
        assert done.raw_text.startswith("<think>")


def test_length_finish_reason_mapped(server):
    with OpenAIEngine(make_spec(server)) as engine:
        [done] = engine.generate([ask("cut [length]")])
    assert done.finish_reason == "length"


def test_parse_chat_response_unclosed_think_and_missing_usage():
    payload = {"choices": [{"message": {"content": "<think>still going"}, "finish_reason": "length"}]}
    done = parse_chat_response(payload)
    assert (done.text, done.reasoning, done.finish_reason) == ("", "still going", "length")
    assert (done.prompt_tokens, done.completion_tokens) == (0, 0)


# ----- pure helpers -----


def test_backoff_is_exponential_with_jitter_and_honours_retry_after():
    # base * 2**attempt * (0.5 + jitter): jitter 0.5 gives the plain doubling 0.5, 1, 2, 4
    assert [compute_backoff_s(a, 0.5, None, jitter=0.5) for a in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert compute_backoff_s(1, 0.5, None, jitter=0.0) == 0.5  # lower edge: half of 1.0
    assert compute_backoff_s(3, 0.5, 7.0, jitter=0.9) == 7.0  # Retry-After wins
    assert compute_backoff_s(0, 0.5, 3600.0, jitter=0.0) == 60.0  # ...but is capped


def test_parse_retry_after_forms():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("2", now) == 2.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:05 GMT", now) == 5.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # past date: go now
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


@pytest.mark.parametrize(
    "field, value",
    [("base_url", "127.0.0.1:8000"), ("max_concurrency", 0), ("timeout_s", 0), ("max_retries", -1)],
)
def test_bad_spec_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"engine.{field}"):
        OpenAIEngine(EngineSpec(kind="openai", **{field: value}))
