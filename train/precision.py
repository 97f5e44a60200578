"""The numerics of a training worker's forward: whether this CPU has native bf16, and the autocast context that
`precision: bf16-autocast` runs the forward in (`train.ds_config.PRECISIONS`). Torch only, no Ray or DeepSpeed."""

from __future__ import annotations

import contextlib

import torch

from train.ds_config import resolve_precision


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 dot products natively (AVX512-BF16 or AMX), so bf16 autocast speeds it up."""
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def worker_precision(precision: str, use_gpu: bool) -> str:
    """`precision` as this training worker runs it ("auto" resolved for its device and CPU)."""
    return resolve_precision(precision, use_gpu, native_cpu_bf16())


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context a training forward runs in: bf16 autocast for "bf16-autocast" (train.ds_config.PRECISIONS), else
    nothing. Only the forward runs in it; its backward follows the dtypes the forward recorded."""
    if precision != "bf16-autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
