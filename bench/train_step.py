"""Throughput and MFU of the ARPO + LoRA training step on Ray Train + DeepSpeed ZeRO-2, 1 worker vs 2 workers.

    python -m bench.train_step [--model smollm2-135m | tiny | <hf dir>] [--steps 4] [--warmup 1]

Both runs use the same per-worker micro batch (so 2 workers process twice the pairs per step) and
``cpus_per_worker=1`` (``OMP_NUM_THREADS=1``): on a 2-core box that is the only fair split, since the 1-worker run
must not get both cores. Every step is checkpointed so its metrics reach the driver (`TrainResult.history`); the
clock of a step starts after the previous report, so checkpoint I/O is not timed. The first ``--warmup`` steps are
dropped. Printed lines:

    bench train_tokens_per_s_1w = X       non-padding tokens (prompt+chosen and prompt+rejected) per second
    bench train_tokens_per_s_2w = X
    bench train_2_vs_1_workers = X        2-worker tokens/s ÷ 1-worker tokens/s (ideal 2.0)
    bench train_mfu = X                   2-worker achieved FLOP/s ÷ (2 × single-thread matmul peak)
    bench train_mfu_1w = X                1-worker achieved FLOP/s ÷ single-thread matmul peak
    bench train_step_s_2w = X             seconds per step of the 2-worker run, and where they go:
    bench train_forward_frac_2w = X       forward + loss
    bench train_backward_frac_2w = X      backward, including ZeRO-2's gradient reduction (hooks inside backward)
    bench train_optimizer_frac_2w = X     optimizer step, including ZeRO-2's all-gather of updated partitions
    bench train_other_frac_2w = X         the rest: collation, tokenization, metric reduction
    bench train_allreduce_frac_2w = X     one all-reduce of the LoRA gradient's size on the same process group,
                                          timed apart (part of backward + optimizer above, not an extra slice)

FLOPs per token (the formula; not 6·N): with LoRA the base weights are frozen, so autograd computes input gradients
through every base matmul but no weight gradients for them. Per token that is forward 2·N + backward 2·N for the
N base matmul weights, plus 6·N_lora for the adapters (forward, input and weight gradients): 4·N + 6·N_lora.
N counts the weights of every base `nn.Linear` including the (tied) output head; the embedding lookup costs nothing
and attention-score FLOPs (~2% at these lengths) are left out. The 6·N·T convention of full fine-tuning would
overstate the work by about half. The matmul peak is the best of 20 1024×1024 matmuls on one thread, measured
in this process before the runs, in the dtype the training's matrix products run in: bfloat16 under `precision`
bf16-autocast (what "auto" resolves to on a CPU with native bf16, `--precision`), else float32.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

SYSTEM = "Rewrite the sentence in simpler words."
SOURCES = [
    "The committee postponed the decision indefinitely because several members were absent.",
    "He was unable to attend the ceremony owing to a prolonged illness.",
    "The municipality commenced construction of the new library in 1990.",
    "She possesses considerable expertise in the taxonomy of tropical plants.",
    "The phenomenon was subsequently elucidated by researchers at the university.",
    "They endeavoured to ameliorate the conditions of the workers in the factory.",
    "Precipitation is anticipated across the region tomorrow afternoon.",
    "The edifice, which had stood for two centuries, was demolished last year.",
]


def make_rows(n: int = 16) -> list[dict]:
    """Synthetic simplification pairs of realistic length (chosen: a shortened source; rejected: the source)."""
    rows = []
    for i in range(n):
        source = SOURCES[i % len(SOURCES)]
        rows.append({"prompt_messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": source}],
                     "chosen": " ".join(source.split()[:6]) + ".", "rejected": source})
    return rows


def matmul_peak_flops(size: int = 1024, repeats: int = 20, dtype: str = "float32") -> float:
    """Best single-thread matmul FLOP/s (2·n³ per product) in `dtype` (the training's matmul precision)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = (torch.randn(size, size, dtype=getattr(torch, dtype)) for _ in range(2))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(threads)
    return 2 * size**3 / best


def flops_per_token(model_dir: str, cfg) -> tuple[float, int, int]:
    """``4·N + 6·N_lora`` (see the module docstring) for the LoRA model the workers build."""
    import torch

    from train.engine import build_lora_model

    model = build_lora_model(model_dir, cfg)
    base = sum(m.weight.numel() for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "lora_" not in name)
    lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 4.0 * base + 6.0 * lora, base, lora


def measured_tokens_per_s(history: list[dict], warmup: int) -> float:
    """Tokens ÷ seconds over the steps after warm-up (each step's seconds = its tokens ÷ its tokens/s)."""
    steps = [m for m in history if m["step"] > warmup]
    if not steps:
        raise SystemExit(f"bench: no steps after warm-up in history {[m['step'] for m in history]}")
    tokens = sum(m["tokens"] for m in steps)
    return tokens / sum(m["tokens"] / m["tokens_per_s"] for m in steps)


def run(model_dir: str, workers: int, args, out: Path) -> tuple[float, dict[str, float]]:
    from train.config import DeepSpeedSection, TrainConfig
    from train.preference.trainer import run_training

    total = args.warmup + args.steps
    cfg = TrainConfig(model=model_dir, loss="arpo", num_workers=workers, cpus_per_worker=1, precision=args.precision,
                      micro_batch_size=args.micro, grad_accum=1, max_steps=total, checkpoint_every=1,
                      keep_checkpoints=total, deepspeed=DeepSpeedSection(zero_stage=2), run_name=f"bench_{workers}w",
                      max_prompt_length=args.max_prompt_length, max_completion_length=args.max_completion_length)
    result = run_training(cfg, make_rows(), run_dir=str(out / f"{workers}w"))
    return measured_tokens_per_s(result.history, args.warmup), step_breakdown(result.history, args.warmup)


def step_breakdown(history: list[dict], warmup: int) -> dict[str, float]:
    """Mean seconds per step after warm-up, and each phase's share of it (see the module docstring)."""
    steps = [m for m in history if m["step"] > warmup]
    seconds = sum(m["tokens"] / m["tokens_per_s"] for m in steps) / len(steps)
    shares = {name: sum(m[f"time/{name}_s"] for m in steps) / len(steps) / seconds
              for name in ("forward", "backward", "optimizer")}
    shares["other"] = 1.0 - sum(shares.values())
    allreduce = history[-1].get("time/allreduce_s")
    if allreduce is not None:
        shares["allreduce"] = allreduce / seconds
    return {"step_s": seconds} | shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec, or 'tiny' for the tiny random Llama")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument("--micro", type=int, default=2, help="pairs per worker per step")
    parser.add_argument("--max-prompt-length", type=int, default=64)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--precision", default="auto", help="train.trainer.precision (auto, fp32, bf16-autocast)")
    args = parser.parse_args(argv)

    import ray

    from actors.models import build_tiny_random_model, resolve_model_dir
    from core.ray_env import RayConfig, init_ray
    from train.config import LoraSection, TrainConfig

    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    model_dir = build_tiny_random_model(out / "tiny") if args.model == "tiny" else resolve_model_dir(args.model)
    if not ray.is_initialized():
        init_ray(RayConfig(num_cpus=2))  # what jobs do: a local cluster, workers at nice 0
    from train.precision import worker_precision

    precision = worker_precision(args.precision, use_gpu=False)  # what the CPU workers will run
    peak = matmul_peak_flops(dtype="bfloat16" if precision == "bf16-autocast" else "float32")
    per_token, n_base, n_lora = flops_per_token(model_dir, TrainConfig(model=model_dir, lora=LoraSection()))
    runs = {workers: run(model_dir, workers, args, out) for workers in (1, 2)}
    tps = {workers: tokens_per_s for workers, (tokens_per_s, _) in runs.items()}
    print(f"# model={args.model} base_linear_params={n_base} lora_params={n_lora} flops_per_token={per_token:.4g} "
          f"matmul_peak_1thread={peak / 1e9:.1f} GFLOP/s, precision={precision}, ZeRO-2, cpus_per_worker=1, micro={args.micro}")
    print(f"bench train_tokens_per_s_1w = {tps[1]:.1f}")
    print(f"bench train_tokens_per_s_2w = {tps[2]:.1f}")
    print(f"bench train_2_vs_1_workers = {tps[2] / tps[1]:.3f}")
    print(f"bench train_mfu = {tps[2] * per_token / (2 * peak):.4f}")
    print(f"bench train_mfu_1w = {tps[1] * per_token / peak:.4f}")
    for name, value in runs[2][1].items():
        print(f"bench train_{name}_2w = {value:.3f}" if name == "step_s" else f"bench train_{name}_frac_2w = {value:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
