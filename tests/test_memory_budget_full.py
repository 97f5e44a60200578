"""The GPU memory budget of full fine-tuning (`train.memory_budget`): every parameter's gradient and AdamW state,
the frozen reference copy of a KL term, the trainable head's gathers, the weight sync's transient, and the
optimizer offload that makes Qwen3-4B fit an A10G (configs/judge_grpo_cluster.yaml)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.config import load_config
from core.errors import ConfigError
from train.config import DeepSpeedSection
from train.memory_budget import GIB, budget, checkpoint_gib, grpo_plan, problems
from train.model_shape import model_shape

REPO = Path(__file__).resolve().parents[1]


def cluster_grpo():
    from jobs.judge.grpo import Config

    return load_config(Config, REPO / "configs" / "judge_grpo_cluster.yaml", []).grpo


def test_full_fine_tuning_counts_every_parameter_trainable_and_sharded():
    cfg = cluster_grpo()
    assert cfg.finetune == "full" and cfg.deepspeed.offload_optimizer
    shape = model_shape(cfg.model)
    on_gpu = dataclasses.replace(cfg, deepspeed=DeepSpeedSection(zero_stage=3))
    b = budget(grpo_plan(on_gpu))
    world = cfg.num_workers
    # bf16 weights and gradients, fp32 master + m + v: 2 + 2 + 12 bytes a parameter, each over the 8 ranks
    assert b.parts["trainable_weights"] == pytest.approx(shape.n_params * 2 / world / GIB)
    assert b.parts["gradients"] == pytest.approx(shape.n_params * 2 / world / GIB)
    assert b.parts["optimizer"] == pytest.approx(shape.n_params * 12 / world / GIB)
    assert not b.parts.get("frozen_weights") and not b.parts.get("vllm_lora_slot")
    # the trainable head: gathered in forward and backward with its full gradient (twice a frozen head's copy)
    assert b.parts["zero3_head_copy"] == pytest.approx(2 * shape.vocab * shape.hidden * 2 / GIB)
    # the sync gathers one parameter at a time while the engine's share is held: the rollout phase counts it
    resident = sum(b.parts[k] for k in ("trainable_weights", "gradients", "optimizer", "train_reserve",
                                        "zero3_reduce_bucket", "zero3_persistent"))
    share = cfg.rollout.gpu_memory_utilization * b.gpu_gib
    assert b.rollout_gib == pytest.approx(resident + share + shape.largest_param() * 2 / GIB)
    # on an A10G that does not fit without offload; the refusal names the key to change
    assert problems(grpo_plan(on_gpu))
    with pytest.raises(ConfigError, match="grpo.rollout.gpu_memory_utilization"):
        on_gpu.validate("grpo")


def test_optimizer_offload_fits_the_a10g_and_a_bigger_card_needs_none():
    cfg = cluster_grpo()
    assert problems(grpo_plan(cfg)) == []
    cfg.validate("grpo")
    offloaded = budget(grpo_plan(cfg))
    assert not offloaded.parts.get("optimizer")
    for gpu in ("A100-80G", "H100"):
        plain = dataclasses.replace(cfg, gpu_type=gpu, deepspeed=DeepSpeedSection(zero_stage=3))
        assert problems(grpo_plan(plain)) == []


def test_a_kl_term_adds_the_partitioned_reference_copy_and_lora_needs_none():
    cfg = dataclasses.replace(cluster_grpo(), kl_coef=0.001)
    shape = model_shape(cfg.model)
    b = budget(grpo_plan(cfg))
    assert b.parts["reference_weights"] == pytest.approx(shape.n_params * 2 / cfg.num_workers / GIB)
    lora = dataclasses.replace(cfg, finetune="lora")
    assert "reference_weights" not in budget(grpo_plan(lora)).parts
    assert "reference_weights" not in budget(grpo_plan(dataclasses.replace(cfg, kl_coef=0.0))).parts


def test_a_full_checkpoint_of_a_4b_model_is_about_52_gib():
    shape = model_shape("hf:Qwen/Qwen3-4B")
    assert checkpoint_gib(shape, "bf16") == pytest.approx(shape.n_params * 14 / GIB)
    assert 52 < checkpoint_gib(shape, "bf16") < 53
    assert checkpoint_gib(shape, "fp32") == pytest.approx(shape.n_params * 12 / GIB)
