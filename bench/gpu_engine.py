"""Generation throughput of the hf engine on a CUDA GPU: by batch size, vs bare `model.generate`, vs a matmul peak.

    python -m bench.gpu_engine                                   # SmolLM2-135M, 256 prompts, 64 new tokens
    python -m bench.gpu_engine --prompts 512 --batch-sizes 32,128,512 --model /path/to/hf_model_dir

The CPU bench (`bench.generate`) measures the engine where quorum is tested; this one measures its device path
(`engine.device=cuda`, `auto` dtype = bf16) where the jobs run on a cluster without vLLM. Prints `bench <name> =
<value>` lines:

- `gpu_engine_tokens_per_s_b<B>`: completion tokens / wall seconds of one `HFEngine.generate` over all prompts at
  `max_batch_size` B (prompts of bench.generate's simplification request, greedy);
- `gpu_bare_generate_tokens_per_s`: plain transformers at bf16, left-padded batches of the largest B, in order,
  `model.generate(do_sample=False)`, tokens counted up to each row's first EOS as the engine counts them;
- `gpu_engine_vs_bare_generate`: the two at the largest B;
- `gpu_roofline_fraction`: useful FLOP/s of the engine at the largest B (generated tokens only, bench.roofline)
  / the best bf16 8192^3 matmul rate measured in this process.

A random model of SmolLM2's shape (a GPU machine without the bundled GGUF) gives the same speeds: the
arithmetic depends on the shapes, the token count on where each row meets EOS (counted either way).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.engines.base import EngineSpec
from actors.engines.hf.engine import HFEngine, render_prompt
from actors.models import resolve_model_dir
from bench.generate import _count_until_eos, build_requests, count_useful_flops


def cuda_matmul_peak(size: int = 8192, reps: int = 10) -> float:
    """Best bf16 FLOP/s of a `size`^3 product on the GPU (CUDA events, after warm-ups)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return 2 * size**3 / best


def bare_generate(model_dir: str, requests, batch_size: int) -> float:
    """Tokens/s of `model.generate(do_sample=False)` at bf16 over left-padded batches, after one warm-up batch."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    texts = [render_prompt(tokenizer, r.messages, False) for r in requests]
    max_new = max(r.sampling.max_tokens for r in requests)

    def run(chunk: list[str]) -> torch.Tensor:
        batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
        out = model.generate(**batch, max_new_tokens=max_new, do_sample=False)
        return out[:, batch.input_ids.shape[1]:].cpu()

    with torch.inference_mode():
        run(texts[:batch_size])
        torch.cuda.synchronize()
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(texts), batch_size):
            tokens += _count_until_eos(run(texts[i: i + batch_size]), eos)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return tokens / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec (alias, HF dir or hf:<repo>)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="16,64,256", help="engine max_batch_size values, comma-separated")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_engine: no CUDA GPU visible (torch.cuda.is_available() is False)")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    model_dir = resolve_model_dir(args.model)
    requests = build_requests(args.prompts, args.max_tokens)
    print(f"info device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    peak = cuda_matmul_peak()
    print(f"info bf16_matmul_peak_tflops {peak / 1e12:.1f}", flush=True)
    rate = flops = 0.0
    for size in sizes:
        engine = HFEngine(EngineSpec(model=model_dir, device="cuda", max_batch_size=size))
        engine.generate(requests[:size])  # warm-up at this width
        torch.cuda.synchronize()
        start = time.perf_counter()
        done = engine.generate(requests)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        errors = sum(c.finish_reason == "error" for c in done)
        rate, flops = sum(c.completion_tokens for c in done) / seconds, count_useful_flops(engine.model, done)
        print(f"info b{size} dtype {engine.dtype} seconds {seconds:.2f} errors {errors} "
              f"prefilled_tokens {engine.last_stats.prefilled_tokens}", flush=True)
        print(f"bench gpu_engine_tokens_per_s_b{size} = {rate:.1f}", flush=True)
        engine.close()
        flops = flops / seconds
    bare = bare_generate(model_dir, requests, sizes[-1])
    print(f"bench gpu_bare_generate_tokens_per_s = {bare:.1f}")
    print(f"bench gpu_engine_vs_bare_generate = {rate / bare:.2f}")
    print(f"bench gpu_roofline_fraction = {flops / peak:.4f}")


if __name__ == "__main__":
    main()
