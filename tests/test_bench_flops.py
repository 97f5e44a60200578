"""The useful-FLOP count behind `bench roofline_fraction`, on the tiny Llama, before and after weight packing."""

from __future__ import annotations

import pytest
import torch

from actors.engines.base import Completion, EngineSpec
from actors.engines.hf.engine import HFEngine
from bench.generate import count_useful_flops, model_shapes
from bench.roofline import config_shapes


def test_flops_count_every_linear_layer_packed_or_not(tiny_model_dir):
    # 2 layers, d 64, 4 heads (head_dim 16), 2 kv heads (kv width 32), MLP 128, vocab from SmolLM2's tokenizer
    engine = HFEngine(EngineSpec(model=tiny_model_dir, dtype="float32", device="cpu", num_threads=1))
    vocab = engine.model.config.vocab_size
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k+v, o, gate+up+down
    linear = 2 * per_layer + 64 * vocab  # + LM head
    # one completion of 3 tokens after a 5-token prompt: contexts 5, 6, 7 -> sum 18
    completions = [Completion(text="x", prompt_tokens=5, completion_tokens=3)]
    expected = 2 * linear * 3 + 4 * 2 * 64 * 18
    assert count_useful_flops(engine.model, completions) == pytest.approx(expected)
    # the count from the config alone (what the llama.cpp side uses) agrees with the loaded layers' shapes
    assert config_shapes(engine.model.config) == model_shapes(engine.model) == (linear, 2, 64)
    packed = HFEngine(EngineSpec(model=tiny_model_dir, dtype="bfloat16", device="cpu", num_threads=1))
    if not packed.packed_layers:
        pytest.skip("oneDNN packed linear unavailable in this torch build")
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    assert count_useful_flops(packed.model, completions) == pytest.approx(expected)


def test_train_step_breakdown_shares_the_measured_step_time():
    from bench.train_step import step_breakdown

    # step 1 is warm-up; steps 2 and 3: 100 tokens at 50 tok/s = 2 s and 200 tokens at 50 tok/s = 4 s -> 3 s mean
    history = [{"step": 1, "tokens": 10, "tokens_per_s": 1.0, "time/forward_s": 9.0, "time/backward_s": 0.0,
                "time/optimizer_s": 0.0},
               {"step": 2, "tokens": 100, "tokens_per_s": 50.0, "time/forward_s": 0.5, "time/backward_s": 1.0,
                "time/optimizer_s": 0.2},
               {"step": 3, "tokens": 200, "tokens_per_s": 50.0, "time/forward_s": 1.3, "time/backward_s": 2.0,
                "time/optimizer_s": 0.4, "time/allreduce_s": 0.15}]
    shares = step_breakdown(history, warmup=1)
    assert shares["step_s"] == pytest.approx(3.0)
    assert shares["forward"] == pytest.approx(0.9 / 3) and shares["backward"] == pytest.approx(1.5 / 3)
    assert shares["optimizer"] == pytest.approx(0.3 / 3) and shares["other"] == pytest.approx(0.3 / 3)
    assert shares["allreduce"] == pytest.approx(0.05)
