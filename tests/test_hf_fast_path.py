"""The hf engine's CPU fast path at float32 (fused q/k/v and gate/up, oneDNN-prepacked linear layers), the dtype a
CPU without native bf16 runs: greedy outputs pinned to the unmodified model's `generate` on the bundled SmolLM2, the
probe that lets a float32 kernel in, and `QUORUM_CPU_BF16=0` (run as on a CPU without bf16)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine, collect_eos_ids, render_prompt
from actors.engines.hf.weights import (
    CPU_BF16_ENV,
    PackedLinear,
    cpu_has_native_bf16,
    outputs_match,
    packing_matches,
    pick_dtype,
)
from bench.prompts import INSTRUCTION, SENTENCES, SYSTEM
from train.precision import worker_precision

# bench.generate's system prompt and instruction (a 44-token shared prefix) on sentences of several lengths, and two
# questions without them: one call mixes a shared-prefix group with rows of their own.
MESSAGES = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": INSTRUCTION + sentence}]
            for sentence in SENTENCES[:6]]
MESSAGES += [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Name three primary colours."}]]
MAX_TOKENS = 40


@pytest.fixture(autouse=True)
def _detected_cpu(monkeypatch):
    """These tests choose their dtypes themselves: whatever the caller's shell says about the CPU is not theirs."""
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)


@pytest.mark.slow
def test_float32_fast_path_greedy_equals_the_plain_model_on_smollm2(smollm2_dir):
    engine = HFEngine(EngineSpec(model=smollm2_dir, dtype="float32", device="cpu", max_batch_size=4))
    if not engine.packed_layers:
        pytest.skip("oneDNN packed linear unavailable in this torch build")
    # the fast path is on: 30 attention + 30 MLP modules fused, the LM head (the one linear left) prepacked
    assert (engine.dtype, engine.fused_modules, engine.packed_layers) == (torch.float32, 60, 1)
    assert isinstance(engine.model.lm_head, PackedLinear)
    # 8 prompts through 4 rows: rows finish and are refilled mid-flight, as in a real call
    completions = engine.generate([ChatRequest(m, SamplingParams(max_tokens=MAX_TOKENS)) for m in MESSAGES])
    engine.close()
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    eos = collect_eos_ids(plain, engine.tokenizer)
    for messages, completion in zip(MESSAGES, completions):
        ids = engine.tokenizer(render_prompt(engine.tokenizer, messages, thinking=False), add_special_tokens=False,
                               return_tensors="pt").input_ids
        with torch.inference_mode():
            out = plain.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                 do_sample=False)
        expected = [token for token in out[0, ids.shape[1]:].tolist() if token not in eos]
        assert completion.raw_text == engine.tokenizer.decode(expected, skip_special_tokens=True)
    assert len({c.raw_text for c in completions}) == len(MESSAGES)  # eight prompts, eight different answers


def test_float32_probe_accepts_reordered_sums_and_rejects_lowered_precision():
    linear = torch.nn.Linear(576, 192, bias=False)
    if not packing_matches(linear, 16):  # oneDNN's float32 op, another summation order than MKL's
        pytest.skip("oneDNN packed linear unavailable in this torch build")
    x = torch.randn(16, 1, 576, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = linear(x)
        packed = PackedLinear(linear, 16)(x)
        # what a kernel computing from bf16- or tf32-rounded inputs would give (oneDNN's fp32_precision settings)
        bf16 = torch.nn.functional.linear(x.bfloat16().float(), linear.weight.bfloat16().float())
        tf32 = torch.nn.functional.linear(_round_mantissa(x, 10), _round_mantissa(linear.weight, 10))
    assert outputs_match(x, linear.weight, plain, packed)
    assert not outputs_match(x, linear.weight, plain, bf16)
    assert not outputs_match(x, linear.weight, plain, tf32)
    # bf16 layers still need bit-identical outputs: one rounding step apart is a mismatch
    half = plain.bfloat16()
    assert not outputs_match(x.bfloat16(), linear.weight.bfloat16(), half, half + half.abs().max() / 64)


def _round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """`t` rounded to `bits` mantissa bits (tf32 keeps 10), as float32."""
    mantissa, exponent = torch.frexp(t.detach())
    return torch.ldexp(torch.round(mantissa * 2 ** (bits + 1)) / 2 ** (bits + 1), exponent)


def test_quorum_cpu_bf16_0_runs_engine_and_training_as_on_a_cpu_without_bf16(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert not cpu_has_native_bf16()
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert worker_precision("auto", use_gpu=False) == "fp32"
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # an explicit dtype is not overridden
    monkeypatch.setenv(CPU_BF16_ENV, "no")
    with pytest.raises(ValueError, match=CPU_BF16_ENV):
        cpu_has_native_bf16()
