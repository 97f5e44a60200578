"""Torch threads follow the CPUs Ray gives an actor (issue 14), and a local cluster's workers are not reniced.

On a 2-core machine beside one busy process, an actor at Ray's default nice 15 with a thread per core decoded at
0.05 of its idle speed (bench.generate --contention 1); these pin the two causes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from core.ray_env import intra_op_threads

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pinned, ray_cpus, available, expected", [
    (0, None, 2, 0),   # outside Ray, unpinned: torch's own default
    (0, 1.0, 2, 1),    # the acceptance case: num_cpus=1 -> one thread
    (0, 0.5, 2, 1),    # a fractional share still needs one thread
    (0, 0.0, 2, 1),    # an actor that asked for no CPU (Ray's actor default)
    (0, 2.0, 2, 2),
    (0, 2.9, 4, 2),    # floor, as Ray's OMP_NUM_THREADS default does
    (0, 8.0, 2, 2),    # a logical CPU count above the cores this process can run on
    (3, 1.0, 2, 3),    # engine.num_threads pins it, whatever Ray says
    (1, None, 2, 1),
])
def test_intra_op_threads(pinned, ray_cpus, available, expected):
    assert intra_op_threads(pinned, ray_cpus, available) == expected


# One fresh local cluster through quorum's own init_ray (a subprocess: the session's shared Ray must not be the one
# measured). OMP_NUM_THREADS=2 reaches every worker (as an operator's exported value does through PASS_THROUGH),
# so Ray's own OMP_NUM_THREADS default cannot make the thread assertion pass; only the engine's derivation can.
SCRIPT = """
import os, sys, ray
from core.ray_env import RayConfig, init_ray
init_ray(RayConfig(num_cpus=2, env_vars={"OMP_NUM_THREADS": "2"}))

@ray.remote(num_cpus=1)
class Holder:
    def probe(self, model_dir):
        import torch
        from actors.engines.base import EngineSpec
        from actors.engines.hf.engine import HFEngine
        before = torch.get_num_threads()
        engine = HFEngine(EngineSpec(model=model_dir, dtype="float32", device="cpu"))
        return before, engine.threads, torch.get_num_threads(), os.nice(0)

print("PROBE", *ray.get(Holder.remote().probe.remote(sys.argv[1])))
ray.shutdown()
"""


def test_actor_with_one_cpu_runs_torch_on_one_thread(tiny_model_dir):
    ray_tmp = tempfile.mkdtemp(prefix="qt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "RAY_TMPDIR": ray_tmp}
    try:
        out = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model_dir], env=env, capture_output=True, check=False,
                             text=True, timeout=120, cwd=REPO)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    probe = [line for line in out.stdout.splitlines() if line.startswith("PROBE")]
    assert probe, out.stderr[-3000:]
    before, engine_threads, after, nice = (int(v) for v in probe[0].split()[1:])
    assert before == 2  # what the worker's environment asked for: the case the derivation must override
    assert engine_threads == after == 1
    assert nice == 0  # RayConfig.worker_niceness, not Ray's 15
