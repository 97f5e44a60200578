"""The hf engine's tests (`tests/test_hf_engine.py`, `tests/test_shared_prefix.py`) again on a CUDA GPU.

GPU run: `python -m pytest tests/test_hf_engine_cuda.py -m gpu -q`. The engine's device path (weights, KV rows,
shared prefixes, per-row seeded generators, grammar masks and LoRA merge on the GPU) is otherwise never run: the
default suite is CPU-only. One subprocess, so the CPU tests' module-scoped engines and the `QUORUM_TEST_DEVICE`
switch stay out of this process. The real-SmolLM2 test is left out when the cached model is not the converted
GGUF (a GPU machine without the bundled package gets a random model of the same shape).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hf_engine_tests_pass_on_cuda():
    from actors.models import get_cache_root

    source = get_cache_root() / "models" / "smollm2-135m" / "quorum_source.json"
    real = source.is_file() and json.loads(source.read_text()).get("source", "").endswith(".gguf")
    select = [] if real else ["-k", "not test_smollm2_chat_completion_matches_generate"]
    env = {**os.environ, "QUORUM_TEST_DEVICE": "cuda"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *select,
                           str(REPO / "tests" / "test_hf_engine.py"),
                           str(REPO / "tests" / "test_shared_prefix.py")], check=False, cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
