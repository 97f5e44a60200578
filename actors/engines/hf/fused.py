"""Fused projections for the hf engine's CPU decoder layers: q/k/v as one prepacked matmul, gate/up as another.

Why: a decode step of a 16-row batch is 211 small matrix products on SmolLM2-135M, and each pays a call's fixed
cost and reads its input again. One product over the concatenated q/k/v weights (and one over gate/up) reads
the input once and pays one call's cost where there were three (two); on 2 cores a 16-row decode step went from
42 to 39 ms in the engine (bench.generate; docs/benchmarks.md). Concatenating output rows does not change any output
element's sum, and the fused layers are probed against the separate ones before a model is fused: in bf16 outputs
are bit-identical, so greedy tokens do not change; in float32 (CPUs without native bf16) the prepacked oneDNN
product sums in another order than the plain layers' MKL one, and must agree within float32 rounding
(`weights.outputs_match`); greedy tokens are pinned to plain `generate`'s by tests/test_hf_fast_path.py.

Only exact `LlamaAttention` / `LlamaMLP` modules (Llama, SmolLM2) are fused: their forwards are mirrored here
line for line, with the projections fused. Other architectures keep their own modules (prepacked, unfused). This
is the fusion vLLM's and llama.cpp's model code does by hand too (`QKVParallelLinear`, `MergedColumnParallelLinear`);
transformers' CPU path has none, and `torch.compile` does not fuse through oneDNN's prepacked weights.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from actors.engines.hf.weights import PackedLinear, outputs_match, packing_matches


class FusedLlamaAttention(torch.nn.Module):
    """`LlamaAttention` with q/k/v projected by one prepacked matmul; its forward is transformers' otherwise."""

    def __init__(self, attention: LlamaAttention, batch_size: int, pack: bool = True):
        super().__init__()
        for name in ("config", "layer_idx", "head_dim", "num_key_value_groups", "scaling", "attention_dropout",
                     "is_causal"):
            setattr(self, name, getattr(attention, name))
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        self.split_sizes = [p.out_features for p in projections]
        self.qkv_proj = _packed(concat_linears(projections), batch_size, pack)
        self.o_proj = _packed(attention.o_proj, batch_size, pack)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, past_key_values=None,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query, key, value = self.qkv_proj(hidden_states).split(self.split_sizes, dim=-1)
        query_states = query.view(hidden_shape).transpose(1, 2)
        key_states = key.view(hidden_shape).transpose(1, 2)
        value_states = value.view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                    eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class FusedLlamaMLP(torch.nn.Module):
    """`LlamaMLP` with gate and up projected by one prepacked matmul."""

    def __init__(self, mlp: LlamaMLP, batch_size: int, pack: bool = True):
        super().__init__()
        self.gate_up_proj = _packed(concat_linears((mlp.gate_proj, mlp.up_proj)), batch_size, pack)
        self.down_proj = _packed(mlp.down_proj, batch_size, pack)
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _packed(linear: torch.nn.Linear, batch_size: int, pack: bool) -> torch.nn.Module:
    """`linear` prepacked for oneDNN, or kept plain for a later pass (`actors.engines.hf.int8` quantises it)."""
    return PackedLinear(linear, batch_size) if pack else linear


def concat_linears(linears: tuple[torch.nn.Linear, ...]) -> torch.nn.Linear:
    """One nn.Linear whose outputs are those of `linears` side by side (same input size; biases all or none)."""
    has_bias = {linear.bias is not None for linear in linears}
    if len(has_bias) != 1 or len({linear.in_features for linear in linears}) != 1:
        raise ValueError("concat_linears: the layers differ in input size or in having a bias")
    first = linears[0]
    fused = torch.nn.Linear(first.in_features, sum(linear.out_features for linear in linears), bias=has_bias.pop(),
                            dtype=first.weight.dtype, device=first.weight.device)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([linear.weight for linear in linears]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([linear.bias for linear in linears]))
    return fused


def fuse_decoder_layers(model: torch.nn.Module, batch_size: int, pack: bool = True) -> int:
    """Swap each exact LlamaAttention / LlamaMLP of a CPU model for its fused, prepacked form.

    The first attention and MLP are probed first (decode- and prefill-shaped inputs): the fused outputs must match
    the separate projections (bit for bit in bf16, within float32 rounding in float32), else nothing is swapped.
    `pack=False` keeps the fused projections plain nn.Linear (concatenated weights), for `engine.quantize: int8`
    to quantise next.

    Returns:
        How many modules were swapped (attention and MLP counted apart; 0 when oneDNN packing is unavailable, the
        probe differs, or the model has no Llama layers).
    """
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) in (LlamaAttention, LlamaMLP)]
    first = {}  # kind -> its first module, the probe
    for _, _, child in targets:
        first.setdefault(type(child), child)
    if len(first) != 2 or (pack and not packing_matches(first[LlamaAttention].q_proj, batch_size)):
        return 0
    kinds = {LlamaAttention: FusedLlamaAttention, LlamaMLP: FusedLlamaMLP}
    fused = {id(child): kinds[type(child)](child, batch_size, pack) for _, _, child in targets}
    if not all(_same_outputs(probe, fused[id(probe)], batch_size) for probe in first.values()):
        return 0
    for parent, name, child in targets:
        setattr(parent, name, fused[id(child)])
    return len(targets)


def _same_outputs(module: torch.nn.Module, fused: torch.nn.Module, batch_size: int) -> bool:
    """The fused module's projections match the separate ones (`outputs_match`: bit for bit in bf16, within float32
    rounding in float32) on a decode- and a prefill-shaped probe."""
    if isinstance(module, LlamaAttention):
        separate = (module.q_proj, module.k_proj, module.v_proj)
        pairs = [(separate, fused.qkv_proj), ((module.o_proj,), fused.o_proj)]
    else:
        pairs = [((module.gate_proj, module.up_proj), fused.gate_up_proj), ((module.down_proj,), fused.down_proj)]
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for shape in ((batch_size, 1), (2, 37)):
            for linears, packed in pairs:
                weight = torch.cat([linear.weight for linear in linears])
                x = torch.randn(*shape, packed.in_features, generator=generator).to(weight.dtype)
                plain = torch.cat([linear(x) for linear in linears], dim=-1)
                if not outputs_match(x, weight, plain, packed(x)):
                    return False
    return True
