"""Torch's thread count in the process that holds a model: what Ray gave the actor, not every core of the node.

The pure rule is `core.ray_env.intra_op_threads`; this module reads its inputs (the pin, Ray's assignment, the
cores this process may run on) and applies it. Called by each engine that runs torch on the CPU, in the thread that
will run the model (Ray Data calls a worker on one thread of its own; torch propagates the count to new threads).
That count is the most a decode loop uses: with `engine.adaptive_threads` its `core.thread_tuner.ThreadTuner` picks
each step's count at or below it.
"""

from __future__ import annotations

import os
import sys

import torch

from core.ray_env import intra_op_threads
from core.thread_tuner import ThreadTuner


def ray_assigned_cpus() -> float | None:
    """CPUs Ray assigned to the current actor or task (0.0 if it asked for none); None outside a Ray worker."""
    if "ray" not in sys.modules:  # every Ray worker has imported it; a plain script need not pay for the import
        return None
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:  # the driver: it holds no resources
        return None
    return float(context.get_assigned_resources().get("CPU", 0.0))


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask: a container or `taskset` may give fewer than the node)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_torch_threads(pinned: int) -> int:
    """Apply `intra_op_threads` to torch and return the thread count torch now uses."""
    threads = intra_op_threads(pinned, ray_assigned_cpus(), available_cpus())
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def use_threads(threads: int) -> None:
    """Set torch's intra-op threads (OpenMP's, for the calling thread) when they differ."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def decode_tuner(adaptive: bool, device: torch.device, threads: int) -> ThreadTuner | None:
    """A `core.thread_tuner.ThreadTuner` up to `threads` for a CPU decode loop, when there is a choice to make."""
    return ThreadTuner(threads) if adaptive and device.type == "cpu" and threads > 1 else None
