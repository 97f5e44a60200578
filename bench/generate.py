"""Generation throughput of the hf engine: batched vs one at a time, vs bare `model.generate`, vs a roofline.

    python -m bench.generate                      # SmolLM2-135M, 48 prompts, batch 16, 64 new tokens
    python -m bench.generate --prompts 32 --model /path/to/hf_model_dir

Prints `bench <name> = <value>` lines (plus `info ...` context lines):

- `engine_tokens_per_s`: completion tokens / wall time of one `HFEngine.generate` over all prompts, at
  `max_batch_size` 16 and the engine's `auto` dtype.
- `bare_generate_tokens_per_s`: plain transformers, the way most code does it: `from_pretrained` (checkpoint
  dtype, float32 here), left-padded batches of 16 in the given order, `model.generate(do_sample=False)`.
- `engine_vs_bare_generate`: the ratio of the two.
- `engine_float32_tokens_per_s`, `roofline_fraction_float32`, `engine_float32_vs_bare_generate`: the same engine at
  float32 (fused, prepacked), the path a CPU without native bf16 runs, on the same prompts in the same run, just
  before bare `generate`; the auto-dtype run's own figures where `auto` is float32 already (`QUORUM_CPU_BF16=0`).
- `batched_vs_single`: engine tokens/s on the first 16 prompts as one batch / engine tokens/s on the same 16
  prompts sent one by one (a subset keeps the slow one-by-one side to ~30 s).
- `roofline_fraction`: useful FLOP/s of the batched engine run / a bf16-or-fp32 (the engine's dtype) matmul
  peak measured in the same process just before and after it (best of 5 reps of a 2048^3 product each). Useful FLOPs count generated tokens
  only (prompt prefill is overhead here): per generated token at context length t (prompt + tokens so far),
  2 * N + 4 * n_layers * t * d_attn, with N the weights of every linear layer, the LM head included (counted
  from their shapes; it runs once per generated token), and d_attn = heads * head_dim (QK^T and AV).

With `--engines hf,llamacpp` (the default) llama.cpp (bench/llamacpp.py) completes the same prompts, token ids
from the same chat template, right after the engine's run, when llama-cpp-python is installed (`pip install
'quorum[llamacpp]'`, compiled from source; else an `info llamacpp not measured` line says so):

- `llamacpp_tokens_per_s`: greedy, `--batch-size` sequences per `llama_decode` (continuous batching), the GGUF's
  Q4_1 weights, as many threads as torch uses; `llamacpp_single_tokens_per_s`: the first batch one at a time;
- `llamacpp_roofline_fraction`: the same useful FLOPs / the same bf16 matmul peak (llama.cpp's int8 dot products
  have a peak of their own; this is the engine-to-engine yardstick, not llama.cpp's own efficiency);
- `llamacpp_vs_engine`: llama.cpp tokens/s / the engine's. `--engines llamacpp` measures llama.cpp alone.

With `--engines hf,vllmcpu --vllm-python PY` vLLM's CPU backend (bench/vllm_cpu/generate.py, in its own virtual
environment, a child process) completes the same prompt ids at the same batch size, right after the engine's run:
`vllmcpu_tokens_per_s`, `vllmcpu_roofline_fraction` (same useful FLOPs, same peak), `vllmcpu_vs_engine`; its
compile time at load is printed apart (`info vllmcpu ... load_s`), not counted.

`--gguf FILE` measures another GGUF of the model (e.g. a bf16 one from llama.cpp's `convert_hf_to_gguf.py`, the
engine's precision; the info line names the file's weight type), `--llamacpp-kv-unified` gives llama.cpp one KV
buffer for all sequences (its fastest setting at 16 rows here; bench/README.md).

With `--contention N` (0 by default), N CPU-bound processes (`while True: pass`, bench.contention: each stops by
itself, and is killed when its measurement ends) run beside a second measurement of each side, right after the
idle one on the same loaded model:

- `contention_vs_idle`: engine tokens/s with N competitors / idle; `ray_data_contention_vs_idle`: the same for the
  Ray Data stage (a fair share with one competitor on 2 cores is 0.5);
- `engine_vs_bare_generate_contention`: engine / bare `generate`, both under the N competitors (must stay >= 1);
- `engine_threads_idle`, `engine_threads_contention`: the mean torch thread count of the engine's decode steps in
  each measurement (`engine.adaptive_threads`, core.thread_tuner: it drops to ~1 when a competitor holds a core).

`--fixed-threads` turns the tuner off (every step on the engine's full thread count, as before it existed), on the
engine, bare-loop and Ray Data sides alike.

`--ray-worker-niceness 15` starts the Ray Data side's cluster with Ray's own worker nice value instead of quorum's
0 (core.ray_env.RayConfig.worker_niceness), to see what it costs beside a busy process.

Completion token counts include the EOS token, for both the engine and bare generate. Runtime ~3 min on 2
idle cores; on a busy machine every number is noisy, ratios less so (each side is measured back to back).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.engines.base import ChatRequest, Completion, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine, render_prompt
from actors.engines.hf.weights import PackedLinear
from actors.models import resolve_model_dir
from bench.contention import competitors
from bench.engines import add_engine_arguments, choose_engines
from bench.llamacpp import measure_llamacpp, measure_llamacpp_alone
from bench.prompts import INSTRUCTION, SENTENCES, SYSTEM
from bench.roofline import useful_flops
from bench.vllm_cpu.generate import measure_vllm_cpu
from core.thread_tuner import mean_threads


def build_requests(count: int, max_tokens: int) -> list[ChatRequest]:
    """`count` greedy simplification requests (cycling through SENTENCES if count exceeds them)."""
    return [
        ChatRequest(
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": INSTRUCTION + SENTENCES[i % len(SENTENCES)]},
            ],
            sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
            request_id=f"bench-{i}",
        )
        for i in range(count)
    ]


# ---------------------------------------------------------------------------------------------------------------
# Measurements


def measure_engine(engine: HFEngine, requests: list[ChatRequest]) -> tuple[float, list[Completion]]:
    """Wall seconds of one `engine.generate(requests)`, and its completions."""
    start = time.perf_counter()
    completions = engine.generate(requests)
    return time.perf_counter() - start, completions


def measure_float32(spec: EngineSpec, requests: list[ChatRequest], warm_up: list[ChatRequest]) -> float:
    """Tokens/s of the engine forced to float32 (fused and prepacked as on a CPU without bf16), measured like the
    auto-dtype run: a warm-up call, then all `requests` in one call, between two fp32 matmul peaks."""
    engine = HFEngine(dataclasses.replace(spec, dtype="float32"))
    peak = measure_matmul_peak(torch.float32)
    engine.generate(warm_up)
    seconds, completions = measure_engine(engine, requests)
    peak = max(peak, measure_matmul_peak(torch.float32))
    tps = sum(c.completion_tokens for c in completions) / seconds
    print(f"info float32 fused_modules={engine.fused_modules} packed_linear_layers={engine.packed_layers} "
          f"matmul_peak_gflops={peak / 1e9:.1f}")
    print(f"bench engine_float32_tokens_per_s = {tps:.1f}")
    print(f"bench roofline_fraction_float32 = {count_useful_flops(engine.model, completions) / seconds / peak:.3f}",
          flush=True)
    engine.close()
    return tps


def measure_one_at_a_time(engine: HFEngine, requests: list[ChatRequest]) -> float:
    """Tokens/s when each request is generated alone (batch of one)."""
    start, tokens = time.perf_counter(), 0
    for request in requests:
        [completion] = engine.generate([request])
        tokens += completion.completion_tokens
    return tokens / (time.perf_counter() - start)


def measure_bare_loop(prompts: list[ChatRequest], spec: EngineSpec) -> float:
    """Tokens/s of a bare in-process loop: one HFEngine, `generate` on chunks of `spec.max_batch_size` prompts.

    This is the no-Ray reference for the Ray Data generate stage: run that stage with the same spec and
    `map_batches(batch_size=spec.max_batch_size)` so both sides see the same batches. Includes no model load;
    one warm-up chunk is run first.
    """
    engine = HFEngine(spec)
    size = spec.max_batch_size
    engine.generate(prompts[:size])
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), size):
        tokens += sum(c.completion_tokens for c in engine.generate(prompts[i : i + size]))
    seconds = time.perf_counter() - start
    engine.close()
    return tokens / seconds


def measure_bare_generate(requests: list[ChatRequest], spec: EngineSpec, contention: int = 0) -> list[float]:
    """Tokens/s of plain `model.generate(do_sample=False)` over left-padded batches of `spec.max_batch_size`:
    idle, then (if `contention`) beside that many busy processes, on the same loaded model.

    The model is loaded as `from_pretrained` does by default (the checkpoint's dtype); generated tokens are
    counted up to and including each row's first EOS, as the engine counts them.
    """
    model_dir = resolve_model_dir(spec.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    texts = [render_prompt(tokenizer, r.messages, spec.thinking) for r in requests]
    max_new = max(r.sampling.max_tokens for r in requests)
    size = spec.max_batch_size
    rates = []
    with torch.inference_mode():
        _run_generate(model, tokenizer, texts[:2], 2)  # warm-up
        for load in (0, contention) if contention else (0,):
            with competitors(load):
                start, tokens = time.perf_counter(), 0
                for i in range(0, len(texts), size):
                    tokens += _count_until_eos(_run_generate(model, tokenizer, texts[i : i + size], max_new), eos)
                rates.append(tokens / (time.perf_counter() - start))
    return rates


def _run_generate(model, tokenizer, texts: list[str], max_new_tokens: int) -> torch.Tensor:
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
    return out[:, batch.input_ids.shape[1] :]


def _count_until_eos(generated: torch.Tensor, eos: set[int]) -> int:
    total = 0
    for row in generated.tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        total += ends[0] + 1 if ends else len(row)
    return total


def measure_matmul_peak(dtype: torch.dtype, size: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of a `size`^3 matmul at `dtype` over `reps` runs."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def count_useful_flops(model: torch.nn.Module, completions: list[Completion]) -> float:
    """FLOPs of the generated tokens only: 2 x the multiply-adds of every linear layer + attention at each context.

    Linear layers are counted from their shapes, packed or not: after `pack_linear_layers` the weights are no
    longer `nn.Parameter`s, so counting `model.parameters()` would miss almost all of them.
    """
    lengths = [(c.prompt_tokens, c.completion_tokens) for c in completions]
    return useful_flops(*model_shapes(model), lengths)


def model_shapes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(weights of every linear layer, packed or not, the LM head included; layers; heads x head_dim)."""
    config = model.config.get_text_config()
    d_attn = config.num_attention_heads * getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    linear = sum(m.in_features * m.out_features for m in model.modules()
                 if isinstance(m, (torch.nn.Linear, PackedLinear)))
    return linear, config.num_hidden_layers, d_attn


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec (alias, HF dir or hf:<repo>)")
    parser.add_argument("--prompts", type=int, default=48, help="number of prompts")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per prompt")
    parser.add_argument("--batch-size", type=int, default=16, help="engine max_batch_size / bare generate batch")
    parser.add_argument("--contention", type=int, default=0,
                        help="also measure each side beside this many CPU-bound processes (0 = idle only)")
    parser.add_argument("--ray-worker-niceness", type=int, default=0,
                        help="nice value of the Ray Data side's workers (Ray's own default: 15)")
    add_engine_arguments(parser)
    parser.add_argument("--fixed-threads", action="store_true",
                        help="engine.adaptive_threads=false: every decode step on the engine's full thread count")
    args = parser.parse_args(argv)
    if args.contention < 0:
        parser.error("--contention must be >= 0")
    engines = choose_engines(args, parser)
    if "hf" not in engines:
        if engines:
            requests = build_requests(args.prompts, args.max_tokens)
            measure_llamacpp_alone(args, requests, measure_matmul_peak(torch.bfloat16))
        return
    print(f"info load_average_1m={os.getloadavg()[0]:.2f} contention={args.contention}", flush=True)
    # `timeout` / a scheduler's SIGTERM must still run the competitors' `finally` (Python's default just exits)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    spec = EngineSpec(kind="hf", model=args.model, max_batch_size=args.batch_size,
                      adaptive_threads=not args.fixed_threads)
    requests = build_requests(args.prompts, args.max_tokens)
    subset = requests[: args.batch_size]

    engine = HFEngine(spec)
    peak_before = measure_matmul_peak(engine.dtype)
    engine.generate(subset)  # warm-up: allocator, oneDNN primitive caches
    seconds, completions = measure_engine(engine, requests)
    # Other processes' load can change during the run: the higher peak gives the more conservative fraction.
    peak = max(peak_before, measure_matmul_peak(engine.dtype))
    engine_tps = sum(c.completion_tokens for c in completions) / seconds
    roofline = count_useful_flops(engine.model, completions) / seconds / peak
    print(f"info dtype={engine.dtype} fused_modules={engine.fused_modules} packed_linear_layers={engine.packed_layers} "
          f"threads={engine.threads} adaptive_threads={engine.tuner is not None}")
    print(f"info prompts={len(requests)} prompt_tokens={sum(c.prompt_tokens for c in completions)} "
          f"prefilled_tokens={engine.last_stats.prefilled_tokens} "
          f"completion_tokens={sum(c.completion_tokens for c in completions)} matmul_peak_gflops={peak / 1e9:.1f}")
    print(f"bench engine_tokens_per_s = {engine_tps:.1f}", flush=True)
    print(f"bench roofline_fraction = {roofline:.3f}", flush=True)
    if "llamacpp" in engines:  # right after the hf engine's run, under the same load from other processes
        measure_llamacpp(args, requests, engine.tokenizer, engine.settings.eos_ids, model_shapes(engine.model), peak,
                         completions, engine_tps)
    if "vllmcpu" in engines:
        measure_vllm_cpu(args, requests, engine.tokenizer, engine.settings.eos_ids, model_shapes(engine.model), peak,
                         completions, engine_tps)
    print(f"bench engine_threads_idle = {mean_threads(engine.last_stats.thread_steps):.2f}", flush=True)
    # the same call beside the competitors, right after the idle one (same model, same load from others)
    if args.contention:
        with competitors(args.contention):
            busy_seconds, busy_completions = measure_engine(engine, requests)
        busy_tps = sum(c.completion_tokens for c in busy_completions) / busy_seconds
        busy_threads = mean_threads(engine.last_stats.thread_steps)
        print(f"bench engine_contention_tokens_per_s = {busy_tps:.1f}")
        print(f"bench contention_vs_idle = {busy_tps / engine_tps:.2f}", flush=True)
        print(f"bench engine_threads_contention = {busy_threads:.2f}", flush=True)
    # One batch of `batch_size` prompts vs the same prompts one by one (the single side is the slow part).
    subset_seconds, subset_completions = measure_engine(engine, subset)
    batch_tps = sum(c.completion_tokens for c in subset_completions) / subset_seconds
    print(f"bench batched_vs_single = {batch_tps / measure_one_at_a_time(engine, subset):.2f}", flush=True)
    float32 = engine.dtype == torch.float32
    engine.close()
    f32_tps = measure_float32(spec, requests, subset) if not float32 else engine_tps
    if float32:
        print(f"bench engine_float32_tokens_per_s = {engine_tps:.1f}")
        print(f"bench roofline_fraction_float32 = {roofline:.3f}", flush=True)

    bare_tps, *bare_busy = measure_bare_generate(requests, spec, args.contention)
    print(f"bench bare_generate_tokens_per_s = {bare_tps:.1f}")
    print(f"bench engine_vs_bare_generate = {engine_tps / bare_tps:.2f}", flush=True)
    print(f"bench engine_float32_vs_bare_generate = {f32_tps / bare_tps:.2f}", flush=True)
    if args.contention:
        print(f"bench bare_generate_contention_tokens_per_s = {bare_busy[0]:.1f}")
        print(f"bench engine_vs_bare_generate_contention = {busy_tps / bare_busy[0]:.2f}", flush=True)

    # ----- Ray Data comparison: the generate stage's worker vs the same engine in a bare in-process loop -----
    from bench.ray_data_stage import measure_ray_data

    loop_tps = measure_bare_loop(requests, spec)
    ray_tps = measure_ray_data(requests, spec, worker_niceness=args.ray_worker_niceness)
    print(f"bench bare_loop_tokens_per_s = {loop_tps:.1f}")
    print(f"bench ray_data_tokens_per_s = {ray_tps:.1f}")
    print(f"bench ray_data_vs_bare = {ray_tps / loop_tps:.2f}", flush=True)
    if args.contention:
        ray_busy_tps = measure_ray_data(requests, spec, args.contention, args.ray_worker_niceness)
        print(f"bench ray_data_contention_tokens_per_s = {ray_busy_tps:.1f}")
        print(f"bench ray_data_contention_vs_idle = {ray_busy_tps / ray_tps:.2f}", flush=True)


if __name__ == "__main__":
    main()
