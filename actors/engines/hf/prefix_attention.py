"""Attention over a prompt prefix shared by a group of rows, held once (cascade attention), for the hf engine.

Why: a judge's prompts start with the same ~650 tokens of instructions. With the prefix copied into every row's
KV buffer, each decode step attends over ~750 columns per row, and torch's CPU attention kernel handles each
(row, KV head) as a problem of 3 queries: 5.4 ms per layer and step for 32 rows, more than the layer's matrix
products (docs/benchmarks.md, bench.judge_prefix). Here the rows' buffers hold only their own columns (the rest of the prompt and
the completion); all queries of a group's rows meet the group's prefix keys/values as one attention problem per KV
head, each row its own columns as a small one, and the two softmax parts are merged through their log-sum-exps (as
FlashAttention merges blocks; FlashInfer calls this cascade attention). On CPU both run in torch's flash kernel.

`actors.engines.hf.decode` says which rows share which prefix for each forward (`prefix_groups_active`); a forward
outside it (prefix computation, reference `generate`, training) takes transformers' own SDPA path unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "quorum_prefix"

# The attention kernels a CUDA decode may use on these buffers. cuDNN's (which torch picks for masked bf16
# attention on Hopper) is left out: it builds an execution plan per new shape, and a decode step's key length is
# new at every step (bench.gpu_engine; docs/engine.md); `prefix_attention` falls back to SDPA, so it
# obeys this too. Empty = torch's own choice.
CUDA_ATTENTION_BACKENDS: tuple[SDPBackend, ...] = (
    SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernels to decode with on `device` (a no-op off CUDA)."""
    if device.type != "cuda" or not CUDA_ATTENTION_BACKENDS:
        return contextlib.nullcontext()
    return sdpa_kernel(list(CUDA_ATTENTION_BACKENDS))


@dataclass
class PrefixGroup:
    """Rows of one forward (indices into its batch) and the prefix keys/values they all attend to first."""

    rows: torch.Tensor
    # per layer, shape (1, kv_heads, length, head_dim), positions 0..length-1
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


_GROUPS: contextvars.ContextVar[list[PrefixGroup] | None] = contextvars.ContextVar("quorum_prefix_groups",
                                                                                    default=None)


@contextlib.contextmanager
def prefix_groups_active(groups: list[PrefixGroup]):
    """Forwards inside see `groups` (none: plain SDPA)."""
    token = _GROUPS.set(groups or None)
    try:
        yield
    finally:
        _GROUPS.reset(token)


def use_prefix_attention(model: torch.nn.Module) -> None:
    """Switch `model` to this attention (its masks stay SDPA's); without active groups it is SDPA itself."""
    AttentionInterface.register(NAME, prefix_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)


def prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query (rows, heads, q, dim), key/value (rows, kv_heads, cols, dim) of the
    rows' own columns, mask (rows, 1, q, cols) bool or None; returns (rows, q, heads, dim)."""
    groups = _GROUPS.get()
    if not groups or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    rows, heads, q_len, dim = query.shape
    kv_heads, cols = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    # query heads are KV-head-major (transformers' repeat_kv): (rows, kv, rep * q, dim), one problem per KV head
    q = query.reshape(rows, kv_heads, rep * q_len, dim)
    visible = None if attention_mask is None and q_len == 1 else _visible(attention_mask, rows, rep, q_len, cols,
                                                                           query.device)
    attend = _attend_flash_cpu if query.device.type == "cpu" and _FLASH_CPU is not None else _attend_matmul
    out, lse = attend(q, key, value, visible, scale)
    layer = module.layer_idx
    for group in groups:
        idx = group.rows
        n, m = len(idx), rep * q_len
        if not n:  # torch's CPU kernel divides by the query count
            continue
        # a group of every row (one template per call, the usual case) needs no gather and scatter of its rows
        every = n == rows
        # every query of the group's rows sees every prefix column: one problem of n * m queries per KV head
        flat = (q if every else q[idx]).transpose(0, 1).reshape(1, kv_heads, n * m, dim)
        prefix_out, prefix_lse = attend(flat, group.keys[layer], group.values[layer], None, scale)
        prefix_out = prefix_out.reshape(kv_heads, n, m, dim).transpose(0, 1)
        prefix_lse = prefix_lse.reshape(kv_heads, n, m).transpose(0, 1)
        if every:
            out, lse = _merge(out, lse, prefix_out, prefix_lse)
        else:
            out[idx], lse[idx] = _merge(out[idx], lse[idx], prefix_out, prefix_lse)
    out = out.reshape(rows, kv_heads, rep, q_len, dim).reshape(rows, heads, q_len, dim).transpose(1, 2)
    return out.to(query.dtype).contiguous(), None


# torch's CPU flash-attention kernel, called directly for the log-sum-exp that `scaled_dot_product_attention` does
# not return (the merge needs it); elsewhere (CUDA) the same maths in plain matrix products
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend_flash_cpu(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor | None,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised output (float32) and log-sum-exp per query; the kernel wants an additive mask of q's dtype."""
    mask = None
    if visible is not None:
        mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill_(~visible, float("-inf"))
    out, lse = _FLASH_CPU(q, keys, values, 0.0, False, attn_mask=mask, scale=scale)
    return out.float(), lse.float()


def _attend_matmul(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor | None,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as `_attend_flash_cpu` in float32 matrix products; a query that sees nothing gives 0 and -inf."""
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = scores.logsumexp(-1)
    weights = (scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None]).exp()
    return torch.matmul(weights, values.float()), lse


def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two normalised softmax parts over disjoint columns as one: weights exp(lse - max), as FlashAttention's blocks."""
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    a, b = (lse_a - top).exp(), (lse_b - top).exp()
    total = (a + b).clamp_min(torch.finfo(torch.float32).tiny)
    out = (torch.nan_to_num(out_a) * a[..., None] + out_b * b[..., None]) / total[..., None]
    return out, top + total.log()


def _visible(mask: torch.Tensor | None, rows: int, rep: int, q_len: int, cols: int,
             device: torch.device) -> torch.Tensor:
    """(rows, 1, rep * q, cols) bool: the mask repeated for each query head of a KV head; causal when SDPA's mask
    was skipped (no padding: transformers then relies on `is_causal`)."""
    if mask is None:
        causal = torch.ones(q_len, cols, dtype=torch.bool, device=device).tril(cols - q_len)
        return causal.repeat(rep, 1)[None, None].expand(rows, 1, rep * q_len, cols)
    if mask.dtype != torch.bool:  # an additive float mask
        mask = mask == 0
    mask = mask.expand(rows, 1, q_len, cols)
    return mask[:, :, None].expand(rows, 1, rep, q_len, cols).reshape(rows, 1, rep * q_len, cols)
