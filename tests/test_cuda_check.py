"""train/cuda_check.py: a node that cannot run the pinned torch's CUDA says so at start-up, naming the driver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train.cuda_check import (
    DRIVER_FLOOR,
    cuda_problem,
    driver_version,
    parse_driver_version,
    require_cuda,
    required_driver,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("text", "version"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version: gcc",
     (535, 104, 5)),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n",
     (580, 65, 6)),
    ("580.105.08\n580.105.08\n", (580, 105, 8)),  # nvidia-smi --query-gpu=driver_version, one line a GPU
    ("", None),
    ("no driver here", None),
])
def test_the_driver_version_is_read_from_either_source(text, version):
    assert parse_driver_version(text) == version


def test_a_proc_file_is_read(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Thu Oct 28 2021\n")
    assert driver_version(proc) == (470, 82, 1)


def test_the_floor_follows_the_cuda_major_version():
    assert required_driver("13.0") == required_driver("13.2") == DRIVER_FLOOR[13] == (580,)
    assert required_driver("12.8") == (525, 60, 13)
    assert required_driver("14.0") is None


def test_an_old_driver_is_named_with_the_floor():
    problem = cuda_problem("13.0", False, (535, 104, 5))
    assert "needs an NVIDIA driver >= 580; this host's driver is 535.104.5" in problem
    assert "docs/cluster.md" in problem


def test_each_way_cuda_can_be_unusable_has_its_reason():
    assert "CPU build" in cuda_problem(None, False, None)
    assert "no NVIDIA driver is visible" in cuda_problem("13.0", False, None)
    assert "torch.cuda.is_available() is False" in cuda_problem("13.0", False, (580, 65, 6))
    assert cuda_problem("13.0", True, (580, 65, 6)) is None
    assert cuda_problem("13.0", True, (595, 91, 7)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is usable here")
def test_the_worker_check_names_the_key_and_the_reason():
    with pytest.raises(RuntimeError, match=r"use_gpu: true needs CUDA, which is unusable on this node: torch "):
        require_cuda("use_gpu: true")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is usable here")
def test_the_command_exits_1_with_one_line():
    done = subprocess.run([sys.executable, "-m", "train.cuda_check"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("quorum: CUDA is unusable on this node: torch ")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_command_passes_on_a_gpu():
    done = subprocess.run([sys.executable, "-m", "train.cuda_check"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("cuda ok: torch "), done.stderr
