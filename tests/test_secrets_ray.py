"""No secret lands in any file Ray, the run or W&B writes: a job and a Serve app, each on its own fresh Ray cluster.

The engine API key, the Serve bearer token and the W&B key are set in the environment of `quorum run` and
`quorum serve`; both really use them (the fake hosted API checks the key, the Serve app the token). Afterwards
every file under the Ray temp dir (session logs, runtime_env_agent.log included), the run directory and the W&B
files is searched for each value.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.fake_openai_server import FakeOpenAIServer
from tests.serve_process import wait_until_ready
from tests.test_serve_app import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SECRETS = {"QUORUM_TEST_ENGINE_KEY": "sk-engine-9b1e77c2d4", "QUORUM_SERVE_TOKEN": "serve-token-41c0a9e6f2",
           "WANDB_API_KEY": "wandbkey0123456789abcdef0123456789abcdef"}


@pytest.fixture()
def ray_tmp():
    """A fresh Ray temp dir for the subprocesses' own clusters (short: Ray's socket paths must fit 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="qs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def child_env(ray_tmp: Path) -> dict[str, str]:
    env = {**os.environ, **SECRETS, "RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    env.pop("RAY_ADDRESS", None)  # each command starts (and stops) its own local cluster
    return env


def files_holding_secrets(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and not path.is_socket():
                data = path.read_bytes()
                found += [f"{path}: {name}" for name, value in SECRETS.items() if value.encode() in data]
    return found


def api_engine(url: str) -> str:
    return f"{{kind: openai, model: remote, base_url: '{url}', api_key_env: QUORUM_TEST_ENGINE_KEY, max_retries: 0}}"


def test_a_serve_run_writes_no_secret(ray_tmp, tmp_path):
    port = free_port()
    token = SECRETS["QUORUM_SERVE_TOKEN"]
    with FakeOpenAIServer(api_key=SECRETS["QUORUM_TEST_ENGINE_KEY"], reply=lambda prompt: "Answer: [3]") as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "serve", "configs/grm.yaml", f"serve.port={port}",
             "serve.auth_token_env=QUORUM_SERVE_TOKEN", "resources.num_cpus=0.25", "ray.num_cpus=2", "shutdown.wait_loop_s=0.1",
             f"judge.engine={api_engine(server.base_url)}", "prompts.pointwise=jury_score",
             "prompts.pointwise_format=answer",
             "prompts.pointwise_vars={prompt: base_sentence, response: new_sentence}",
             "prompts.pairwise=jury_pairwise",
             "prompts.pairwise_vars={prompt: source, response_a: candidate_a, response_b: candidate_b}"],
            cwd=REPO, env=child_env(ray_tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_ready(proc, base)
            body = {"prompt": "The vote was postponed.", "response": "The vote was delayed."}
            assert httpx.post(f"{base}/score", json=body, timeout=60).status_code == 401
            scored = httpx.post(f"{base}/score", json=body, timeout=60, headers={"Authorization": f"Bearer {token}"})
            assert scored.status_code == 200, scored.text
            assert scored.json()["grade"] == 3 and server.calls
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    assert list(ray_tmp.rglob("runtime_env_agent.log")), "no Ray session was written where expected"
    assert files_holding_secrets(ray_tmp, tmp_path) == []
