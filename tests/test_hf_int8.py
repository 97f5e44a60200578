"""`engine.quantize: int8`, the hf engine's declared int8 option for CPUs without native bf16: the rounding by hand,
the error bound its probe enforces (with a kernel it must refuse), the engine's greedy answers pinned to an
independent int8 reference on the bundled SmolLM2, and the config checks and cache key."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams, check_engine
from actors.engines.hf.engine import HFEngine, render_prompt
from actors.engines.hf.int8 import (
    Int8Linear,
    int8_available,
    int8_close,
    layer_matches,
    quantize_linear_layers,
    quantize_rows,
)
from core.errors import ConfigError
from tests.test_hf_fast_path import MAX_TOKENS, MESSAGES

pytestmark = pytest.mark.skipif(not int8_available(), reason="this torch build has no CPU torch._int_mm")


def test_each_row_is_rounded_with_its_own_step():
    x = torch.tensor([[0.5, -1.27, 0.004], [0.0, 0.0, 0.0]])
    q, step = quantize_rows(x)
    # row 0: step 1.27 / 127 = 0.01 -> 50, -127, 0 (0.4 rounds down); an all-zero row stays zero
    assert q.tolist() == [[50, -127, 0], [0, 0, 0]]
    assert step[0, 0].item() == pytest.approx(0.01)
    assert q.dtype == torch.int8


def test_exactly_representable_values_multiply_exactly():
    # weights on their rows' int8 grids (steps 0.01 and 1/127), inputs on theirs: nothing is rounded
    linear = torch.nn.Linear(2, 2, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.27, -0.5], [1.0, -1.0]]))
        linear.bias.copy_(torch.tensor([0.25, -1.0]))
    x = torch.tensor([[127.0, 1.0], [-2.54, 0.0]])
    out = Int8Linear(linear)(x)
    # row 0: 127 * 1.27 - 0.5 + 0.25 = 161.04; 127 - 1 - 1 = 125. row 1: -2.54 * 1.27 + 0.25 = -2.9758; -3.54
    assert out.flatten().tolist() == pytest.approx([161.04, 125.0, -2.9758, -3.54], rel=1e-6)


def test_a_layer_stays_within_int8_rounding_and_a_wrong_kernel_does_not():
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 960, bias=False)
    quantized = Int8Linear(linear)
    assert layer_matches(linear, quantized, rows=16)
    x = torch.randn(8, 576)
    plain = linear(x)
    assert int8_close(x, linear.weight, plain, quantized(x))
    # controls: the bound (a worst case, so loose for one element) still refuses one scale for the whole batch (an
    # outlier token rounds every other token to a few levels) and a kernel that reads the weight's rows out of order
    outlier = x.clone()
    outlier[0, 0] = 400.0
    one_step = torch.round(outlier / (outlier.abs().max() / 127)) * (outlier.abs().max() / 127)
    assert not int8_close(outlier, linear.weight, linear(outlier), linear(one_step))
    assert not int8_close(x, linear.weight, plain, plain.roll(1, dims=-1))


def _reference_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Every linear layer but the LM head as the option defines it, written independently: integer products summed
    exactly in float64, then converted and rescaled in float32 (what an exact int32 sum gives)."""

    class Reference(torch.nn.Module):
        def __init__(self, linear):
            super().__init__()
            w = linear.weight.detach()
            self.w_step = w.abs().amax(dim=1) / 127
            self.wq = torch.round(w / self.w_step[:, None]).clamp(-127, 127).double()
            self.bias = linear.bias

        def forward(self, x):
            rows = x.reshape(-1, x.shape[-1])
            step = rows.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / 127
            xq = torch.round(rows / step).clamp(-127, 127).double()
            out = (xq @ self.wq.T).float() * step * self.w_step
            out = out if self.bias is None else out + self.bias
            return out.reshape(*x.shape[:-1], -1)

    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and child is not head:
                setattr(parent, name, Reference(child))
    return model


# A forward of the engine's model differs from the plain model's by float32 rounding (~4e-5 in the logits: its fused
# attention and prefix-sharing attention sum in another order); at float32 that leaves greedy tokens unchanged
# (test_hf_fast_path), but int8 rounds every activation to a step of ~1 % of its row's largest value, so such a
# difference can move an element by one step and near-tied tokens later on. Measured: every token the engine chose was
# within 0.96 logits of the reference's best (SmolLM2, these 8 prompts x 40 tokens).
_NEAR_TIE_LOGITS = 1.5


@pytest.mark.slow
def test_int8_layers_equal_an_independent_int8_reference_and_the_engine_follows_it_on_smollm2(smollm2_dir):
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    reference = _reference_int8(copy.deepcopy(plain))
    quantized = copy.deepcopy(plain)
    assert quantize_linear_layers(quantized, rows=4) == 30 * 7  # q, k, v, o, gate, up, down; the LM head left
    engine = HFEngine(EngineSpec(model=smollm2_dir, device="cpu", quantize="int8", max_batch_size=4))
    # q/k/v and gate/up fused, then 4 int8 projections per layer; the LM head float32 and prepacked
    assert (engine.dtype, engine.fused_modules, engine.int8_layers) == (torch.float32, 60, 120)
    assert not isinstance(engine.model.lm_head, Int8Linear)
    tokenizer = engine.tokenizer
    prompts = [tokenizer(render_prompt(tokenizer, m, thinking=False), add_special_tokens=False).input_ids
               for m in MESSAGES]
    with torch.inference_mode():
        # the option's layers are the reference bit for bit: a whole forward of the model, and a fused layer
        ids = torch.tensor([prompts[2]])
        assert torch.equal(quantized(ids).logits, reference(ids).logits)
        h = torch.randn(3, 7, 576, generator=torch.Generator().manual_seed(0))
        layer = quantized.model.layers[0].self_attn
        separate = torch.cat([layer.q_proj(h), layer.k_proj(h), layer.v_proj(h)], dim=-1)
        assert torch.equal(engine.model.model.layers[0].self_attn.qkv_proj(h), separate)
    # 8 prompts through 4 rows (rows finish and are refilled): every token the engine picked is the reference's
    # choice up to a near tie, checked with the answer fed back (teacher forcing)
    completions = engine.generate([ChatRequest(m, SamplingParams(max_tokens=MAX_TOKENS)) for m in MESSAGES])
    engine.close()
    exact = 0
    for prompt, completion in zip(prompts, completions):
        answer = tokenizer(completion.raw_text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            logits = reference(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1]
        gaps = logits.max(dim=-1).values - logits.gather(1, torch.tensor(answer)[:, None])[:, 0]
        assert gaps.max().item() <= _NEAR_TIE_LOGITS, (completion.raw_text, gaps.max().item())
        exact += int(gaps.max().item() == 0)
    assert exact >= 1  # a control that the check reads the right positions: some answers follow it exactly


@pytest.mark.parametrize(("fields", "message"), [
    ({"kind": "vllm"}, "kind='vllm'"),
    ({"dtype": "bfloat16"}, "dtype='bfloat16'"),
    ({"device": "cuda"}, "device='cuda'"),
    ({"quantize": "int4"}, "int4"),
])
def test_int8_is_refused_where_it_cannot_run(fields, message):
    spec = EngineSpec(**{"quantize": "int8", **fields})
    with pytest.raises(ConfigError, match=r"judge\.engine\.quantize") as error:
        check_engine(spec, "judge.engine")
    assert message in str(error.value)


def test_int8_answers_have_their_own_cache_key():
    default = EngineSpec()
    assert ":quantize" not in default.cache_identity()  # the default's key is unchanged
    assert EngineSpec(quantize="int8").cache_identity() == default.cache_identity() + ":quantize=int8"
