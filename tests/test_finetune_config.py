"""`finetune: full | lora` in every trainer config (judge SFT, judge GRPO, policy GRPO, preference training): full
refuses the adapter options by name with exit 2 before any work, and the paper-003 cluster configs train full at
the paper's learning rates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from jobs.cli import main as cli_main
from train.config import GRPOConfig, LoraSection, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def run_cli(config: str, tmp_path: Path, *overrides: str) -> int:
    return cli_main(["run", str(REPO / "configs" / config), f"run.root={tmp_path / 'runs'}", *overrides])


@pytest.mark.parametrize("config, section, lora_key, extra", [
    ("judge_sft_demo.yaml", "train", "lora.r", []),
    ("judge_grpo_demo.yaml", "grpo", "lora.r", []),
    ("policy_grpo_demo.yaml", "grpo", "lora.r", []),
    # preference training (paper 000's policy; its demo's LoRA is the default one): an override is refused too
    ("demo.yaml", "train.trainer", "lora.dropout", ["train.trainer.lora.dropout=0.1"]),
])
def test_full_refuses_the_configs_lora_section_by_name(config, section, lora_key, extra, tmp_path, capsys):
    assert run_cli(config, tmp_path, f"{section}.finetune=full", *extra) == 2
    err = capsys.readouterr().err
    assert f"{section}.{lora_key}" in err and "finetune is full" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("manifest*"))


def test_full_names_every_adapter_option_and_an_unknown_mode(tmp_path):
    with pytest.raises(ConfigError) as caught:
        GRPOConfig(finetune="full", init_adapter=str(tmp_path),
                   lora=dataclasses.replace(LoraSection(), alpha=64, dropout=0.1)).validate("grpo")
    message = str(caught.value)
    assert message.startswith("grpo.lora.alpha:")
    for key in ("grpo.lora.alpha", "grpo.lora.dropout", "grpo.init_adapter"):
        assert key in message
    with pytest.raises(ConfigError, match="train.finetune"):
        TrainConfig(finetune="qlora").validate("train")
    # the default LoRA section is not an option the user set: full with it validates
    TrainConfig(finetune="full").validate("train")
    GRPOConfig(finetune="full", kl_coef=0.01).validate("grpo")


@pytest.mark.parametrize("config, section, lr", [
    ("judge_grpo_cluster.yaml", "grpo", 1e-6),  # verl's default actor lr (paper 003 App. D.2)
    ("policy_grpo_cluster.yaml", "grpo", 1e-6),
])
def test_the_paper_003_cluster_configs_train_every_parameter_at_the_papers_rate(config, section, lr):
    loaded = yaml.safe_load((REPO / "configs" / config).read_text())[section]
    assert loaded["finetune"] == "full" and loaded["lr"] == lr and "lora" not in loaded
    assert "init_adapter" not in loaded
