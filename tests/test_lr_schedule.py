"""The learning-rate schedule spans every optimizer step of a run: GRPO takes `num_iterations` optimizer steps
(and DeepSpeed as many scheduler steps) per GRPO step, so its schedule is that many times the GRPO steps long."""

from __future__ import annotations

import pytest
import torch

from train.config import GRPOConfig, TrainConfig
from train.ds_config import lr_multiplier, warmup_steps


def test_the_schedule_length_counts_optimizer_steps():
    assert GRPOConfig(num_iterations=4).schedule_steps(10) == 40
    assert GRPOConfig(num_iterations=1).schedule_steps(10) == 10
    assert TrainConfig().schedule_steps(10) == 10


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_a_grpo_run_decays_over_its_whole_length(scheduler):
    """Ten GRPO steps of two optimizer steps each, stepped as DeepSpeed does (once per optimizer step) through the
    LambdaLR `train.engine.build_engine` builds: the LR reaches 0 only after the last step, never half way."""
    cfg = GRPOConfig(num_iterations=2, scheduler=scheduler, warmup_ratio=0.1, lr=1.0)
    grpo_steps = 10
    length = cfg.schedule_steps(grpo_steps)
    warmup = warmup_steps(length, cfg.warmup_ratio)
    assert warmup == 2  # ceil(0.1 x 20), not ceil(0.1 x 10)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    scheduler_ = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, length, warmup, scheduler))
    used = []
    for _ in range(grpo_steps):
        for _ in range(cfg.num_iterations):
            used.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler_.step()
    assert len(used) == 20
    assert all(lr > 0 for lr in used[warmup:])  # a schedule of 10 would train its second half at lr 0
    assert used[-1] == pytest.approx(lr_multiplier(19, 20, 2, scheduler)) and used[-1] < used[len(used) // 2]
