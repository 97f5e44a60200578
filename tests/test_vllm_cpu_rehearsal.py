"""The vLLM-CPU tier's rehearsals: `quorum rehearse` of the cluster configs CI runs, whole, on vLLM's CPU build.

policy_grpo_cluster: two Ray Train workers on gloo, each with a colocated vLLM engine that sleeps and wakes, ZeRO-3,
full fine-tuning's weights pushed into the engines every step, the GRM served by `serve_grm` on vLLM's async engine
answering every reward request with a parsed verdict, validation; the workers' collectives checked against NCCL's
device rule (train.collectives.guard_for_rehearsal).
jury_eval_cluster: the writer, simplifier and judge pools on vLLM in Ray Data, the hosted judges on a local
`vllm serve`. Each must exit 0 with its manifest saying it was a rehearsal that ran vLLM, no engine shutdown may log
a traceback, and no `/dev/shm/psm_*` segment may be left behind (vLLM's shared-memory queues).

Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the vLLM-CPU environment (bench/vllm_cpu/build_env.sh builds it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_cpu_tier import REPO, TIER_MARKS, VLLM_PIN, VLLM_PYTHON

pytestmark = TIER_MARKS

# what vLLM logged when an engine was left to its own __del__ at interpreter teardown
TEARDOWN_ERRORS = ("object is not callable", "KeyError: '/psm_", "Exception ignored in: <function AsyncLLM.__del__",
                   "leaked shared_memory")


def rehearse(config: str, tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    env = {**os.environ, "QUORUM_VLLM_CPU_PYTHON": VLLM_PYTHON}
    before = {p.name for p in Path("/dev/shm").glob("psm_*")}
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "rehearse", config, f"run.root={tmp_path}/runs",
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600, check=False)
    after = {p.name for p in Path("/dev/shm").glob("psm_*")}
    manifests = list((tmp_path / "runs").glob("*/*/manifest.json"))
    assert done.returncode == 0 and manifests, (done.stdout + done.stderr)[-6000:]
    manifest = json.loads(manifests[0].read_text())
    log = (manifests[0].parent / "logs" / "driver.log").read_text(errors="replace")
    # a segment that appeared during the run and is still there (another process's are not counted)
    manifest["shm_left_seen_by_test"] = sorted(after - before)
    return done, manifest, log + done.stdout + done.stderr


def check_clean(manifest: dict, text: str) -> None:
    record = manifest["rehearsal_record"]
    assert manifest["rehearsal"] is True and record["exit_code"] == 0
    assert record["vllm_version"].split("+")[0] == VLLM_PIN and record["vllm_engines_started"] >= 1
    assert record["shm_segments_left"] == [] and manifest["shm_left_seen_by_test"] == []
    assert not [e for e in TEARDOWN_ERRORS if e in text], [e for e in TEARDOWN_ERRORS if e in text]


def test_policy_grpo_cluster_rehearses_whole_on_vllm(tmp_path):
    _, manifest, text = rehearse("configs/policy_grpo_cluster.yaml", tmp_path)
    record = manifest["rehearsal_record"]
    assert record["engines"]["grpo.rollout"] == "vllm"
    assert record["engines"]["configs/grm_cluster.yaml:judge.engine"] == "vllm"
    # two colocated rollout engines and the served judge's
    assert record["vllm_engines_started"] >= 3
    train = manifest["stages"]["train"]
    assert train["status"] == "complete"
    # rewards came back and the policy was updated (a rehearsal whose every reward failed trains nothing)
    assert train["summary"]["reward_mean"] is not None and not train["summary"]["groups_failed"]
    assert "grpo.env_vars.QUORUM_REHEARSAL_BACKEND=nccl" in record["overrides"]
    check_clean(manifest, text)


def test_jury_eval_cluster_rehearses_whole_on_vllm(tmp_path):
    _, manifest, text = rehearse("configs/jury_eval_cluster.yaml", tmp_path)
    record = manifest["rehearsal_record"]
    assert "vllm" in record["engines"].values() and "openai" in record["engines"].values()
    assert all(s["status"] == "complete" for s in manifest["stages"].values())
    check_clean(manifest, text)
