"""Judge SFT (paper 003 Table 5): gold verdicts as targets, trained through Ray Train + DeepSpeed, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from eval.menlo_parse import parse_menlo_grades
from jobs.cli import main as cli_main
from jobs.judge_sft import verdict_target

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "judge_sft_demo.yaml")


def test_target_is_the_gold_verdict_the_judges_parser_reads():
    for a, b in ((1.0, 5.0), (3.5, 3.4), (2.0, 2.0)):
        grades = parse_menlo_grades(verdict_target(a, b))
        assert grades.format_ok and grades.error == ""
        assert (grades.grade_a, grades.grade_b) == (int(a + 0.5), int(b + 0.5))  # gold rounded half up


@pytest.mark.slow
def test_judge_sft_end_to_end(ray_local, tiny_model_dir, tmp_path):
    root = tmp_path / "runs"
    args = ["run", DEMO, f"run.root={root}", "run.id=t", "wandb.mode=disabled", "data.limit=4", "data.val_limit=2",
            f"train.model={tiny_model_dir}", "train.num_workers=1", "train.max_steps=2", "train.checkpoint_every=2",
            "train.micro_batch_size=2"]
    assert cli_main(args) == 0
    run = root / "judge_sft" / "t"
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


@pytest.mark.parametrize("override, named", [
    ("train.loss=arpo", "train.loss: judge SFT trains with 'sft'"),
    ("data.path=/no/such.jsonl", "data.path"),
    ("prompt.template=menlo_pointwise", "prompt.template"),
    ("run.root=s3://bucket/runs", "run.root"),
])
def test_config_errors_exit_2_naming_the_key(tmp_path, capsys, override, named):
    assert cli_main(["run", DEMO, override, "wandb.mode=disabled"]) == 2
    assert named in capsys.readouterr().err
