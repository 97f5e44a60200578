"""The vLLM-CPU tier: a vLLM engine of quorum's that its owner never closes shuts down in order when its process
exits. Left to vLLM's `__del__` at interpreter teardown (as before `actors.engines.vllm_sync.shutdown_vllm`), the
async engine logged `TypeError: 'NoneType' object is not callable` from `AsyncLLM.shutdown` and its engine core's
`/dev/shm/psm_*` queue stayed behind. Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the vLLM-CPU environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_cpu_tier import REPO, TIER_MARKS, VLLM_PYTHON

pytestmark = TIER_MARKS

TEARDOWN_ERRORS = ("object is not callable", "Traceback", "leaked shared_memory", "Exception ignored")


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
