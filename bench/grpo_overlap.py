"""A GRPO step with a served judge against the sum of its generate, reward and update phases (reward overlap).

    python -m bench.grpo_overlap [--steps 2] [--prompts 4] [--per-call 1] [--root /tmp/quorum-bench-overlap]

Runs the policy_grpo job as the suite and the demo run it (configs/policy_grpo_demo.yaml: SmolLM2-135M policy on
Ray Train + DeepSpeed ZeRO-2 + LoRA, the GRM Serve app deployed by the job with the hf engine and SmolLM2 as the
judge, called through its Serve handle), on one worker with `--prompts` prompts per step generated `--per-call` at
a time, twice, each through the job's command line: `reward.overlap=false` (the control: the strict generate -> reward -> update
order, whose step is the sum of its phases plus bookkeeping) and `reward.overlap=true`. The last step of each run
is measured (the first one warms the judge). Printed lines:

    bench grpo_step_over_phase_sum = X            overlap on: time/step_s ÷ (time/generate_s + perf/reward_span_s
                                                  + time/update_s + time/old_logprob_s + time/reference_s)
    bench grpo_step_over_phase_sum_no_overlap = X the control (≈ 1: nothing hidden)
    bench grpo_reward_hidden_fraction = X         overlap on: share of the judge's span hidden behind generation
    bench grpo_step_s_overlap = X / grpo_step_s_no_overlap = X

The judge and the policy share the machine's cores here (the demo gives the replica no CPU reservation), so what
overlap can hide is bounded by the cores left idle while one side works; on a cluster the judge has its own GPUs.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

import pyarrow.parquet as pq

PHASES = ("time/generate_s", "perf/reward_span_s", "time/update_s", "time/old_logprob_s", "time/reference_s")


def run(root: str, overlap: bool, args) -> dict[str, float]:
    """One job run through its command line (bench sits beside jobs, it does not import them)."""
    run_id = f"overlap-{'on' if overlap else 'off'}"
    overrides = [f"run.root={root}", f"run.id={run_id}", "wandb.enabled=false", "monitor.enabled=false",
                 "grpo.num_workers=1", f"grpo.prompts_per_step={args.prompts}", f"grpo.max_steps={args.steps}",
                 f"grpo.rollout.prompts_per_generate={args.per_call}", f"reward.overlap={str(overlap).lower()}",
                 "grpo.checkpoint_every=1000"]
    subprocess.run([sys.executable, "-m", "jobs.policy.grpo", "configs/policy_grpo_demo.yaml", *overrides],
                   check=True)
    parts = glob.glob(os.path.join(root, "**", run_id, "**", "train", "**", "*.parquet"), recursive=True) or \
        glob.glob(os.path.join(root, "**", run_id, "train", "*.parquet"), recursive=True)
    if not parts:
        raise SystemExit(f"no train stage table under {root} for run {run_id}")
    return pq.read_table(parts[0]).to_pylist()[0]


def phase_sum(metrics: dict[str, float]) -> float:
    return sum(float(metrics.get(key) or 0.0) for key in PHASES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--per-call", type=int, default=1)
    parser.add_argument("--root", default="")
    args = parser.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="quorum-bench-overlap-")
    print(f"info load_average_1m={os.getloadavg()[0]:.2f}", flush=True)
    off = run(root, False, args)
    on = run(root, True, args)
    for name, metrics in (("no_overlap", off), ("overlap", on)):
        print(f"# {name}: " + ", ".join(f"{k}={float(metrics.get(k) or 0.0):.2f}" for k in ("time/step_s", *PHASES,
                                                                                         "time/reward_s")))
    print(f"bench grpo_step_over_phase_sum = {on['time/step_s'] / phase_sum(on):.3f}")
    print(f"bench grpo_step_over_phase_sum_no_overlap = {off['time/step_s'] / phase_sum(off):.3f}")
    span = float(on.get("perf/reward_span_s") or 0.0)
    print(f"bench grpo_reward_hidden_fraction = {float(on.get('perf/reward_hidden_s') or 0.0) / span if span else 0.0:.3f}")
    print(f"bench grpo_step_s_overlap = {on['time/step_s']:.2f}")
    print(f"bench grpo_step_s_no_overlap = {off['time/step_s']:.2f}")
    print(f"info load_average_1m={os.getloadavg()[0]:.2f} (at the end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
