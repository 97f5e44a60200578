"""train/ds_config.py (DeepSpeed config, LR schedule) and `TrainConfig` validation: pure and fast."""

from __future__ import annotations

import dataclasses

import pytest

from core.config import load_config
from train.config import DeepSpeedSection, TrainConfig
from train.ds_config import build_ds_config, lr_multiplier, resolve_precision, warmup_steps
from train.trainer import worker_env


def test_ds_config_batch_sizes_zero_stage_and_precision():
    config = build_ds_config(micro_batch_size=4, grad_accum=8, world_size=4, zero_stage=3, precision="bf16")
    # global batch = micro x accum x workers = paper 000's 128
    assert config["train_batch_size"] == 128
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_accumulation_steps"] == 8
    assert config["zero_optimization"]["stage"] == 3
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    fp32 = build_ds_config(1, 1, 2, zero_stage=2, precision="fp32")
    assert "bf16" not in fp32 and "fp16" not in fp32


def test_ds_config_offload_sections_and_their_preconditions():
    config = build_ds_config(1, 1, 1, zero_stage=3, offload_optimizer=True, offload_params=True)
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_force_ds_cpu_optimizer"] is False
    with pytest.raises(ValueError, match="offload_params"):
        build_ds_config(1, 1, 1, zero_stage=2, offload_params=True)
    with pytest.raises(ValueError, match="zero_stage"):
        build_ds_config(1, 1, 1, zero_stage=1)
    with pytest.raises(ValueError, match="grad_accum"):
        build_ds_config(1, 0, 1)


def test_precision_auto_is_bf16_on_gpu_bf16_autocast_on_native_bf16_cpus_else_fp32():
    assert resolve_precision("auto", use_gpu=True) == "bf16"
    assert resolve_precision("auto", use_gpu=False) == "fp32"
    assert resolve_precision("auto", use_gpu=False, cpu_bf16=True) == "bf16-autocast"
    assert resolve_precision("fp16", use_gpu=True) == "fp16"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("int8", use_gpu=False)


def test_bf16_autocast_keeps_deepspeed_in_fp32_and_runs_the_forward_in_bf16():
    import torch

    from train.precision import autocast

    config = build_ds_config(1, 1, 1, zero_stage=2, precision="bf16-autocast")
    assert "bf16" not in config and "fp16" not in config  # weights, gradients and optimizer stay fp32
    assert resolve_precision("bf16-autocast", use_gpu=False) == "bf16-autocast"
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    with autocast("bf16-autocast", torch.device("cpu")):
        out = layer(x)
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    out.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and x.grad is not None
    with autocast("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32


def test_lr_schedules():
    # 10 steps, 2 warm-up: 0, 0.5 during warm-up, then decay over the remaining 8 steps
    assert [lr_multiplier(s, 10, 2, "constant") for s in (0, 1, 2, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert lr_multiplier(4, 10, 2, "linear") == pytest.approx(1 - 2 / 8)
    # cosine at a quarter of the decay: 0.5 * (1 + cos(pi/4))
    assert lr_multiplier(4, 10, 2, "cosine") == pytest.approx(0.5 * (1 + 0.7071067811865476))
    assert lr_multiplier(0, 10, 0, "linear") == 1.0
    assert warmup_steps(10, 0.15) == 2
    with pytest.raises(ValueError, match="scheduler"):
        lr_multiplier(0, 10, 0, "step")


def test_train_config_defaults_are_paper_000():
    cfg = TrainConfig()
    cfg.validate()
    assert (cfg.loss, cfg.lr, cfg.global_batch_size) == ("arpo", 1e-4, 128)
    assert (cfg.loss_config.beta, cfg.loss_config.simpo_gamma, cfg.loss_config.cpo_alpha) == (0.1, 1.5, 1.0)
    assert (cfg.loss_config.arpo_c1, cfg.loss_config.arpo_c2) == (0.9, 0.4)
    # dropout 0: the paper does not state it; the authors' code disables it (docs/papers/000-policy-simplification.md, Deviations)
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (16, 32, 0.0)
    assert cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert TrainConfig.from_dict(dataclasses.asdict(cfg)) == cfg


@pytest.mark.parametrize("change, field", [
    ({"loss": "ppo"}, "loss"),
    ({"micro_batch_size": 0}, "micro_batch_size"),
    ({"scheduler": "step"}, "scheduler"),
    ({"warmup_ratio": 1.0}, "warmup_ratio"),
    ({"precision": "int8"}, "precision"),
    ({"deepspeed": DeepSpeedSection(zero_stage=1)}, "deepspeed.zero_stage"),
    ({"deepspeed": DeepSpeedSection(zero_stage=2, offload_params=True)}, "deepspeed.offload_params"),
    ({"fail_at_step": 1, "checkpoint_every": 2}, "fail_at_step"),
])
def test_validate_names_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TrainConfig(), **change).validate()


def test_train_config_loads_from_yaml_style_overrides():
    cfg = load_config(TrainConfig, None, ["deepspeed.zero_stage=3", "lora.target_modules=all-linear",
                                          "loss_config.beta=0.2", "num_workers=2"])
    assert cfg.deepspeed.zero_stage == 3 and cfg.lora.target_modules == "all-linear"
    assert cfg.loss_config.beta == 0.2 and cfg.global_batch_size == 256


def test_worker_env_selects_deepspeed_cpu_accelerator_off_gpu():
    assert worker_env(TrainConfig(cpus_per_worker=2)) == {"OMP_NUM_THREADS": "2", "DS_ACCELERATOR": "cpu"}
    assert "DS_ACCELERATOR" not in worker_env(TrainConfig(use_gpu=True))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_deepspeed_reads_the_zero_buffers_the_memory_budget_counts(stage):
    """The bucket and live-parameter settings the budget reads are the ones DeepSpeed's own config class parses
    from the config this module builds (a renamed or ignored key would leave DeepSpeed at a value the budget never
    saw)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from train.ds_config import STAGE2_OVERLAP_COMM, ZERO_BUFFERS

    zero = build_ds_config(1, 1, 2, zero_stage=stage, precision="bf16")["zero_optimization"]
    parsed = DeepSpeedZeroConfig(**zero)
    if stage == 0:
        assert zero == {"stage": 0}
        return
    assert parsed.reduce_bucket_size == ZERO_BUFFERS["reduce_bucket_size"] == zero["reduce_bucket_size"]
    if stage == 2:
        assert parsed.allgather_bucket_size == zero["allgather_bucket_size"] == ZERO_BUFFERS["allgather_bucket_size"]
        assert parsed.overlap_comm is STAGE2_OVERLAP_COMM is zero["overlap_comm"]
    else:
        assert parsed.prefetch_bucket_size == zero["stage3_prefetch_bucket_size"]
        assert parsed.max_live_parameters == zero["stage3_max_live_parameters"]
        assert parsed.max_reuse_distance == zero["stage3_max_reuse_distance"]
        assert parsed.param_persistence_threshold == zero["stage3_param_persistence_threshold"]
        assert {k: zero[k] for k in ZERO_BUFFERS if k in zero} == {
            k: v for k, v in ZERO_BUFFERS.items() if k != "allgather_bucket_size"}


def test_the_worker_builds_the_deepspeed_config_the_budget_reads():
    """train.engine.build_engine and train.memory_budget.grpo_plan both take it from trainer_ds_config."""
    import inspect

    from train import engine
    from train.config import GRPOConfig
    from train.ds_config import trainer_ds_config

    assert "trainer_ds_config(cfg, world)" in inspect.getsource(engine.build_engine)
    cfg = GRPOConfig(model="hf:Qwen/Qwen3-4B", use_gpu=True, gpu_type="H100", num_workers=2, prompts_per_step=2,
                     group_size=4, micro_batch_size=4, deepspeed=DeepSpeedSection(zero_stage=3))
    assert cfg.memory_plan().zero_config == trainer_ds_config(cfg, 2)["zero_optimization"]
