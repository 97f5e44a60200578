"""What `train.engine.build_engine` leaves behind in a training worker's process (issue: what breaks first).

- torch's own `torch.nn.functional.linear`: DeepSpeed's ZeRO-3 `memory_efficient_linear` (on by default) swaps it
  process-wide when `deepspeed.initialize` partitions the model, and the colocated vLLM engine built next in the
  same worker would run every GEMM through DeepSpeed's autograd function (train/ds_config.py keeps it off;
  `require_torch_linear` refuses the swap).
- DeepSpeed's data-parallel group under the run's collective timeout: DeepSpeed clones the world group with a bare
  `new_group`, which takes the backend's default (NCCL's 10 minutes), not `collective_timeout_s`.

ZeRO-2 and ZeRO-3 reduce over the same group (`DeepSpeedEngine` hands `groups._get_data_parallel_group()` to both
optimizers); ZeRO-3 is the stage that also swaps `F.linear`, so it is the one run here.

Each case runs `build_engine` in a child process (one gloo rank, the tiny model, real DeepSpeed), as a Ray Train
worker does, so that a swapped `F.linear` cannot leak into the test process. The control turns DeepSpeed's defaults
back on and shows the checks see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist

    import train.ds_config as ds_config
    from train import collectives
    from train.config import TrainConfig
    from train.config_sections import DeepSpeedSection
    from train.engine import build_engine, build_lora_model

    model_dir, store, stage, timeout_s, control = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \\
        sys.argv[5]
    if control:  # DeepSpeed's defaults: memory_efficient_linear on, and its own clone of the world group
        import train.engine

        ds_config.ZERO3_MEMORY_EFFICIENT_LINEAR = True
        train.engine.adopt_collective_timeout = lambda timeout_s: None
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    cfg = TrainConfig(use_gpu=False, precision="fp32", micro_batch_size=1, grad_accum=1,
                      deepspeed=DeepSpeedSection(zero_stage=stage), collective_timeout_s=timeout_s)
    out = {}
    try:
        engine = build_engine(build_lora_model(model_dir, cfg), cfg, 1, 4)
        out["optimizer_group_timeout_s"] = collectives.group_timeout(engine.optimizer.dp_process_group).total_seconds()
    except RuntimeError as exc:
        out["error"] = str(exc)
    from deepspeed.utils import groups

    out["dp_group_timeout_s"] = collectives.group_timeout(groups._get_data_parallel_group()).total_seconds()
    out["linear_is_torch"] = torch.nn.functional.linear is torch._C._nn.linear
    print("RESULT " + json.dumps(out))
""")


def run_child(model_dir: str, tmp_path: Path, stage: int, timeout_s: int, control: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, model_dir, str(tmp_path / f"store-{stage}-{control}"),
                           str(stage), str(timeout_s), control],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                               # what Ray Train sets in every worker; DeepSpeed's launcher check reads them
                               "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
def test_zero3_leaves_torch_linear_and_the_optimizer_group_waits_the_configured_timeout(tiny_model_dir, tmp_path):
    # 777 s: neither gloo's nor NCCL's default (30 / 10 min), so only the configured value can produce it
    got = run_child(tiny_model_dir, tmp_path, 3, 777)
    assert got == {"dp_group_timeout_s": 777.0, "optimizer_group_timeout_s": 777.0, "linear_is_torch": True}


@pytest.mark.slow
def test_control_deepspeeds_defaults_are_seen(tiny_model_dir, tmp_path):
    """DeepSpeed's memory_efficient_linear swaps F.linear and build_engine refuses the process; DeepSpeed's own clone
    of the world waits the backend's default (gloo: 30 min), not the configured 777 s."""
    got = run_child(tiny_model_dir, tmp_path, 3, 777, "deepspeed_defaults")
    assert got["linear_is_torch"] is False
    assert "memory_efficient_linear replaced it" in got["error"]
    assert got["dp_group_timeout_s"] == 1800.0
