"""Full fine-tuning against LoRA on CPU: seconds per SFT training step and peak resident memory, SmolLM2-135M.

    python -m bench.finetune.full_vs_lora [--model smollm2-135m] [--steps 6] [--warmup 2] [--threads 1]

Each mode runs in a child process of its own (so its peak RSS, `ru_maxrss`, is its own): the model the trainers
build (`train.engine.build_model`: `finetune: full` or `lora` with the trainers' default r = 16 on q/k/v/o), the
loop's own SFT loss (`train.preference.loop.loss_on_batch`, chunked log-probs) on one fixed batch of 4 rows, torch
AdamW over the trainable parameters, float32, one process without DeepSpeed or Ray (their overheads are the same
for both modes and would blur the ratio). The first `--warmup` steps are dropped; the step time is the median.
Printed lines:

    bench full_step_s = X                 median seconds per step, full fine-tuning
    bench lora_step_s = X                 the same with LoRA
    bench full_vs_lora_step_time = X      full / LoRA
    bench full_peak_rss_gib = X           peak resident memory of the full child (weights, grads, AdamW state)
    bench lora_peak_rss_gib = X
    bench full_vs_lora_peak_memory = X    full / LoRA

Measure on an idle machine: both children share its cores with nothing else.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ROWS = [{"prompt_messages": [{"role": "user", "content": f"Grade answer {i}: the sky is green."}],
         "target": f"Grade: {1 + i % 5}. The sky is blue, so the answer is wrong."} for i in range(4)]


def child(mode: str, model: str, steps: int, warmup: int, threads: int) -> dict:
    """One mode's run (in this process): step seconds after warm-up and the peak RSS in GiB."""
    import resource
    import statistics
    import time

    import torch
    from transformers import AutoTokenizer

    from actors.models import resolve_model_dir
    from train.config import TrainConfig
    from train.engine import build_model
    from train.preference.loop import _collate, loss_on_batch

    torch.set_num_threads(threads)
    model_dir = resolve_model_dir(model)
    cfg = TrainConfig(model=model_dir, loss="sft", finetune=mode, precision="fp32", max_prompt_length=64,
                      max_completion_length=32, logprob_chunk_tokens=1024)

    class Engine:  # what the loop's loss reads: a forward, `.module`, `.device`
        def __init__(self, module):
            self.module, self.device = module, torch.device("cpu")

        def __call__(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    module = build_model(model_dir, cfg)
    module.train()
    engine = Engine(module)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    batch = _collate(AutoTokenizer.from_pretrained(model_dir), cfg, ROWS, engine.device)
    times = []
    for _ in range(warmup + steps):
        started = time.perf_counter()
        loss, _ = loss_on_batch(engine, cfg, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"step_s": statistics.median(times[warmup:]), "trainable": trainable,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model, args.steps, args.warmup, args.threads)))
        return
    got = {}
    for mode in ("full", "lora"):
        done = subprocess.run([sys.executable, "-m", "bench.finetune.full_vs_lora", "--child", mode, "--model", args.model,
                               "--steps", str(args.steps), "--warmup", str(args.warmup),
                               "--threads", str(args.threads)], capture_output=True, text=True, check=True)
        got[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("full", "lora"):
        print(f"bench {mode}_step_s = {got[mode]['step_s']:.3f}")
        print(f"bench {mode}_trainable_params = {got[mode]['trainable']}")
        print(f"bench {mode}_peak_rss_gib = {got[mode]['peak_rss_gib']:.2f}")
    print(f"bench full_vs_lora_step_time = {got['full']['step_s'] / got['lora']['step_s']:.2f}")
    print(f"bench full_vs_lora_peak_memory = {got['full']['peak_rss_gib'] / got['lora']['peak_rss_gib']:.2f}")


if __name__ == "__main__":
    main()
