"""Every collective quorum issues itself, with its tensors on the device the process group's backend serves.

Why a module: a process group reduces a tensor with the backend registered for the tensor's device type, and a
group may serve some device types only. Ray Train starts GPU workers with `init_process_group("nccl")`, whose
device -> backend map is ``cuda:nccl`` alone (`torch.distributed.Backend.backend_capability`), so a CPU tensor
handed to its `all_reduce` raises ``RuntimeError: No backend type associated with device type cpu``. gloo serves
both CPU and CUDA, so a CPU-only run never sees that; a group created with ``backend="cuda:gloo"`` has NCCL's map
with gloo standing in, and refuses CPU tensors the same way (tests/test_collectives.py).

The device rule (`collective_device`): CPU when the group serves it (the values start on the host: no copy; torch's
own object collectives choose the same way, `distributed_c10d._get_object_coll_device`), else the first device
type the group's map names, at the process's current index (Ray Train sets it to the worker's GPU). A group that
serves only a device type this process cannot use is one clear error, not a failure inside the backend.

Nothing here imports Ray, DeepSpeed or vLLM: `bench.gpu_check` runs this module under a real one-rank NCCL group on
a bare GPU machine. tests/test_collectives.py also checks that no `torch.distributed` collective in `train/`
bypasses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

# reduce ops by name: callers need not import torch.distributed
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def served_device_types(group=None) -> list[str]:
    """The device types `group` (default: the world) has a backend for, in its map's order: "nccl" -> ["cuda"],
    "gloo" -> ["cpu", "cuda"], "cuda:gloo" -> ["cuda"] (`dist.get_backend_config`, e.g. "cpu:gloo,cuda:nccl")."""
    return [pair.split(":", 1)[0].strip() for pair in dist.get_backend_config(group).split(",") if pair.strip()]


def collective_device(group=None) -> torch.device:
    """Where this process's tensors for a collective on `group` go (module docstring).

    Raises:
        RuntimeError: the group serves no device type this process can use (e.g. an NCCL group where CUDA is not
            available).
    """
    served = served_device_types(group)
    if "cpu" in served:
        return torch.device("cpu")
    kind = served[0]
    module = getattr(torch, kind, None)
    if module is None or not hasattr(module, "is_available") or not module.is_available():
        raise RuntimeError(f"process group {dist.get_backend_config(group)!r} serves only {served}, and "
                           f"{kind} is not available in this process (torch {torch.__version__}): its collectives "
                           "cannot run here")
    return torch.device(kind, module.current_device())


def _op(name: str):
    try:
        return _OPS[name]
    except KeyError:
        raise ValueError(f"reduce op {name!r}: expected one of {sorted(_OPS)}") from None


def all_reduce_(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce `tensor` over the group, in place, and return it. A tensor on a device the group does not serve
    travels to its collective device and back (prefer to build it there: `collective_device`)."""
    device = collective_device(group)
    if tensor.device == device:
        dist.all_reduce(tensor, op=_op(op), group=group)
        return tensor
    moved = tensor.to(device)
    dist.all_reduce(moved, op=_op(op), group=group)
    tensor.copy_(moved)
    return tensor


def all_reduce_values(values: Sequence[float], op: str = "sum", dtype: torch.dtype = torch.float64,
                      group=None) -> list[float]:
    """`values` reduced elementwise over the group (every rank passes as many); float64 by default, so sums of
    token counts and seconds stay exact well past float32's 2**24."""
    tensor = torch.tensor(list(values), dtype=dtype, device=collective_device(group))
    dist.all_reduce(tensor, op=_op(op), group=group)
    return tensor.tolist()


def any_rank(flag: bool, group=None) -> bool:
    """True when `flag` holds on at least one rank (every rank then takes the same decision)."""
    (most,) = all_reduce_values([float(bool(flag))], "max", group=group)
    return most > 0


def gather_objects(obj, group=None) -> list:
    """Every rank's picklable `obj`, in rank order. torch places the pickled bytes itself (on CUDA for an NCCL
    group: the current device, which Ray Train sets); the device check here fails early and clearly instead."""
    collective_device(group)
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def barrier(group=None) -> None:
    """Wait for every rank of the group, on the device the group serves (an explicit CUDA index: torch would
    otherwise guess one and warn)."""
    device = collective_device(group)
    if device.type == "cuda":
        dist.barrier(group=group, device_ids=[device.index])
    else:
        dist.barrier(group=group)


def world_size(group=None) -> int:
    return dist.get_world_size(group)


def world_clone(timeout_s: float):
    """A new group of all the world's ranks whose collectives wait `timeout_s`. Every rank must call it (group
    creation is collective). Why: `new_group` without a timeout takes its backend's default (NCCL 10 min, gloo
    30 min: `distributed_c10d._get_default_timeout`), not the world group's, so a library's own clone of the world
    would time out before the run's configured collective timeout."""
    return dist.new_group(ranks=list(range(dist.get_world_size())), timeout=timedelta(seconds=timeout_s))


def group_timeout(group=None) -> timedelta:
    """How long a collective on `group` (default: the world) waits, as its backend on this process's collective
    device holds it."""
    group = dist.group.WORLD if group is None else group
    return group._get_backend(collective_device(group)).options._timeout
