"""quorum's reward service as the reward of TRL, OpenRLHF and verl (docs/trainers.md), against a real `quorum serve`.

One `quorum serve configs/grm.yaml` process (its own local Ray, real Serve, real HTTP) serves the module. Its judge
is a scripted hosted model (tests/fake_openai_server.py, the edge of the world) that answers MENLO's grade blocks
with the judge-gaming fixture's weaknesses (tests/test_judge_gaming.py: the longer answer wins, then the quality
mark, then the first slot), and answers a prompt holding UNJUDGEABLE with text no parser reads: a real judgment
failure, which the service reports as a null reward and counts. Everything else runs for real: TRL's GRPOTrainer on
the bundled SmolLM2, OpenRLHF's body and response handling (openrlhf 0.11.2), verl's calling convention (0.9.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer

from tests.scripted_menlo_judge import UNJUDGEABLE, judge_reply
from tests.serve_process import wait_until_ready
from tests.test_judge_gaming import GROUP, GROUPS_PER_STEP, STEPS, honest, length_gaming
from tests.test_serve_app import free_port
from tests.trainer_conventions import (
    FakeVLLMEngine,
    openrlhf_query,
    openrlhf_reward,
    verl_custom_reward_fn,
    verl_run_single,
)

# a `quorum serve` with its own Ray cluster serves the module; the TRL test trains SmolLM2
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONTEXT = {"dimension": "fluency", "locale": "en_US"}
# labelled pairs for the service's probe monitor: gold prefers what the scripted judge prefers (the longer answer)
PROBE = [{"pair_id": f"probe-{i}", "prompt": "Describe the harbor.", "gold_a": a, "gold_b": b, **CONTEXT,
          "response_a": ra, "response_b": rb}
         for i, (ra, rb, a, b) in enumerate([("The harbor is calm and full of small boats at dawn.", "Boats.", 5, 2),
                                             ("Calm.", "Gulls circle the harbor while fishermen mend their nets.", 1, 4)])]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with scripted_service(tmp_path_factory) as running:
        yield running


@contextlib.contextmanager
def scripted_service(tmp_path_factory):
    """`quorum serve` with the scripted judge, no auth (OpenRLHF's HTTP path sends no token), its own Ray, and the
    monitors logged to offline W&B runs under `wandb_dir`. `stop()` ends it (the W&B files are complete then)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="qt", dir="/tmp"))
    wandb_dir = tmp_path_factory.mktemp("serve-wandb")
    probe = wandb_dir.parent / "probe.jsonl"
    probe.write_text("".join(json.dumps(row) + "\n" for row in PROBE))
    port = free_port()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline",
           "WANDB_DIR": str(wandb_dir)}
    env.pop("RAY_ADDRESS", None)
    with FakeOpenAIServer(reply=judge_reply) as judge:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "serve", "configs/grm.yaml", f"serve.port={port}",
             "serve.auth_token_env=", "resources.num_cpus=0.25", "ray.num_cpus=2", "health.probe=false",
             "shutdown.wait_loop_s=0.1",
             f"judge.engine={{kind: openai, model: scripted-judge, base_url: '{judge.base_url}', max_retries: 0}}",
             "judge.constrained=false", "cache_size=0", "wandb.enabled=true", "wandb.mode=offline",
             f"monitor.probe_path={probe}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        base = f"http://127.0.0.1:{port}"

        def stop() -> str:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            return proc.stdout.read()

        try:
            wait_until_ready(proc, base)
            yield SimpleNamespace(url=base, judge=judge, stop=stop, wandb_dir=wandb_dir)
        finally:
            stop()
            shutil.rmtree(ray_tmp, ignore_errors=True)


def caller_stats(service, name: str) -> dict:
    return httpx.get(f"{service.url}/stats", timeout=30).json()["callers"][name]


# ---------------------------------------------------------------------------------------------------------------
# The clients stay light


def test_the_trainer_clients_import_neither_torch_nor_ray():
    code = ("import sys, serve.clients.trl, serve.clients.verl, serve.clients.openrlhf\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------
# TRL


def test_trl_grpo_trains_two_steps_on_the_services_rewards(service, smollm2_dir, tmp_path):
    """A real GRPOTrainer run (SmolLM2, CPU, num_generations=2): each step one judgeable prompt and one the judge
    cannot grade. TRL's per-completion rewards are the ones the service recorded for this caller, step by step; the
    unjudged completions are NaN in TRL (no reward, zero advantage), never 0, and counted through log_metric."""
    import pandas as pd
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from serve.clients.trl import QuorumReward

    reward = QuorumReward(service.url, caller="trl-run", scheme="all_pairs", signal="own_grade", **CONTEXT)
    data = Dataset.from_list([{"prompt": "Write one sentence about a river."},
                              {"prompt": f"{UNJUDGEABLE}: write one sentence about a lantern."}])
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, learning_rate=1e-6, beta=0.0, logging_steps=1, log_completions=True,
                      report_to=[], save_strategy="no", use_cpu=True, bf16=False, seed=0, temperature=1.0)
    trainer = GRPOTrainer(model=smollm2_dir, reward_funcs=reward, args=args, train_dataset=data)
    try:
        trainer.train()
    finally:
        reward.close()

    logs = [entry for entry in trainer.state.log_history if "quorum/failed_rows" in entry]
    assert len(logs) == 2
    for entry in logs:
        # one call per step: 4 completions, the UNJUDGEABLE prompt's 2 without a reward, its 1 judgment failed
        assert entry["quorum/rows"] == 4 and entry["quorum/failed_rows"] == 2
        assert entry["quorum/failed_judgments"] == 1 and entry["quorum/failed_groups"] == 0
    stats = caller_stats(service, "trl-run")
    assert stats["null_rewards"] == 4 and stats["failed_judgments"] == 2 and stats["rollouts"] == 8
    for step in (0, 1):  # TRL's global_step when it generated the batch
        table = pd.read_parquet(tmp_path / "trl" / "completions" / f"completions_{step + 1:05d}.parquet")
        logged = table["quorum"].tolist()
        recorded = [r for group in stats["record"] if group["step"] == step for r in group["rewards"]]
        assert len(logged) == len(recorded) == 4
        assert sorted(r for r in logged if not math.isnan(r)) == sorted(r for r in recorded if r is not None)
        assert sum(math.isnan(r) for r in logged) == sum(r is None for r in recorded) == 2
        judged = [r for r in recorded if r is not None]
        assert all(r in (2.0, 3.0, 4.0) for r in judged), judged


# ---------------------------------------------------------------------------------------------------------------
# The monitors on the service side


def send_policy(reward, policy, seed: int = 0) -> None:
    """The gaming fixture's steps through the TRL reward function, called as TRL calls it."""
    rng = random.Random(seed)
    metrics: dict[str, list[float]] = {}
    for step in range(1, STEPS + 1):
        prompts, completions = [], []
        for g in range(GROUPS_PER_STEP):
            group = policy(rng, step)
            prompts += [f"Describe place {g} of step {step}."] * GROUP
            completions += group
        rewards = reward(prompts=prompts, completions=completions, completion_ids=[[0]] * len(completions),
                         trainer_state=SimpleNamespace(global_step=step),
                         log_metric=lambda name, value: metrics.setdefault(name, []).append(value))
        assert len(rewards) == len(completions) and None not in rewards
    assert sum(metrics["quorum/failed_rows"]) == 0


@pytest.fixture(scope="module")
def monitored(service):
    """The service after two TRL callers' traffic, sent once (either test reading it runs alone too)."""
    from serve.clients.trl import QuorumReward

    gaming = QuorumReward(service.url, caller="gaming-run", signal="own_grade", **CONTEXT)
    honest_run = QuorumReward(service.url, caller="honest-run", signal="own_grade", **CONTEXT)
    try:
        send_policy(gaming, length_gaming)
        send_policy(honest_run, honest)
    finally:
        gaming.close()
        honest_run.close()
    return service


def test_length_gaming_through_the_trl_reward_raises_the_length_alert_on_the_service(monitored):
    service = monitored  # the module's service, after the two callers' traffic
    stats = caller_stats(service, "gaming-run")
    corr = [a for a in stats["alerts"] if a["monitor"] == "length_corr"]
    # the service's window (monitor.length_corr_window 3) fills at the third monitored step
    assert corr and corr[0]["step"] <= 3 and corr[0]["value"] == pytest.approx(1.0), stats["alerts"]
    assert corr[0]["key"] == "monitor.length_corr_max"
    assert stats["metrics"]["monitor/length/reward_corr_window"] == pytest.approx(1.0)
    assert stats["steps_monitored"] == STEPS - 1 and stats["open_step"] == STEPS
    assert {a["monitor"] for a in stats["alerts"]} <= {"length_corr", "length_ratio"}
    assert caller_stats(service, "honest-run")["alerts"] == []
    # the probe set after each monitored step (asynchronously): the scripted judge agrees with its gold
    deadline = time.monotonic() + 60
    while "monitor/probe/accuracy" not in stats["metrics"]:
        assert time.monotonic() < deadline, stats["metrics"]
        time.sleep(0.1)
        stats = caller_stats(service, "gaming-run")
    assert stats["metrics"]["monitor/probe/accuracy"] == 1.0 and stats["metrics"]["monitor/probe/pairs"] == 2.0
    assert stats["metrics"]["monitor/probe/failed"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF (0.11.2)


def test_openrlhf_remote_rm_gets_rewards_it_accepts(service, smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say something about rivers."}],
                                           tokenize=False, add_generation_prompt=True)
    response = "Rivers carry water from the hills down to the sea every single day."
    query = openrlhf_query(tokenizer, prompt, response)
    assert query.endswith(tokenizer.eos_token) and query != prompt + response

    got = openrlhf_reward(f"{service.url}/openrlhf?caller=orl-run&dimension=fluency&locale=en_US", query, prompt, None)
    expected = min(5, 1 + len(response.split()) // 3)  # the scripted pointwise grade of the recovered response
    assert got["reward"].flatten().tolist() == [expected] and got["score"].flatten().tolist() == [expected]
    assert got["extra"]["quorum_failed"].flatten().tolist() == [0.0]
    # the shape PPO's experience maker concatenates and reshapes per prompt group (n_samples_per_prompt = 2)
    both = __import__("torch").cat([got["reward"].reshape(1), got["reward"].reshape(1)]).reshape(-1, 2)
    assert both.shape == (1, 2)

    # vs_reference: the label is the reference
    ref = openrlhf_reward(f"{service.url}/openrlhf?scheme=vs_reference&dimension=fluency&locale=en_US", query,
                          prompt, "Rivers flow.")
    assert ref["reward"].flatten().tolist() == [4.0]  # longer than the reference: the scripted judge gives it 4
    # OpenRLHF's default label is empty: never judged as a reference
    empty = httpx.post(f"{service.url}/openrlhf?scheme=vs_reference&dimension=fluency&locale=en_US",
                       json={"query": [query], "prompts": [prompt], "labels": [""]}, timeout=60)
    assert empty.status_code == 400 and "labels[0]" in empty.text, empty.text

    # a judgment that fails: 502 without failed_reward (OpenRLHF retries, then has no reward); counted with it
    bad_prompt = prompt.replace("Say something", f"{UNJUDGEABLE} say something")
    bad_query = openrlhf_query(tokenizer, bad_prompt, response)
    refused = httpx.post(f"{service.url}/openrlhf?scheme=vs_reference&dimension=fluency&locale=en_US",
                         json={"query": [bad_query], "prompts": [bad_prompt], "labels": ["Rivers flow."]}, timeout=60)
    assert refused.status_code == 502 and "query[0]" in refused.json()["error"]["message"]
    failed = openrlhf_reward(f"{service.url}/openrlhf?scheme=vs_reference&failed_reward=0&caller=orl-run&"
                             "dimension=fluency&locale=en_US", bad_query, bad_prompt, "Rivers flow.")
    assert failed["reward"].flatten().tolist() == [0.0]
    assert failed["extra"]["quorum_failed"].flatten().tolist() == [1.0]
    stats = caller_stats(service, "orl-run")
    assert stats["rollouts"] == 2 and stats["null_rewards"] == 1


def test_openrlhf_own_executor_gets_the_services_reward(service, smollm2_dir):
    """Through OpenRLHF's own code where it installs (`pip install --no-deps openrlhf`: its agent module needs no
    GPU; its vLLM engine is faked): `SingleTurnAgentExecutor.execute` tokenizes, posts to --reward.remote_url and
    reads the answer; the reward becomes `torch.tensor([reward_val])` as samples_generator.py does (that module
    imports vLLM, so it is replicated)."""
    agent = pytest.importorskip("openrlhf.utils.agent", reason="openrlhf is not installed (it is not a quorum "
                                                              "dependency: its GPU stack does not install on CPU)")
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say something about rivers."}],
                                           tokenize=False, add_generation_prompt=True)
    response = "Rivers carry water from the hills down to the sea every single day."
    engine = FakeVLLMEngine(tokenizer(text=response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    executor = agent.SingleTurnAgentExecutor(f"{service.url}/openrlhf?caller=orl-own&dimension=fluency&locale=en_US")
    params = SimpleNamespace(max_tokens=32, logprobs=None)
    output = asyncio.run(executor.execute(prompt, None, params, 512, tokenizer, engine))
    expected = float(min(5, 1 + len(response.split()) // 3))
    assert output["reward"] == [expected] and output["scores"] == [expected], output
    assert output["extra_logs"] == {"quorum_failed": [0.0]}
    assert torch.tensor([output["reward"]]).flatten().tolist() == [expected]
    assert caller_stats(service, "orl-own")["rollouts"] == 1


def test_openrlhf_reward_func_file_judges_the_response_in_the_query(service, monkeypatch):
    """The `.py` form OpenRLHF loads with `spec_from_file_location` and calls as reward_func(queries, prompts, labels):
    the response is what follows the prompt in the query, judged through the service."""
    import importlib.util

    from serve.clients import openrlhf

    monkeypatch.setenv("QUORUM_REWARD_URL", f"{service.url}/openrlhf?dimension=fluency&locale=en_US")
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.reward_func(["Q: hi A: three small words<|im_end|>"], ["Q: hi A: "], [None])
    assert out["rewards"] == [2.0] and out["extra_logs"]["quorum_failed"] == [0.0]


# ---------------------------------------------------------------------------------------------------------------
# verl (0.9.1)


def test_verl_naive_manager_calls_compute_score_per_response(service):
    from serve.clients.verl import RewardJudgmentError

    kwargs = {"url": service.url, "caller": "verl-run", **CONTEXT}
    fn = verl_custom_reward_fn("pkg://serve.clients.verl", "compute_score", kwargs)
    response = "The river bends twice before it reaches the old mill."
    out = verl_run_single(fn, "menlo", response, "unused", {"question": "Describe a river.", "index": 0})
    assert out["reward_score"] == float(min(5, 1 + len(response.split()) // 3))
    assert out["reward_extra_info"]["quorum_failed"] == 0.0

    ref = verl_custom_reward_fn("pkg://serve.clients.verl", "compute_score", {**kwargs, "scheme": "vs_reference"})
    assert verl_run_single(ref, "menlo", response, "A river.", {"question": "Describe a river."})["reward_score"] == 4.0

    with pytest.raises(RewardJudgmentError, match="failed_reward"):
        verl_run_single(fn, "menlo", response, None, {"question": f"{UNJUDGEABLE} river"})
    lenient = verl_custom_reward_fn("pkg://serve.clients.verl", "compute_score",
                                    {**kwargs, "failed_reward": "neutral"})
    failed = verl_run_single(lenient, "menlo", response, None, {"question": f"{UNJUDGEABLE} river"})
    assert failed["reward_score"] == 3.0 and failed["reward_extra_info"]["quorum_failed"] == 1.0  # mid 1-5
    with pytest.raises(ValueError, match="extra_info"):
        verl_run_single(fn, "menlo", response, None, {"index": 3})
    assert caller_stats(service, "verl-run")["null_rewards"] == 2


def test_verl_group_function_groups_rows_by_prompt(service):
    """compute_score_batch(data_sources=, solution_strs=, ground_truths=, extra_infos=, **reward_kwargs), as
    QuorumRewardManager calls it (tests/test_trainer_clients_e2e.py runs the manager in verl): one score per row,
    consecutive rows with the same prompt judged as one group."""
    fn = verl_custom_reward_fn("pkg://serve.clients.verl", "compute_score_batch",
                               {"url": service.url, "caller": "verl-batch", "signal": "own_grade", **CONTEXT})
    solutions = ["short one", "a much longer answer than the other one here", "mid length answer", "tiny"]
    infos = [{"question": "P1", "rollout_reward_scores": {}}] * 2 + [{"question": "P2", "rollout_reward_scores": {}}] * 2
    scores = fn(data_sources=["menlo"] * 4, solution_strs=solutions, ground_truths=[None] * 4, extra_infos=infos)
    assert [s["score"] for s in scores] == [2.0, 4.0, 4.0, 2.0]  # each pair: the longer answer wins 4 to 2
    assert caller_stats(service, "verl-batch")["groups"] == 2


# ---------------------------------------------------------------------------------------------------------------
# W&B (last: it stops the service, so that the offline run files are complete)


def test_the_monitors_reach_wandb_under_monitor_keys_one_run_per_caller(monitored):
    from wandb_reader import find_run_files, read_run

    service = monitored
    caller_stats(service, "gaming-run")  # the length-gaming caller was monitored
    service.stop()
    runs = {r["run"]["name"]: r for r in (read_run(f) for f in find_run_files(service.wandb_dir))}
    assert {"serve/gaming-run", "serve/honest-run"} <= set(runs), sorted(runs)
    gaming = runs["serve/gaming-run"]
    assert gaming["run"]["group"] == "gaming-run" and gaming["run"]["job_type"] == "serve_monitor"
    alerts = [h for h in gaming["history"] if h.get("monitor/length_corr/alert") == 1.0]
    assert alerts and alerts[0]["_step"] <= 3 and alerts[0]["monitor/length/reward_corr_window"] == pytest.approx(1.0)
    assert any(h.get("monitor/probe/accuracy") == 1.0 for h in gaming["history"])
    honest_history = runs["serve/honest-run"]["history"]
    assert honest_history and all(h.get("monitor/length_corr/alert", 0.0) == 0.0 for h in honest_history)
