"""The numerics of a training worker's forward: its precision with `auto` resolved (native bf16 asked of
`actors.engines.hf.weights.cpu_has_native_bf16`, as the engine asks it; `QUORUM_CPU_BF16=0` answers no for both, to
run as on a CPU without bf16), and the autocast context that
`precision: bf16-autocast` runs the forward in (`train.ds_config.PRECISIONS`). Torch only, no Ray or DeepSpeed."""

from __future__ import annotations

import contextlib

import torch

from actors.engines.hf.weights import cpu_has_native_bf16
from train.ds_config import resolve_precision


def worker_precision(precision: str, use_gpu: bool) -> str:
    """`precision` as this training worker runs it ("auto" resolved for its device and CPU)."""
    return resolve_precision(precision, use_gpu, cpu_has_native_bf16())


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context a training forward runs in: bf16 autocast for "bf16-autocast" (train.ds_config.PRECISIONS), else
    nothing. Only the forward runs in it; its backward follows the dtypes the forward recorded."""
    if precision != "bf16-autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
