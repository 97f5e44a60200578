"""Useful FLOPs of generated tokens, shared by every engine `bench.generate` measures (pure: no torch).

Per generated token at context length t (prompt + tokens so far): 2 * N + 4 * n_layers * t * d_attn, with N the
weights of every linear layer, the LM head included (it runs once per generated token), and d_attn = heads *
head_dim (QK^T and AV). Prompt prefill is not counted: it is overhead for a generation benchmark. The same count
serves the hf engine (bf16 weights) and llama.cpp (the GGUF's Q4_1 / Q8_0 weights): it is the model's arithmetic,
whatever precision an engine does it in.
"""

from __future__ import annotations


def useful_flops(linear_weights: int, num_layers: int, d_attn: int, lengths: list[tuple[int, int]]) -> float:
    """FLOPs of the generated tokens of completions given as (prompt_tokens, completion_tokens) pairs.

    >>> useful_flops(100, 2, 8, [(5, 3)])  # contexts 5, 6, 7 -> 18; 2*100*3 + 4*2*8*18
    1752.0
    """
    flops = 0.0
    for prompt, completion in lengths:
        contexts = completion * prompt + completion * (completion - 1) / 2
        flops += 2 * linear_weights * completion + 4 * num_layers * d_attn * contexts
    return flops


def config_shapes(config) -> tuple[int, int, int]:
    """(linear weights, layers, d_attn) of a Llama-style decoder from its config (q, k, v, o, gate/up/down, head).

    For an engine that holds no torch model (llama.cpp); the hf side counts the loaded layers' shapes instead, and
    tests/test_bench_llamacpp.py checks that both agree.
    """
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    d, d_attn = config.hidden_size, heads * head_dim
    per_layer = 2 * d * d_attn + 2 * d * kv_heads * head_dim + 3 * d * config.intermediate_size
    return config.num_hidden_layers * per_layer + d * config.vocab_size, config.num_hidden_layers, d_attn
