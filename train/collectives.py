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
bypasses it; in a rehearsal (`quorum rehearse`) the training workers also check it as they run
(`guard_for_rehearsal`, below).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

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


# ---------------------------------------------------------------------------------------------------------------
# The rehearsal's guard
#
# Why: a rehearsal trains on CPU workers under gloo, which serves CPU tensors, so a collective that quorum's code
# issues on a CPU tensor without this module runs there and fails only on the cluster, where the group is NCCL's
# (cuda only). A gloo group cannot play NCCL's part (`cuda:gloo` refuses CPU tensors, and the rehearsal has no
# CUDA for this module or DeepSpeed to move them to), so in a rehearsal each training worker checks the calls
# themselves: a tensor collective on a device the production backend does not serve, called by quorum's own code
# other than this module, stops the worker with an error naming the collective, the device and the caller.
# DeepSpeed's, torch's own (object collectives) and vLLM's calls pass: on the cluster they place their tensors
# on the worker's GPU themselves. Outside a rehearsal nothing is installed (no wrapper, no cost).

# set by `quorum rehearse` (jobs.rehearse_overrides) in the env_vars of a trainer whose GPUs it turned off: the
# backend the trainer's group has on the cluster ("nccl")
REHEARSAL_BACKEND_ENV = "QUORUM_REHEARSAL_BACKEND"
# torch.distributed's tensor collectives (the object collectives place their bytes on the group's device themselves)
GUARDED = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
           "_all_gather_base", "reduce", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
           "broadcast", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv")
_ROOT = Path(__file__).resolve().parents[1]
# frames that only pass a caller's call on (DeepSpeed's comm layer): the caller is the frame above them
_PASS_THROUGH = (f"{os.sep}deepspeed{os.sep}comm{os.sep}",)


def guard_for_rehearsal(environ=os.environ) -> bool:
    """In a rehearsal's training worker (`REHEARSAL_BACKEND_ENV` set) whose production backend does not serve the
    CPU, wrap torch.distributed's tensor collectives with the device check above; True when installed. Every
    training worker calls it first, before any collective."""
    backend = environ.get(REHEARSAL_BACKEND_ENV, "")
    if not backend:
        return False
    capability = dist.Backend.backend_capability
    if backend not in capability:
        raise RuntimeError(f"{REHEARSAL_BACKEND_ENV}={backend!r}: expected one of {sorted(capability)}")
    served = tuple(capability[backend])
    if "cpu" in served:
        return False  # the production group serves the host's tensors too: a CPU run misses nothing
    for namespace in (dist, dist.distributed_c10d):
        for name in GUARDED:
            original = getattr(namespace, name, None)
            if original is not None and not getattr(original, "_rehearsal_guard", False):
                setattr(namespace, name, _guarded(name, original, backend, served))
    return True


def _guarded(name: str, original, backend: str, served: tuple):
    @functools.wraps(original)
    def call(*args, **kwargs):
        unserved = sorted({t.device.type for t in _tensors((*args, *kwargs.values())) if t.device.type not in served})
        if unserved:
            caller = _quorum_caller(sys._getframe(1))
            if caller:
                raise RuntimeError(
                    f"rehearsal: torch.distributed.{name} on a {'/'.join(unserved)} tensor, called by {caller} "
                    f"without train.collectives: on the cluster this group is {backend}, which serves only "
                    f"{list(served)}, and the call fails there (No backend type associated with device type "
                    f"{unserved[0]}). Issue it through train.collectives (all_reduce_, all_reduce_values, any_rank, "
                    "gather_objects, barrier), which puts its tensors on the device the group serves")
        return original(*args, **kwargs)

    call._rehearsal_guard = True
    return call


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out += [v for v in value if isinstance(v, torch.Tensor)]
    return out


def _quorum_caller(frame) -> str:
    """'path:line (function)' of the quorum code that issued the collective directly, or '' when torch, DeepSpeed,
    vLLM, ... issued it, or this module did."""
    while frame is not None and _passes_through(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ""
    path = _quorum_path(frame.f_code.co_filename)
    if not path or path == "train/collectives.py":
        return ""
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


def _passes_through(filename: str) -> bool:
    return any(part in filename for part in _PASS_THROUGH)


@functools.lru_cache(maxsize=1024)
def _quorum_path(filename: str) -> str:
    """`filename` relative to quorum's root when it is quorum's own source, else '' (an installed library)."""
    path = Path(filename).resolve()
    if not path.is_relative_to(_ROOT):
        return ""
    relative = path.relative_to(_ROOT)
    if _INSTALLED:  # quorum's packages sit beside every other library
        return relative.as_posix() if relative.parts[0] in _PACKAGES else ""
    # a checkout: all of it (tests included) but an environment inside it (./.venv)
    return "" if {"site-packages", "dist-packages"} & set(relative.parts) else relative.as_posix()


# quorum installed as a package (not run from a checkout): its top-level packages (pyproject.toml)
_INSTALLED = _ROOT.name in ("site-packages", "dist-packages")
_PACKAGES = ("core", "eval", "actors", "train", "serve", "jobs", "bench", "quorum_clients")
