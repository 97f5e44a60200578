"""`python -m bench.gpu_check --device cpu`: the smoke run of the bare-GPU check (the same code at small sizes)."""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_the_cpu_smoke_run_prints_its_bench_lines(tiny_model_dir, capsys):
    from bench.gpu_check import main

    assert main(["--device", "cpu", "--model", tiny_model_dir, "--rows", "3", "--prompt-tokens", "12",
                 "--completion-tokens", "10", "--chunk-tokens", "7", "--lora-r", "4", "--skip-tests"]) == 0
    out = capsys.readouterr().out
    lines = dict(re.findall(r"^bench (\S+) = (\S+)$", out, re.MULTILINE))
    assert "info tests skipped: --skip-tests" in out  # the tests' own run: tests/test_gpu_check_bare.py
    # train.collectives under gloo; cuda:gloo (NCCL's device map) refuses a CPU tensor as NCCL does
    assert lines["gpu_check_collectives_ok"] == "1" and lines["gpu_check_cpu_tensor_refused"] == "1"
    assert float(lines["gpu_check_engine_tokens_per_s"]) > 0
    for name in ("full", "chunked"):
        assert float(lines[f"gpu_check_update_s_{name}"]) > 0
        assert float(lines[f"gpu_check_budget_update_gib_{name}"]) > 0
    assert "gpu_check_update_peak_gib_full" not in lines  # no torch peak memory off-GPU
    # chunked and full agree in float32
    assert float(lines["gpu_check_logps_max_abs_diff"]) < 1e-4
    assert float(lines["gpu_check_grad_max_rel_diff"]) < 1e-3


def test_a_cpu_machine_is_told_to_use_the_smoke_mode(monkeypatch):
    import torch

    from bench.gpu_check import gpu_test_files, main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cpu"):
        main(["--device", "cuda"])
    assert any(p.name == "test_hf_engine_cuda.py" for p in gpu_test_files())


def test_it_imports_nothing_a_bare_gpu_machine_lacks():
    """The GPU machine has torch, transformers and peft only: no Ray, DeepSpeed, vLLM, pandas or W&B."""
    import subprocess
    import sys

    code = ("import sys, bench.gpu_check, bench.gpu_engine; "
            "print(sorted(m for m in ('ray', 'deepspeed', 'vllm', 'pandas', 'pyarrow', 'wandb') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
