"""The vLLM-CPU tier: a vLLM engine of quorum's that its owner never closes shuts down in order when its process
exits. Left to vLLM's `__del__` at interpreter teardown (as before `actors.engines.vllm_sync.shutdown_vllm`), the
async engine logged `TypeError: 'NoneType' object is not callable` from `AsyncLLM.shutdown` and its engine core's
`/dev/shm/psm_*` queue stayed behind. (A Ray Data pool actor's engine, closed when Ray Data releases the actor:
tests/test_vllm_cpu_data_stage.py.) Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the vLLM-CPU environment."""

from __future__ import annotations

import json
import os
import subprocess

from vllm_cpu_tier import REPO, TEARDOWN_ERRORS, TIER_MARKS, VLLM_PYTHON, segments

pytestmark = TIER_MARKS


def test_unclosed_engines_shut_down_at_exit_without_traceback_or_shared_memory(tmp_path):
    """An async and a sync engine in one process (one engine start-up less than a process each), neither closed."""
    answer = tmp_path / "answer.json"
    before = segments()
    done = subprocess.run([VLLM_PYTHON, "bench/vllm_cpu/shutdown_child.py", str(answer)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1800,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and answer.is_file(), output[-4000:]
    got = json.loads(answer.read_text())
    for mode in ("async", "sync"):
        assert got[mode]["text"] and not got[mode]["error"], mode
    # the async engine core process's queues existed while it ran (the control for the check below)
    assert set(got["async"]["segments_while_running"]) - before
    while_running = set(got["async"]["segments_while_running"]) | set(got["sync"]["segments_while_running"])
    assert not (while_running - before) & segments(), "a psm segment outlived its engine"
    assert not [e for e in TEARDOWN_ERRORS if e in output], [line for line in output.splitlines()
                                                             if any(e in line for e in TEARDOWN_ERRORS)][:10]
