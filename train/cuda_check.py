"""Can this process run CUDA with the installed torch? One clear answer, naming the NVIDIA driver it needs.

    python -m train.cuda_check        # exit 0 and one `cuda ok` line, or exit 1 and what is wrong (stderr)

PyPI's torch wheels for Linux x86_64 are CUDA builds (torch 2.13.0: CUDA 13.0, its Requires-Dist names
`cuda-toolkit==13.0.*` and `nvidia-*-cu13`; tests/test_gpu_extra.py reads it from the wheel). A CUDA build runs
only on a host whose NVIDIA kernel driver is new enough for that CUDA major version; on an older one torch imports
fine and `torch.cuda.is_available()` is simply False, and the first failure comes much later (NCCL's init, vLLM's
start-up, DeepSpeed's first allocation) without the reason. cluster.yaml's GPU nodes run this module before Ray
starts on them, and the GPU training loops call `require_cuda` first.

The floors are NVIDIA's minor-version compatibility rule (CUDA Toolkit release notes, "CUDA Toolkit and
Corresponding Driver Versions"): every 13.x toolkit runs on a Linux driver >= 580, every 12.x on >= 525.60.13.
The forward-compatibility packages (`cuda-compat`, data-centre GPUs only) can lift an older driver; not used here.
Imports torch only: it runs on a bare GPU machine as in the image.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

# CUDA major version -> the oldest Linux driver that runs every toolkit of that major version
DRIVER_FLOOR: dict[int, tuple[int, ...]] = {13: (580,), 12: (525, 60, 13)}
PROC_VERSION = Path("/proc/driver/nvidia/version")


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def parse_driver_version(text: str) -> tuple[int, ...] | None:
    """The kernel driver's version from /proc/driver/nvidia/version ("... Kernel Module  580.65.06  ..." or
    "... Open Kernel Module for x86_64  580.65.06  ...") or from `nvidia-smi`'s driver_version column."""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text) or re.fullmatch(
        r"\s*(\d+(?:\.\d+)+)\s*", text.splitlines()[0] if text.strip() else "")
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def driver_version(proc: Path = PROC_VERSION) -> tuple[int, ...] | None:
    """This host's NVIDIA driver version (the file the NVIDIA container runtime mounts, else `nvidia-smi`), None
    when no driver is visible."""
    if proc.is_file():
        return parse_driver_version(proc.read_text(errors="replace"))
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return parse_driver_version(done.stdout)
    return None


def required_driver(cuda: str) -> tuple[int, ...] | None:
    """The driver floor for torch built with CUDA `cuda` ("13.0"); None for a CUDA major version not known here."""
    return DRIVER_FLOOR.get(int(cuda.split(".")[0]))


def cuda_problem(cuda: str | None, available: bool, driver: tuple[int, ...] | None) -> str | None:
    """Why CUDA is unusable, or None. `cuda` is torch's build (`torch.version.cuda`), `available` what
    `torch.cuda.is_available()` says, `driver` the host's driver version."""
    if cuda is None:
        return (f"torch {torch.__version__} is a CPU build (torch.version.cuda is None); GPU nodes need PyPI's "
                "CUDA build (k8s/Dockerfile, FLAVOR=gpu)")
    need = required_driver(cuda)
    floor = f"an NVIDIA driver >= {format_version(need)}" if need else f"a driver for CUDA {cuda}"
    if driver is None:
        return (f"torch {torch.__version__} (CUDA {cuda}) needs {floor}, and no NVIDIA driver is visible "
                "(/proc/driver/nvidia/version is missing: no GPU, or a container started without the NVIDIA "
                "runtime / --gpus all)")
    if need is not None and driver < need:
        return (f"torch {torch.__version__} (CUDA {cuda}) needs {floor}; this host's driver is "
                f"{format_version(driver)}. Use an image/AMI with a newer driver (docs/cluster.md, 'GPU driver')")
    if not available:
        return (f"torch {torch.__version__} (CUDA {cuda}) with NVIDIA driver {format_version(driver)}: "
                "torch.cuda.is_available() is False (no GPU visible to this process? CUDA_VISIBLE_DEVICES="
                "'' or a GPU in a bad state: see nvidia-smi)")
    return None


def current_problem() -> str | None:
    """`cuda_problem` for this process."""
    return cuda_problem(torch.version.cuda, torch.cuda.is_available(), driver_version())


def require_cuda(where: str) -> None:
    """Raise one clear error when CUDA is unusable here (`where`: who needs it, e.g. the config key)."""
    if problem := current_problem():
        raise RuntimeError(f"{where} needs CUDA, which is unusable on this node: {problem}")


def main() -> int:
    if problem := current_problem():
        print(f"quorum: CUDA is unusable on this node: {problem}", file=sys.stderr, flush=True)
        return 1
    name = torch.cuda.get_device_name()
    print(f"cuda ok: torch {torch.__version__} (CUDA {torch.version.cuda}), driver "
          f"{format_version(driver_version() or ())}, {torch.cuda.device_count()} GPU(s), {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
