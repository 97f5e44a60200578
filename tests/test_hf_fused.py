"""Fused q/k/v and gate/up projections (actors.engines.hf.fused): bit-identical to transformers' own Llama layers in
bf16, within float32 rounding of them in float32 (oneDNN sums in another order than MKL)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine
from actors.engines.hf.fused import FusedLlamaAttention, FusedLlamaMLP, concat_linears, fuse_decoder_layers
from actors.engines.hf.weights import pack_linear_layers, packing_matches
from bench.generate import model_shapes


def _random_llama(bias: bool, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attention_bias=bias, mlp_bias=bias)
    return LlamaForCausalLM(config).to(dtype).eval()


def _needs_packing():
    if not packing_matches(torch.nn.Linear(64, 64, dtype=torch.bfloat16), 4):
        pytest.skip("oneDNN packed linear unavailable in this torch build")


def test_concat_linears_puts_outputs_side_by_side():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)
    x = torch.randn(5, 3)
    fused = concat_linears((a, b))
    assert (fused.in_features, fused.out_features) == (3, 3)
    torch.testing.assert_close(fused(x), torch.cat([a(x), b(x)], dim=-1))
    with pytest.raises(ValueError, match="bias"):
        concat_linears((a, torch.nn.Linear(3, 1, bias=False)))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_fused_model_gives_the_same_logits_bit_for_bit(bias):
    _needs_packing()
    plain = _random_llama(bias)
    packed, fused = copy.deepcopy(plain), copy.deepcopy(plain)
    pack_linear_layers(packed, 4)
    assert fuse_decoder_layers(fused, 4) == 4  # 2 layers x (attention, MLP)
    pack_linear_layers(fused, 4)
    assert all(isinstance(layer.self_attn, FusedLlamaAttention) and isinstance(layer.mlp, FusedLlamaMLP)
               for layer in fused.model.layers)
    ids = torch.randint(0, 300, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    with torch.inference_mode():
        outs = [model(input_ids=ids, attention_mask=mask, use_cache=True) for model in (packed, fused)]
        assert torch.equal(outs[0].logits, outs[1].logits)
        # one decode step on each model's cache
        step = torch.randint(0, 300, (3, 1), generator=torch.Generator().manual_seed(2))
        step_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        steps = [model(input_ids=step, attention_mask=step_mask, past_key_values=out.past_key_values)
                 for model, out in zip((packed, fused), outs)]
        assert torch.equal(steps[0].logits, steps[1].logits)
        # and packing alone is bit-identical to the plain model (the engine's precondition)
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits, outs[0].logits)


def test_float32_fused_model_stays_within_float32_rounding_of_the_plain_one():
    _needs_packing()
    plain = _random_llama(bias=False, dtype=torch.float32)
    fused = copy.deepcopy(plain)
    # float32 is fused too (the dtype of CPUs without native bf16), not only bf16
    assert fuse_decoder_layers(fused, 4) == 4
    assert pack_linear_layers(fused, 4) == 1  # the LM head
    ids = torch.randint(0, 300, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected, got = plain(input_ids=ids).logits, fused(input_ids=ids).logits
    # another summation order: float32 rounding apart (~1e-7 relative), not bf16's ~1e-3
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_non_llama_modules_are_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert fuse_decoder_layers(model, 4) == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engine_fuses_llama_layers_and_matches_plain_generate(tiny_model_dir, dtype):
    engine = HFEngine(EngineSpec(model=tiny_model_dir, dtype=dtype, device="cpu", num_threads=1))
    if not engine.packed_layers:
        pytest.skip("oneDNN packed linear unavailable in this torch build")
    layers = engine.model.config.num_hidden_layers
    assert engine.fused_modules == 2 * layers
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=getattr(torch, dtype)).eval()
    # the fused layers' widths still count as the model's linear weights (bench.generate's FLOP count)
    assert model_shapes(engine.model) == model_shapes(plain)
    prompt = "Explain why the sky is blue in one sentence."
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True).input_ids
    with torch.inference_mode():
        out = plain.generate(ids, max_new_tokens=10, do_sample=False)
    [completion] = engine.generate([ChatRequest([{"role": "user", "content": prompt}],
                                                SamplingParams(max_tokens=10))])
    expected = [t for t in out[0, ids.shape[1]:].tolist() if t not in engine.settings.eos_ids]
    assert completion.raw_text == engine.tokenizer.decode(expected, skip_special_tokens=True)
