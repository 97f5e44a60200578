"""The documented `ray job submit` commands (tests/ray_head.py finds them in the docs) and `quorum submit` against a
real Ray head (token auth on), through the real CLIs.

A small policy_simplify job (configs/demo_scores.yaml, 4 sources, one tiny-model generator and one judge: sources ->
generate -> jury) is submitted, stopped during the jury stage and submitted again with the documented command: it
resumes from the run store with exact row counts, its results land under QUORUM_HOME, outside Ray's session folder,
and the job's last lines say where. Then `quorum submit` submits the same job with none of the documented exports
(only the token's file in the environment) and follows it: it finds the same run directory and reuses every stage.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.ray_head import REPO, VENV_BIN, Head, command, submission_id

pytestmark = pytest.mark.slow

SOURCES, POLICIES = 4, 2  # the documented command's data.limit=4; demo_scores' two policies


def tiny_overrides(model_dir: str) -> str:
    """One generator and one judge, both the tiny random model, no alignments: under a minute of work."""
    engine = f"{{kind: hf, model: {model_dir}, num_threads: 1}}"
    pool = "{concurrency: 1, num_cpus: 0.5, batch_size: 16}"
    generate = (f"generate=[{{name: tiny-gen, engine: {engine}, sampling: {{temperature: 0.0, max_tokens: 8}}, "
                f"pool: {pool}}}]")
    judges = (f"jury.judges=[{{name: tiny-judge, engine: {engine}, template: jury_score, format: score, "
              f"sampling: {{temperature: 0.0, max_tokens: 48}}, pool: {pool}, max_parse_retries: 0}}]")
    return f"'{generate}' '{judges}' features.align.enabled=false"


@pytest.fixture(scope="module")
def head():
    head = Head()
    current = Path("/tmp/ray/ray_current_cluster")
    before = current.read_text() if current.exists() else None
    try:
        head.start()
        # the head recorded itself in its own temp dir: a bare ray.init() of someone else's does not join it
        assert Path(head.temp_dir, "ray_current_cluster").is_file()
        assert (current.read_text() if current.exists() else None) == before
        yield head
    finally:
        head.stop()


def submit_command(model_dir: str, *extra: str, no_wait: bool = False) -> str:
    cmd = command("ray job submit") + " " + tiny_overrides(model_dir) + "".join(f" {e}" for e in extra)
    return cmd.replace("ray job submit", "ray job submit --no-wait", 1) if no_wait else cmd


def printed(output: str, label: str) -> list[str]:
    return re.findall(rf"^quorum: {label}: (\S+)$", output, flags=re.MULTILINE)


def stop_during_jury(head: Head, job: str, run_dir: Path, stop) -> dict:
    """Wait until the job's jury stage runs, `stop()` it, wait until the driver is gone; the manifest then."""
    client = head.client()
    deadline = time.time() + 300
    while _manifest(run_dir / "manifest.json").get("stages", {}).get("jury", {}).get("status") != "running":
        assert time.time() < deadline, "the jury stage never started"
        status = str(client.get_job_status(job))
        assert status.endswith(("PENDING", "RUNNING")), \
            f"{status}: {client.get_job_info(job).message}\n{client.get_job_logs(job)[-3000:]}"
        time.sleep(0.1)
    stop()
    while not str(status := client.get_job_status(job)).endswith("STOPPED"):
        assert time.time() < deadline, f"job {job} did not stop: {status}\n{client.get_job_logs(job)[-3000:]}"
        time.sleep(0.1)
    stopped = _manifest(run_dir / "manifest.json")
    assert stopped["stages"]["jury"]["status"] == "running" and not (run_dir / "jury").exists()
    assert "finished_at" not in stopped
    driver = int((run_dir / ".lock").read_text())
    while psutil.pid_exists(driver):  # the stopped driver still holds the run directory's lock until it is gone
        assert time.time() < deadline, f"the stopped driver {driver} is still alive"
        time.sleep(0.1)
    return stopped


def _manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}




def test_stop_during_jury_then_documented_resubmit_resumes_then_quorum_submit_finds_the_run(head, tiny_model_dir,
                                                                                            tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    head.set_home(str(home))
    run_dir = home / "runs" / "policy_simplify" / "demo_scores"
    first = head.sh(submit_command(tiny_model_dir, no_wait=True))
    job = submission_id(first.stdout + first.stderr)

    stopped = stop_during_jury(head, job, run_dir, lambda: head.sh(command("ray job stop").replace(
        "SUBMISSION_ID", job), timeout=60))

    # the documented command again: it finishes the stopped run
    again = head.sh(submit_command(tiny_model_dir), timeout=420)
    out = again.stdout + again.stderr
    assert "succeeded" in out
    assert printed(out, "run directory") == [str(run_dir)]  # relative run.root, under QUORUM_HOME
    assert not str(run_dir).startswith(head.temp_dir)
    manifest = _manifest(run_dir / "manifest.json")
    assert manifest["finished_at"] and manifest["config_hash"] and manifest["packages"]["ray"] == "2.60.0"
    assert {name: s["status"] for name, s in manifest["stages"].items()} == {
        "sources": "complete", "generate": "complete", "jury": "complete"}
    assert manifest["stages"]["generate"]["rows"] == SOURCES * POLICIES
    assert printed(out, "summary") == [f"{run_dir}/summary.md"] and Path(run_dir, "summary.md").is_file()
    wandb_runs = [p.split()[-1] for p in re.findall(r"^quorum: W&B offline run: (.+)$", out, flags=re.MULTILINE)]
    assert len(wandb_runs) == 2  # the stopped submission's and this one's, both in the run directory
    assert all(Path(w).is_dir() and w.startswith(str(run_dir)) for w in wandb_runs)
    # what was uploaded: the code and configs, not the 10 MB wheel at the root (nor runs/, .venv/, wandb/)
    packages = [p for p in Path(head.temp_dir).glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*")
                if p.is_dir()]
    assert any((p / "jobs" / "cli.py").is_file() and (p / "configs" / "demo_scores.yaml").is_file() for p in packages)
    for package in packages:
        assert not list(package.glob("*.whl")), package
        assert not (package / ".venv").exists() and not (package / "runs").exists(), package
    logs = head.sh(command("ray job logs").replace("SUBMISSION_ID", submission_id(out)))
    assert printed(logs.stdout, "run directory") == [str(run_dir)]
    assert printed(logs.stdout, "summary") == [f"{run_dir}/summary.md"]

    stages = manifest["stages"]
    assert all(s["status"] == "complete" for s in stages.values()) and manifest["finished_at"]
    # the finished stages were reused, not redone; the stopped one was redone whole
    for name in ("sources", "generate"):
        assert stages[name]["finished_at"] == stopped["stages"][name]["finished_at"], name
    assert re.search(r"generate: reus(ing|ed) (the|complete)", out)  # the driver's console says so
    assert not list(run_dir.glob(".*.tmp-*")), "an interrupted attempt's output was left behind"

    sources = pd.read_parquet(run_dir / "sources")
    candidates = pd.read_parquet(run_dir / "generate")
    judgments = pd.read_parquet(run_dir / "jury")
    assert len(sources) == SOURCES and sources["id"].is_unique
    assert len(candidates) == SOURCES * POLICIES and not candidates.duplicated(["id", "policy", "model"]).any()
    assert len(judgments) == SOURCES * POLICIES  # one judge, every candidate judged once
    assert not judgments.duplicated(["id", "policy", "model", "judge"]).any()
    assert set(judgments["id"]) == set(sources["id"])
    assert stages["jury"]["rows"] == len(judgments)
    assert os.path.isdir(run_dir / "wandb")

    # `quorum submit` in a shell that has only the token's file (no RAY_AUTH_MODE, QUORUM_HOME or runtime env), the
    # same job and home, following the logs: the same run directory, every stage reused, the job's status at the end
    token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    env = {k: v for k, v in head.env.items() if k not in ("RAY_AUTH_MODE", "QUORUM_HOME", "RUNTIME_ENV")}
    done = subprocess.run([str(VENV_BIN / "quorum"), "submit", "configs/demo_scores.yaml", "data.limit=4",
                           *shlex.split(tiny_overrides(tiny_model_dir)), "--address", head.address, "--home",
                           str(home), "--entrypoint-num-cpus", "0.25", "--follow"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=420, check=False)
    followed = done.stdout + done.stderr
    assert done.returncode == 0, followed[-4000:]
    assert token not in followed
    job = submission_id(followed)
    assert printed(followed, "submission id") == [job] and f"quorum: job {job} SUCCEEDED" in followed, followed[-6000:]
    assert printed(followed, "run directory") == [str(run_dir)] * 2  # quorum submit's line, then the job's own
    info = head.client().get_job_info(job)
    assert info.runtime_env["env_vars"] == {"QUORUM_HOME": str(home)}
    assert {"*.whl", "runs/", ".venv/", ".git/", ".env"} <= set(info.runtime_env["excludes"])
    assert info.metadata["quorum_run_dir"] == str(run_dir)
    for name in ("sources", "generate", "jury"):
        assert re.search(rf"{name}: reus(ing|ed) (the|complete)", followed), (name, followed[-6000:])
    again = _manifest(run_dir / "manifest.json")
    assert {name: s["finished_at"] for name, s in again["stages"].items()} == {
        name: s["finished_at"] for name, s in stages.items()}
    assert len(pd.read_parquet(run_dir / "jury")) == SOURCES * POLICIES


JOIN_CHECK = """
import ray
from core.ray_env import RayConfig, init_ray

ray.init()  # what a bare ray.init() does on a machine where `ray start` recorded a cluster
print("bare", ray.get_runtime_context().gcs_address, flush=True)
ray.shutdown()
init_ray(RayConfig(num_cpus=1))  # quorum's local mode (no ray.address, not in a submitted job)
print("quorum", ray.get_runtime_context().gcs_address, flush=True)
ray.shutdown()
"""


def test_local_mode_never_joins_a_cluster_recorded_by_ray_start(head):
    """Someone's `ray start` records its address in <ray tmp>/ray/ray_current_cluster; a bare ray.init() joins it,
    quorum's local mode starts its own cluster instead."""
    gcs = Path(head.temp_dir, "ray_current_cluster").read_text().strip()
    tmp = Path(head.temp_dir, "t")  # RAY_TMPDIR: the recorded address points at the test's head, not anyone's
    (tmp / "ray").mkdir(parents=True)
    (tmp / "ray" / "ray_current_cluster").write_text(gcs)
    env = {**head.env, "RAY_TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", JOIN_CHECK], env=env, cwd=tmp, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    addresses = dict(line.split() for line in out.stdout.splitlines() if line.startswith(("bare ", "quorum ")))
    assert addresses["bare"] == gcs  # the hazard is real
    assert addresses["quorum"] != gcs
