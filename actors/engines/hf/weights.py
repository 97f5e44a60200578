"""The hf engine's model on its device: which device and dtype (`auto` resolved), the checkpoint loaded with its LoRA
adapter merged, and CPU linear layers swapped for oneDNN-prepacked ones (bf16 and float32). Split from
`actors.engines.hf.engine`."""

from __future__ import annotations

import os
import time

import torch
from transformers import AutoModelForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# bf16 must beat fp32 by this factor in the startup probe to be picked on CPU (guards against timing noise).
_BF16_MIN_SPEEDUP = 1.2
_PROBE = (torch.float32, torch.bfloat16)


def load_model(model_dir: str, adapter: str, dtype: torch.dtype) -> torch.nn.Module:
    """The causal LM at `dtype`, with a LoRA adapter merged into its weights when one is given.

    The merge runs in float32 and the result is cast afterwards, so a bf16 engine rounds the merged weight once
    (as a model saved merged would) instead of adding a rounded delta to rounded weights.
    """
    if not adapter:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter).merge_and_unload().to(dtype)


def pick_device(name: str) -> torch.device:
    """`auto` is the first GPU if there is one, else the CPU; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"engine.device: {name!r} requested but torch sees no CUDA device")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """Resolve `auto`: bf16 on GPU (fp16 if unsupported); on CPU bf16 only with native bf16 math that is faster."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if cpu_has_native_bf16() and measure_bf16_speedup() >= _BF16_MIN_SPEEDUP:
        return torch.bfloat16
    return torch.float32


# `QUORUM_CPU_BF16=0` makes `cpu_has_native_bf16` answer no whatever the CPU has, so the engine's `dtype: auto`
# resolves to float32 and training's `precision: auto` to fp32: this process, and the Ray workers it starts (they
# inherit its environment), run as on a CPU without bf16 (most Intel client CPUs, Xeons before Sapphire Rapids,
# AMD before Zen 4). For developers and CI on a bf16 machine: `QUORUM_CPU_BF16=0 pytest` (docs/engine.md).
CPU_BF16_ENV = "QUORUM_CPU_BF16"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 dot products natively (AVX512-BF16 or AMX, the checks torch's own kernels
    dispatch on); without them bf16 is emulated and slow. The engine's dtype and training's `precision: auto` both
    ask this. `QUORUM_CPU_BF16=0` answers False (`CPU_BF16_ENV`).

    Raises:
        ValueError: QUORUM_CPU_BF16 is set to something other than "0" or "auto".
    """
    override = os.environ.get(CPU_BF16_ENV, "auto").strip() or "auto"
    if override not in ("0", "auto"):
        raise ValueError(f"{CPU_BF16_ENV}={override!r}: expected 0 (run as on a CPU without bf16) or auto")
    if override == "0":
        return False
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def measure_bf16_speedup(rows: int = 64, size: int = 1024, reps: int = 5) -> float:
    """fp32 time / bf16 time of a decode-shaped matmul, best of `reps` each (~20 ms in all).

    The two dtypes alternate so that a burst of load from other processes hits both alike.
    """
    inputs = {dtype: (torch.randn(rows, size).to(dtype), torch.randn(4 * size, size).to(dtype)) for dtype in _PROBE}
    for x, w in inputs.values():  # warm oneDNN's kernel cache
        torch.nn.functional.linear(x, w)
    best = dict.fromkeys(_PROBE, float("inf"))
    for _ in range(reps):
        for dtype, (x, w) in inputs.items():
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


class PackedLinear(torch.nn.Module):
    """Inference-only stand-in for nn.Linear with its weight pre-reordered into oneDNN's blocked layout.

    A plain F.linear re-reads the weight in its row-major layout every call; the prepacked one streams it in the
    order the kernel consumes it, which is what decode (few rows, every weight read once) is bound by. In bf16 the
    outputs are bit-identical to F.linear's; in float32 F.linear runs MKL's sgemm and the packed op oneDNN's, which
    sum in another order (within float32 rounding, `outputs_match`) and, at 16 decode rows of SmolLM2-135M on 2
    cores, 1.2-1.9x faster (the 49,152-wide LM head ~3x; docs/engine.md).
    """

    def __init__(self, linear: torch.nn.Linear, batch_size: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_size)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linear_layers(model: torch.nn.Module, batch_size: int) -> int:
    """Swap every nn.Linear of a CPU model for a PackedLinear, if the packed op's outputs match (`packing_matches`).

    Returns:
        How many layers were swapped (0 when oneDNN is unavailable or the probe differs).
    """
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()]
    linears = [(parent, name, child) for parent, name, child in linears if isinstance(child, torch.nn.Linear)]
    if not linears or not packing_matches(linears[0][2], batch_size):
        return 0
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child, batch_size))
    return len(linears)


def packing_matches(linear: torch.nn.Linear, batch_size: int) -> bool:
    """Whether oneDNN's prepacked op exists here and gives `linear`'s outputs on a decode-shaped probe (bit for bit
    in bf16 / fp16, within float32 rounding in float32: `outputs_match`)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    x = torch.randn(batch_size, 1, linear.in_features, generator=torch.Generator().manual_seed(0))
    x = x.to(linear.weight.dtype)
    with torch.inference_mode():
        try:
            packed = PackedLinear(linear, batch_size)(x)
        except RuntimeError:
            return False
        return outputs_match(x, linear.weight, linear(x), packed)


# A float32 product summed in another order differs from F.linear's by a few units of float32 rounding of the sum of
# |x_i * w_i| (SmolLM2's layers: at most ~3; the worst case is the in-features count). A kernel that rounds its
# inputs to bf16 (oneDNN's `fp32_precision = "bf16"`) or tf32 is off by ~1,400 or ~170 units at 576 in-features:
# this bound tells reordering from lowered precision.
_FLOAT32_ROUNDING_UNITS = 16


def outputs_match(x: torch.Tensor, weight: torch.Tensor, plain: torch.Tensor, packed: torch.Tensor) -> bool:
    """Whether `packed` (a rewritten linear layer's outputs) stands in for `plain` (F.linear(x, weight)'s).

    bf16 / fp16: bit for bit. float32: every element within `_FLOAT32_ROUNDING_UNITS` float32 epsilons of
    sum_i |x_i * w_i|, i.e. the same float32 products summed in another order, not computed at lower precision.
    """
    if plain.dtype != torch.float32:
        return torch.equal(plain, packed)
    scale = x.abs().double() @ weight.detach().abs().double().T
    bound = _FLOAT32_ROUNDING_UNITS * torch.finfo(torch.float32).eps * scale
    return bool(((plain.double() - packed.double()).abs() <= bound).all())
