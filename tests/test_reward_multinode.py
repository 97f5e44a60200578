"""GRPO's reward transport on a multi-node cluster: a training worker on a node without a GRM replica gets rewards.

A fake multi-node cluster (tests/fake_cluster.py): a head with no CPUs, a `grm_node` (1 CPU) that the GRM replica's
CPU request can only land on, and a `gpu_worker` (no CPU, 4 `gpu_slot`s standing in for GPUs) where the stand-in
training worker runs. Its driver (a subprocess: this process keeps the session's own Ray) deploys the real GRM app
through policy_grpo's own `served_reward` (the scripted hosted judge of tests/fake_openai_server.py behind the
app's `openai` engine, bearer-token auth on), and the worker builds its reward exactly as `train.grpo.loop` does
(`build_reward(spec)`), then scores three groups with the `concurrency` pool.

Why Serve's HTTP proxies are disabled here: on a real cluster a GPU node without a replica runs no proxy (Ray 2.60:
`ServeController._update_proxy_nodes` puts them on the head and the replicas' nodes only), so its
`http://127.0.0.1:<port>` refuses connections. The fake nodes of one machine share one loopback, where the head's
proxy would answer for the missing one; with no proxy anywhere, every node sees what that GPU node sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_cluster import FakeCluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
APP, TOKEN_ENV = "grm-multinode", "QUORUM_TEST_MULTINODE_TOKEN"

DRIVER = f"""
import dataclasses, json, sys

import ray
from ray import serve

import jobs.policy.grpo as job
from actors.secrets import Secrets
from core.config import load_config
from core.ray_env import RayConfig, init_ray
from fake_openai_server import FakeOpenAIServer
from train.grpo.reward.build import build_reward

GRADES = ("<final_grade_A> FINAL GRADE: 5 - EXCELLENT </final_grade_A>"
          "<final_grade_B> FINAL GRADE: 2 - MINOR FAILURE </final_grade_B>")


@ray.remote(num_cpus=0, resources={{"gpu_slot": 1}})
def training_worker(spec, secrets, rows, completions):
    secrets.install()  # what train.grpo.loop does on every rank, then builds its reward from the spec
    reward = build_reward(spec, seed=0)
    try:
        outcomes = reward(rows, completions)
        # requests the app refuses, answered as its HTTP route would: 400 (its own check), 422 (validation)
        outcomes += [reward.client.score("p", ["only one"]), reward.client.score("p", ["a", "b"], scheme="bogus")]
    finally:
        reward.close()
    return ray.get_runtime_context().get_node_id(), [dataclasses.asdict(o) for o in outcomes]


init_ray(RayConfig(address=sys.argv[1]))
serve.start(proxy_location="Disabled")  # see the test module's docstring
with FakeOpenAIServer(reply=lambda message: GRADES) as judge:
    cfg = load_config(job.Config, "configs/policy_grpo_demo.yaml",
                      ["reward.retries=1", "reward.backoff_s=0.05", "reward.timeout_s=60"])
    cfg.grm.overrides = [*cfg.grm.overrides, "serve.app_name={APP}", "serve.port=" + sys.argv[2],
                         "serve.auth_token_env={TOKEN_ENV}", "judge.engine.kind=openai",
                         "judge.engine.base_url=" + judge.base_url, "judge.engine.model=scripted-judge",
                         "resources.num_cpus=1", "health.probe=false", "shutdown.wait_loop_s=0.1"]
    rows = [{{"judge_prompt": f"prompt {{i}}", "dimension": "tone", "locale": "de_DE"}} for i in range(3)]
    completions = [[f"answer {{i}} a", f"answer {{i}} b"] for i in range(3)]
    with job.served_reward(cfg) as (spec, secret):
        # the secret worker env travels as run_grpo sends it (train.grpo.trainer: Secrets in the loop config)
        node, outcomes = ray.get(training_worker.remote(spec, Secrets(secret), rows, completions), timeout=300)
    print("RESULT " + json.dumps({{"spec": spec, "secret_names": sorted(secret), "worker_node": node,
                                   "outcomes": outcomes, "judge_calls": len(judge.calls)}}), flush=True)
"""


@pytest.fixture
def cluster(tmp_path):
    types = {"grm_node": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 1, "max_workers": 1},
             "gpu_worker": {"resources": {"CPU": 0, "gpu_slot": 4}, "node_config": {}, "min_workers": 1,
                            "max_workers": 1}}
    fake = FakeCluster(types, head_cpus=0, idle_timeout_minutes=5, max_workers=2)
    try:
        fake.start()
        yield fake
    finally:
        fake.keep_logs(tmp_path / "cluster-logs")  # pytest keeps tmp_path of its last runs: read a failure there
        fake.stop()


def test_training_worker_on_a_node_without_a_replica_gets_rewards(cluster, tmp_path):
    cluster.wait_for(lambda: len(cluster.nodes()) == 3, "the grm_node and gpu_worker nodes", 120)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(cluster.env, PYTHONPATH=f"{REPO}:{REPO / 'tests'}", HF_HUB_OFFLINE="1",
               **{TOKEN_ENV: "multinode-token-5d1"})
    port = str(_free_port())
    done = subprocess.run([sys.executable, str(script), cluster.gcs_address, port], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])

    # the layout the test is about: the worker on the gpu_worker, the replica on the grm_node, no proxy with it
    nodes = {n["node_id"]: n for n in cluster.nodes()}
    worker = result["worker_node"]
    assert nodes[worker]["resources"].get("gpu_slot") == 4
    replicas = cluster.actor_nodes(f"ServeReplica:{APP}-default:GRMServer")  # the run's own app (run id "default")
    assert replicas and worker not in replicas
    assert all(nodes[r]["resources"].get("CPU") == 1 and not nodes[r]["head"] for r in replicas)
    assert worker not in cluster.actor_nodes("ProxyActor")

    # every group scored: response a is graded 5 as A, response b 2 as B (MENLO §5 own grade), none failed
    *scored, too_few, bad_scheme = result["outcomes"]
    for outcome in scored:
        assert outcome["error"] == "" and outcome["rewards"] == [5.0, 2.0], outcome
        assert outcome["components"]["grm_margin"] == [3.0, -3.0] and outcome["attempts"] == 1
    assert result["judge_calls"] == 3  # one pair per group, through the app's engine
    # refused at once, never retried, with the app's own message
    assert too_few["error"] == "http_400: responses: scheme all_pairs needs at least 2 responses, got 1"
    assert bad_scheme["error"].startswith("http_422: scheme:")
    assert too_few["attempts"] == bad_scheme["attempts"] == 1

    # the workers call the app by name through Ray; the app's bearer token never travels to them
    config = result["spec"]["config"]
    assert config["app"] == f"{APP}-default" and config["token_env"] == "" and result["secret_names"] == []
    assert config["url"].endswith(f":{port}/grm/{APP}-default")  # the HTTP address, for clients outside the cluster


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
