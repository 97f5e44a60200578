"""The real GRM Serve app on CPU: tiny random Llama (+ real peft LoRA adapters), one SmolLM2 check, real HTTP.

One app serves the module (auth on, adapter 1); the hot-swap test re-runs `serve.run` with adapter 2 while a
client keeps calling it. The bearer token is exported in this process only, after the session's Ray started:
it reaches the replicas the way `quorum serve` sends it, as the deployment's constructor argument (actors.secrets).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import load_config
from serve.config import ServeConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
APP, PREFIX = "grm-test", "/grm"
TOKEN_ENV, TOKEN = "QUORUM_TEST_GRM_TOKEN", "test-token-5f2c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = "The committee postponed the decision because several members were absent."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_adapter(model_dir: str, out_dir: Path, seed: int) -> str:
    """A real LoRA adapter as a training run would save it (random, non-zero B so it changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out_dir)
    return str(out_dir)


def tiny_config(model_dir: str, adapter: str, port: int) -> ServeConfig:
    return load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
        f"judge.engine.model={model_dir}", "judge.engine.dtype=float32", "judge.engine.num_threads=1",
        f"judge.adapter={adapter}", f"serve.port={port}", f"serve.app_name={APP}", f"serve.route_prefix={PREFIX}",
        f"serve.auth_token_env={TOKEN_ENV}", "resources.num_cpus=0.5", "sampling.max_tokens=8",
        "batching.max_batch_size=8", "batching.batch_wait_timeout_s=0.2",
        # a stopping replica (the swap, the module's end) checks for ongoing requests every 0.1 s, not 2 s
        "shutdown.wait_loop_s=0.1",
        # the HTTP machinery is tested with paper 001's short templates; MENLO's run in the SmolLM2 test below
        "prompts.pointwise=jury_score", "prompts.pointwise_format=answer",
        "prompts.pointwise_vars={prompt: base_sentence, response: new_sentence}",
        "prompts.pairwise=jury_pairwise",
        "prompts.pairwise_vars={prompt: source, response_a: candidate_a, response_b: candidate_b}",
    ])


def deploy(app, name: str, prefix: str, timeout_s: float = 180) -> None:
    from ray import serve

    serve.run(app, name=name, route_prefix=prefix, blocking=False)
    deadline = time.monotonic() + timeout_s
    while serve.status().applications[name].status != "RUNNING":
        assert time.monotonic() < deadline, f"{name} not RUNNING: {serve.status().applications[name]}"
        time.sleep(0.1)


def deploy_tiny(cfg: ServeConfig) -> None:
    from serve.app import make_app

    deploy(make_app(cfg), APP, PREFIX)


@pytest.fixture(scope="module")
def grm(ray_local, tiny_model_dir, tmp_path_factory):
    from ray import serve

    root = tmp_path_factory.mktemp("grm-runs")
    adapters = [make_adapter(tiny_model_dir, root / f"run{i}" / "adapter", seed=i) for i in (1, 2)]
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    os.environ[TOKEN_ENV] = TOKEN
    deploy_tiny(tiny_config(tiny_model_dir, adapters[0], port))
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}{PREFIX}", timeout=60)
    yield {"client": client, "port": port, "adapters": adapters, "model_dir": tiny_model_dir}
    client.close()
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


def test_health_and_ready_report_the_model_with_its_adapter(grm):
    client = grm["client"]
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready").json()
    assert ready["ready"] is True and ready["auth"] is True
    assert ready["adapter"] == grm["adapters"][0] and f"adapter={grm['adapters'][0]}#" in ready["model_identity"]


def test_missing_or_wrong_token_is_rejected(grm):
    client = grm["client"]
    body = {"prompt": PROMPT, "response": "The vote was delayed."}
    missing = client.post("/score", json=body)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/score", json=body, headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert client.get("/stats").status_code == 401


def test_score_compare_and_chat_endpoints(grm):
    client = grm["client"]
    body = {"prompt": PROMPT, "response": "The vote was delayed because people were missing."}
    first = client.post("/score", json=body, headers=AUTH)
    assert first.status_code == 200, first.text
    score = first.json()
    assert score["parse_status"] and score["raw"] and score["cached"] is False
    # judge.constrained (the default) decodes under the verdict grammar: even 8 tokens give a parsed grade
    assert score["parse_status"] == "ok" and 1 <= score["grade"] <= 5, score
    again = client.post("/score", json=body, headers=AUTH).json()
    assert again["cached"] is True and again["raw"] == score["raw"]

    compare = client.post("/compare", json={"prompt": PROMPT, "response_a": "It was delayed.",
                                            "response_b": "<think>short</think>The decision waited.",
                                            "sampling": {"max_tokens": 64}}, headers=AUTH)
    assert compare.status_code == 200, compare.text
    got = compare.json()
    assert got["parse_status"] == "ok" and got["preference"] in ("A", "B", "tie"), got

    chat = client.post("/v1/chat/completions", headers=AUTH, json={
        "model": "whatever", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5, "seed": 1})
    assert chat.status_code == 200, chat.text
    out = chat.json()
    assert isinstance(out["choices"][0]["message"]["content"], str)
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    assert 1 <= out["usage"]["completion_tokens"] <= 5
    assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == out["model"]


@pytest.mark.parametrize("scheme, n, extra, n_judgments", [
    ("all_pairs", 3, {}, 3), ("all_pairs", 3, {"both_orders": True}, 6), ("vs_reference", 2, {"reference": "Ref."}, 2),
])
def test_group_reward_counts_every_judgment(grm, scheme, n, extra, n_judgments):
    responses = [f"Candidate {i}: the decision was put off." for i in range(n)]
    resp = grm["client"].post("/reward/group", headers=AUTH,
                              json={"prompt": PROMPT, "responses": responses, "scheme": scheme, **extra})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    counts = out["counts"]
    assert counts["n_responses"] == n and counts["n_judgments"] == n_judgments == len(out["judgments"])
    assert counts["n_failed_judgments"] == sum(j["parse_status"] != "ok" for j in out["judgments"])
    for item in out["items"]:
        # a reward exists exactly when at least one of the item's judgments parsed: never a silent 0
        assert (item["reward"] is None) == (item["n_failed"] == item["n_judgments"])
        assert len(item["errors"]) == item["n_failed"]
    assert counts["n_null_rewards"] == sum(r is None for r in out["rewards"])
    if scheme == "vs_reference":
        assert all(-1 in (j["a"], j["b"]) for j in out["judgments"])


def test_listwise_group_is_one_judge_call_with_rewards_in_the_permutations_order(grm):
    """scheme listwise (configs/grm.yaml's prompts.listwise): one engine request ranks the group, decoded under
    the permutation grammar; reward i = (n - 1 - position of i) / (n - 1). Same answer through the Serve handle
    (from the cache: no further engine request); a pairwise body keeps its shape, with `listwise` null."""
    from ray import serve

    client = grm["client"]
    responses = [f"Listwise candidate {i}: the decision was put off." for i in range(4)]
    body = {"prompt": PROMPT, "responses": responses, "scheme": "listwise", "dimension": "fluency",
            "locale": "en_US", "sampling": {"max_tokens": 64}}
    before = client.get("/stats", headers=AUTH).json()["engine_requests"]
    resp = client.post("/reward/group", headers=AUTH, json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert client.get("/stats", headers=AUTH).json()["engine_requests"] - before == 1
    verdict = out["listwise"]
    assert verdict["parse_status"] == "ok" and sorted(verdict["order"]) == [0, 1, 2, 3], verdict
    expected = [0.0] * 4
    for position, index in enumerate(verdict["order"]):
        expected[index] = (3 - position) / 3
    assert out["rewards"] == pytest.approx(expected)
    assert out["scheme"] == "listwise" and out["judgments"] == [] and out["counts"]["n_judgments"] == 1
    status, handled = serve.get_app_handle(APP).reward_group_in_cluster.remote(body).result(timeout_s=120)
    assert status == 200 and handled["rewards"] == out["rewards"] and handled["listwise"]["cached"] is True
    assert client.get("/stats", headers=AUTH).json()["engine_requests"] - before == 1
    status, refused = serve.get_app_handle(APP).reward_group_in_cluster.remote(
        {**body, "responses": ["x"] * 10}).result(timeout_s=120)
    assert status == 400 and refused["error"]["param"] == "responses"
    pairwise = client.post("/reward/group", headers=AUTH, json={"prompt": PROMPT, "responses": responses[:2]})
    assert pairwise.status_code == 200 and pairwise.json()["listwise"] is None


@pytest.mark.parametrize("body, status, field", [
    ({"prompt": PROMPT}, 422, "responses"),
    ({"prompt": PROMPT, "responses": ["a", "b"], "sampling": {"temperature": "hot"}}, 422, "sampling.temperature"),
    ({"prompt": PROMPT, "responses": ["a", "b"], "scheme": "best_of_n"}, 422, "scheme"),
    ({"prompt": PROMPT, "responses": ["only one"]}, 400, "responses"),
    ({"prompt": PROMPT, "responses": ["x"] * 17}, 400, "responses"),
    ({"prompt": PROMPT, "responses": ["a", "b"], "scheme": "vs_reference"}, 400, "reference"),
    ({"prompt": PROMPT, "responses": ["a", "b" * 20_001]}, 400, "responses[1]"),
    ({"prompt": PROMPT, "responses": ["a", "b"], "sampling": {"max_tokens": 99_999}}, 400, "sampling.max_tokens"),
    ({"prompt": PROMPT, "responses": ["a", "b"], "dimension": "tone"}, 400, "dimension"),
])
def test_invalid_requests_get_4xx_naming_the_field(grm, body, status, field):
    resp = grm["client"].post("/reward/group", json=body, headers=AUTH)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and error["message"].startswith(field)


# raw JSON (NaN and "\ud800" escapes are valid JSON text that json.dumps would not write this way)
POISON = [
    ("/score", '{"prompt": "P", "response": "r", "sampling": {"temperature": 0.7, "seed": 1180591620717411303424}}',
     "sampling.seed"),
    ("/score", '{"prompt": "P", "response": "r", "sampling": {"temperature": NaN}}', "sampling.temperature"),
    ("/score", '{"prompt": "P \\ud800", "response": "r"}', "prompt"),
    ("/reward/group", '{"prompt": "P", "responses": ["ok", "bad \\ud800"]}', "responses.1"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\udfff"}], "max_tokens": 4}',
     "messages.0.content"),
    ("/v1/chat/completions", ('{"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, '
                             '"seed": 1180591620717411303424, "max_tokens": 4}'), "seed"),
]


@pytest.mark.parametrize("path, raw, field", POISON)
def test_a_bad_request_fails_alone_while_its_batch_succeeds(grm, path, raw, field):
    """One bad and three good requests at once (one batch window): the bad one gets its own 4xx naming the
    field, with a JSON body; the three good ones are answered."""
    client = grm["client"]
    tag = f"{path}-{field}"

    async def burst():
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=120, headers=AUTH) as aclient:
            bad = aclient.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})
            good = [aclient.post("/score", json={"prompt": PROMPT, "response": f"good reply {i} for {tag}",
                                                 "sampling": {"temperature": 0.7, "seed": i}}) for i in range(3)]
            return await asyncio.gather(bad, *good)

    bad, *good = asyncio.run(burst())
    assert 400 <= bad.status_code < 500, bad.text
    error = bad.json()["error"]
    assert error["param"] == field and error["message"].startswith(field)
    assert [r.status_code for r in good] == [200, 200, 200], [r.text for r in good]


@pytest.mark.parametrize("raw", [
    b"not json", b"[1, 2]", b"null", b'"text"', b"\xff\xfe\x00bad bytes", b'{"prompt": ', b"{" * 5000,
    b'{"prompt": "P", "response": "r", "timeout_s": Infinity}',
    b'{"prompt": "P", "response": "r", "sampling": {"max_tokens": 1180591620717411303424}}',
    b'{"prompt": "P", "response": "r", "sampling": {"top_p": -Infinity}}',
    b'{"prompt": "P", "response": ["r"]}', b'{"prompt": "P", "response": "r", "locale": "\\ud800"}',
    b'{"prompt": "P", "response": "r", "dimension": "\\ud800x"}', b'{"\\ud800": 1, "prompt": "P", "response": "r"}',
])
def test_no_malformed_body_gets_a_5xx(grm, raw):
    resp = grm["client"].post("/score", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert resp.json()["error"]["code"] == resp.status_code


def test_oversize_body_and_deadline(grm):
    client = grm["client"]
    huge = client.post("/score", headers=AUTH, json={"prompt": PROMPT, "response": "y" * 1_100_000})
    assert huge.status_code == 413 and "exceeds the limit" in huge.json()["error"]["message"]
    late = client.post("/score", headers=AUTH, json={"prompt": PROMPT, "response": "unique deadline text",
                                                     "timeout_s": 0.01})
    assert late.status_code == 504 and "deadline" in late.json()["error"]["message"]


def test_concurrent_requests_are_batched(grm):
    client = grm["client"]
    before = client.get("/stats", headers=AUTH).json()["batch_sizes"]

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60, headers=AUTH) as aclient:
            calls = [aclient.post("/score", json={"prompt": PROMPT, "response": f"batched reply number {i}"})
                     for i in range(8)]
            return [r.status_code for r in await asyncio.gather(*calls)]

    assert asyncio.run(burst()) == [200] * 8
    after = client.get("/stats", headers=AUTH).json()["batch_sizes"]
    new = {int(size): count - before.get(size, 0) for size, count in after.items()}
    assert sum(size * count for size, count in new.items()) == 8
    assert max(size for size, count in new.items() if count > 0) > 1, new


def test_rerun_with_new_adapter_swaps_the_model_without_downtime(grm):
    client, (first, second) = grm["client"], grm["adapters"]
    chat = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    before = client.post("/v1/chat/completions", json=chat, headers=AUTH).json()
    old_identity = before["quorum"]["model_identity"]
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def keep_calling() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30, headers=AUTH) as poller:
            while not stop.is_set():
                try:
                    resp = poller.post("/v1/chat/completions", json={**chat, "max_tokens": 2})
                    seen.append((resp.status_code, resp.json()["quorum"]["model_identity"]))
                except (httpx.HTTPError, KeyError) as exc:
                    seen.append((0, repr(exc)))
                time.sleep(0.1)

    thread = threading.Thread(target=keep_calling, daemon=True)
    thread.start()
    try:
        deploy_tiny(tiny_config(grm["model_dir"], second, grm["port"]))
        deadline = time.monotonic() + 60
        while client.get("/ready").json()["adapter"] != second:
            assert time.monotonic() < deadline, "the new adapter never became visible"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=30)
    after = client.post("/v1/chat/completions", json=chat, headers=AUTH).json()
    new_identity = after["quorum"]["model_identity"]
    assert new_identity != old_identity and f"adapter={second}#" in new_identity
    assert after["quorum"]["cached"] is False
    assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]
    failures = [s for s in seen if s[0] != 200]
    assert not failures, failures[:5]
    identities = [identity for _, identity in seen]
    assert old_identity in identities and new_identity in identities
    assert first not in client.get("/ready").json()["model_identity"]


def test_smollm2_menlo_judge_built_from_args(grm, smollm2_dir):
    """configs/grm.yaml as shipped: MENLO pointwise /score with the request's dimension rubric and locale."""
    from ray import serve

    from jobs.serve_grm import app_args
    from serve.app import build_app

    cfg = load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
        f"judge.engine.model={smollm2_dir}", "judge.engine.num_threads=1", "serve.auth_token_env=",
        "resources.num_cpus=0.5", "sampling.max_tokens=64", "serve.app_name=grm-smol", "shutdown.wait_loop_s=0.1"])
    deploy(build_app(app_args(cfg)), "grm-smol", "/smol")
    url = f"http://127.0.0.1:{grm['port']}/smol/score"
    body = {"prompt": "Write a short thank-you note to a colleague.", "response": "Thanks a lot for your help!",
            "dimension": "tone", "locale": "en_US"}
    try:
        resp = httpx.post(url, timeout=120, json=body)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert isinstance(out["parse_status"], str) and out["parse_status"]
        # MENLO's pointwise parser (not paper 001's Answer: [k]) reads the grade the grammar forced
        assert out["parse_status"] == "ok" and 1 <= out["grade"] <= 5, out
        assert isinstance(out["format_ok"], bool) and out["usage"]["completion_tokens"] >= 1
        assert out["usage"]["prompt_tokens"] > 200  # the tone rubric was rendered into the prompt
        for change, field in (({"dimension": None}, "dimension"), ({"dimension": "humour"}, "dimension"),
                              ({"locale": None}, "locale")):
            bad = httpx.post(url, timeout=30, json={k: v for k, v in {**body, **change}.items() if v is not None})
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"]["param"] == field
    finally:
        serve.delete("grm-smol")


# fuzzed bodies (issue 13 §3): real field names with arbitrary JSON values, plus arbitrary JSON documents
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                       st.text(max_size=30))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_FIELDS = ["prompt", "response", "responses", "response_a", "response_b", "reference", "scheme", "both_orders",
           "dimension", "locale", "sampling", "timeout_s", "messages", "max_tokens", "temperature", "seed"]
_bodies = st.one_of(_json, st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6))


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/score", "/compare", "/reward/group", "/v1/chat/completions"]), body=_bodies)
def test_fuzzed_bodies_get_an_answer_or_a_4xx_with_a_json_error(grm, path, body):
    resp = grm["client"].post(path, json=body, headers=AUTH)
    assert resp.status_code < 500, (path, body, resp.status_code, resp.text)
    if resp.status_code >= 400:
        assert resp.json()["error"]["code"] == resp.status_code, resp.text
