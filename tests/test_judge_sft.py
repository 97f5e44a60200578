"""Judge SFT (paper 003 Table 5): gold verdicts as targets, trained through Ray Train + DeepSpeed, config errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from eval.judging.menlo_parse import parse_menlo_grades
from jobs.cli import main as cli_main
from jobs.judge.sft import verdict_target

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "judge_sft_demo.yaml")


def test_target_is_the_gold_verdict_the_judges_parser_reads():
    for a, b in ((1.0, 5.0), (3.5, 3.4), (2.0, 2.0)):
        grades = parse_menlo_grades(verdict_target(a, b))
        assert grades.format_ok and grades.error == ""
        assert (grades.grade_a, grades.grade_b) == (int(a + 0.5), int(b + 0.5))  # gold rounded half up


@pytest.mark.parametrize("override, named", [
    ("train.loss=arpo", "train.loss: judge SFT trains with 'sft'"),
    ("data.path=/no/such.jsonl", "data.path"),
    ("prompt.template=menlo_pointwise", "prompt.template"),
    ("run.root=s3://bucket/runs", "run.root"),
])
def test_config_errors_exit_2_naming_the_key(tmp_path, capsys, override, named):
    assert cli_main(["run", DEMO, override, "wandb.mode=disabled"]) == 2
    assert named in capsys.readouterr().err


def test_init_adapter_must_match_the_lora_section(tmp_path):
    from train.config import GRPOConfig

    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}))
    with pytest.raises(ValueError, match="lora.r: 8 differs from the init_adapter's 4"):
        GRPOConfig(init_adapter=str(tmp_path), lora=dataclasses.replace(GRPOConfig().lora, r=8, alpha=16)).validate()
    with pytest.raises(ValueError, match="grpo.init_adapter: no such file or directory"):
        GRPOConfig(init_adapter=str(tmp_path / "nope")).validate("grpo")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="grpo.init_adapter: .* is not a peft adapter directory"):
        GRPOConfig(init_adapter=str(tmp_path / "empty")).validate("grpo")


@pytest.mark.slow
def test_sft_then_rl_starts_grpo_from_the_sft_adapter(ray_local, tiny_model_dir, tmp_path):
    """Judge SFT end to end, then paper 003's SFT -> RL: judge GRPO continues the judge_sft adapter instead of a
    fresh LoRA, scores its rollouts with the MENLO reward and keeps the best adapter by validation reward."""
    from safetensors.torch import load_file

    import jobs.judge.grpo as judge_job
    from core.config import load_config

    root = tmp_path / "runs"
    # judge SFT end to end (the job's own outputs), then its adapter starts the RL run
    assert cli_main(["run", DEMO, f"run.root={root}", "run.id=sft", "wandb.mode=disabled", "data.limit=4",
                     "data.val_limit=2", f"train.model={tiny_model_dir}", "train.num_workers=1",
                     "train.max_steps=2", "train.checkpoint_every=2", "train.micro_batch_size=2", "train.lr=0.01"]) == 0
    run = root / "judge_sft" / "sft"
    rows = pd.read_parquet(run / "rows")
    assert (rows["role"] == "train").sum() == 4 * 2  # both A/B orders
    for _, row in rows.iterrows():  # the target follows the shown order's gold grades
        grades = parse_menlo_grades(row["target"])
        assert (grades.grade_a, grades.grade_b) == (int(row["gold_a"] + 0.5), int(row["gold_b"] + 0.5))
        assert json.loads(row["prompt_messages"])[0]["role"] == "system"
    assert (run / "train" / "run" / "adapter" / "adapter_config.json").is_file()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["train"]["summary"]["steps"] == 2
    assert "Judge SFT" in (run / "summary.md").read_text()
    sft = run / "train" / "run" / "adapter"
    # judge GRPO (paper 003 RL) from the SFT adapter: one worker, two steps validated on the held-out tone pair
    cfg = load_config(judge_job.Config, REPO / "configs" / "judge_grpo_demo.yaml", [
        f"run.root={root}", "run.id=rl", "wandb.enabled=false", "data.dimensions=[tone]",
        f"grpo.model={tiny_model_dir}", f"grpo.init_adapter={sft}", "grpo.num_workers=1", "grpo.group_size=2",
        "grpo.prompts_per_step=2", "grpo.micro_batch_size=4", "grpo.max_steps=2", "grpo.max_completion_length=6",
        "grpo.checkpoint_every=1", "grpo.eval_every=1", "grpo.weight_decay=0.0"])
    table = judge_job.main(cfg, "rl.yaml").set_index("metric")["value"]
    start = load_file(sft / "adapter_model.safetensors")
    rl = root / "judge_grpo" / "rl"
    after = load_file(rl / "train" / "run" / "adapter" / "adapter_model.safetensors")
    assert any(v.abs().sum() > 0 for k, v in start.items() if "lora_B" in k)  # SFT moved B off its zero init
    # the tiny judge never writes the tags: equal rewards, zero advantages, no update, so the RL adapter is still
    # exactly the SFT one (a fresh LoRA would have all-zero B)
    assert table["reward/groups_zero_std"] == 2
    assert start.keys() == after.keys()
    assert all(torch.allclose(start[k], after[k], atol=1e-6) for k in start)

    # the MENLO reward wiring: every rollout earns exactly the two penalties, so the group's rewards are equal (zero
    # advantage) and no service is involved (no failures)
    assert table["reward/mean"] == pytest.approx(-1.2) and table["reward/extract_fail"] == 1.0
    assert table["reward/format_penalty"] == pytest.approx(-0.2) and table["reward/extract_penalty"] == -1.0
    for term in ("exact_a", "exact_b", "near_a", "near_b", "pref_bonus"):
        assert table[f"reward/{term}"] == 0.0
    assert table["reward/groups"] == 2 and table["reward/groups_failed"] == 0
    assert table["updates_skipped"] == 0
    assert (rl / "train" / "run" / "adapter" / "adapter_config.json").is_file()
    manifest = json.loads((rl / "manifest.json").read_text())
    rows = manifest["stages"]["rows"]["summary"]
    assert (rows["train_rows"], rows["val_rows"]) == (12, 2)  # 6 train + 1 val tone pair, both A/B orders
    # validation scored both orders of the val pair: the same -1.2 at steps 1 and 2, so the tie keeps step 1
    assert table["val/reward/mean"] == pytest.approx(-1.2) and table["val/reward/groups"] == 2
    best = json.loads((rl / "train" / "run" / "best_adapter" / "best.json").read_text())
    assert best["step"] == 1 and best["score"] == pytest.approx(-1.2) and best["score_key"] == "val/reward/mean"
    assert (rl / "train" / "run" / "best_adapter" / "adapter_model.safetensors").is_file()
    assert manifest["stages"]["train"]["summary"]["best_step"] == 1
    assert "Best adapter by val/reward/mean" in (rl / "summary.md").read_text()


@pytest.mark.slow
def test_pointwise_judge_sft_and_rl(ray_local, tiny_model_dir, tmp_path):
    """Paper 003 Table 19: pointwise SFT rows and pointwise RL, each judge prompt one response with its own gold
    grade."""
    import jobs.judge.grpo as judge_job
    import jobs.judge.sft as sft_job
    from core.config import load_config
    from eval.judging.menlo_parse import parse_menlo_grade

    root, pointwise = tmp_path / "runs", ["prompt.mode=pointwise", "prompt.template=menlo_pointwise"]
    # the SFT rows the job trains on (its training stage is the one the pairwise test above runs end to end)
    sft_cfg = load_config(sft_job.Config, DEMO, [f"run.root={root}", "wandb.mode=disabled", "data.limit=2",
                                                  "data.val_splits=[]", f"train.model={tiny_model_dir}", *pointwise])
    rows = sft_job.sft_rows(sft_cfg)
    assert set(rows["order"]) == {"a", "b"}
    assert [parse_menlo_grade(t).grade_a for t in rows["target"]] == [int(g + 0.5) for g in rows["gold_a"]]
    cfg = load_config(judge_job.Config, REPO / "configs" / "judge_grpo_demo.yaml", [
        f"run.root={root}", "run.id=prl", "wandb.enabled=false", "data.dimensions=[tone]", "data.val_splits=[]",
        f"grpo.model={tiny_model_dir}", "grpo.num_workers=1", "grpo.group_size=2", "grpo.prompts_per_step=2",
        "grpo.micro_batch_size=4", "grpo.max_steps=1", "grpo.max_completion_length=6", "grpo.checkpoint_every=1",
        *pointwise])
    table = judge_job.main(cfg, "prl.yaml").set_index("metric")["value"]
    # the random tiny judge never writes <final_grade>: extraction failure and format penalty, no B side or bonus
    assert table["reward/mean"] == pytest.approx(-1.2)
    assert table["reward/exact_b"] == table["reward/pref_bonus"] == 0.0
