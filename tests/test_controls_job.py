"""Paper 000's positive controls end to end on real Ray with a tiny model: the Parallel baseline (SFT on references),
the oracle selector with SFT_Think, and a trained run re-evaluated on another corpus without retraining."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from jobs.cli import main as cli_main

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def tiny(model_dir: str, root: Path, turk_dir: Path) -> list[str]:
    """The demo config shrunk to 8 sources, a tiny model, 2 training steps and 4 evaluation sentences."""
    overrides = [f"run.root={root}", "wandb.enabled=false", "data.limit=8", "pairs.dev_fraction=0.0",
                 # one training worker (2-worker ZeRO-2 is test_train_ray's): a Ray Train worker group costs seconds each
                 f"train.trainer.model={model_dir}", "train.trainer.num_workers=1", "train.trainer.max_steps=2",
                 "train.trainer.micro_batch_size=1",
                 "train.trainer.checkpoint_every=2", "train.trainer.lora.r=4", "train.trainer.lora.alpha=8",
                 "train.trainer.max_prompt_length=48", "train.trainer.max_completion_length=16",
                 f"evaluate.path={turk_dir}", "evaluate.limit=4", f"evaluate.engine.model={model_dir}",
                 "evaluate.sampling.max_tokens=8", "evaluate.pool.num_cpus=0.5", "evaluate.n_boot=50",
                 "evaluate.rejudge=[]"]
    for i in range(4):
        overrides += [f"generate.{i}.engine.model={model_dir}", f"generate.{i}.engine.num_threads=1",
                      f"generate.{i}.sampling.max_tokens=8", f"generate.{i}.pool.num_cpus=0.5"]
    return overrides


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["stages"]


def turk_format_copy(shared_turk: Path, dest: Path, split: str, start: int, n: int) -> Path:
    """A TurkCorpus-format directory with `split` files: rows start..start+n of the shared tune split."""
    dest.mkdir()
    names = ["norm"] + [f"turk.{k}" for k in range(8)]
    for name in names:
        lines = (shared_turk / f"tune.8turkers.tok.{name}").read_text(encoding="utf-8").splitlines()
        (dest / f"{split}.8turkers.tok.{name}").write_text("\n".join(lines[start:start + n]) + "\n", encoding="utf-8")
    return dest


def test_parallel_baseline_trains_on_references_then_reevaluates_elsewhere_without_retraining(
        ray_local, tiny_model_dir, shared_data, tmp_path, capsys):
    turk = shared_data / "turkcorpus"
    args = ["run", str(REPO / "configs" / "demo.yaml"), "run.id=parallel", *tiny(tiny_model_dir, tmp_path, turk),
            "train.targets=references", "train.trainer.loss=sft"]
    # trained first without evaluation: the later evaluation on another corpus must reuse the training
    assert cli_main([*args, "evaluate.enabled=false"]) == 0
    run_dir = tmp_path / "policy_simplify" / "parallel"
    stages = manifest(run_dir)
    # references only: nothing is generated, judged or paired
    assert sorted(stages) == sorted(["sources", "sft_data", "train"])
    rows = pd.read_parquet(run_dir / "sft_data")
    refs = {json.loads(line)["id"]: json.loads(line) for line in
            (REPO / "configs/data/demo_references.jsonl").read_text().splitlines() if line.strip()}
    assert len(rows) == 8 and set(rows["policy"]) == {"lexical"}
    for sid, target in zip(rows["id"], rows["target"]):  # the lexical reference of each source, never another
        ref = refs[sid]
        assert target == ref["references"][ref["policies"].index("lexical-paraphrasing")]
    assert stages["train"]["summary"]["data"] == "sft_data"
    assert (run_dir / "train" / "run" / "adapter" / "adapter_config.json").is_file()

    # the same trained run evaluated on another TurkCorpus-format directory and split: only the evaluation stages run
    other = turk_format_copy(turk, tmp_path / "other-turk", "test", start=100, n=5)
    trained_at = stages["train"]["finished_at"]
    assert cli_main([*args, f"evaluate.path={other}", "evaluate.split=test"]) == 0
    again = manifest(run_dir)
    assert sorted(again) == sorted(["sources", "sft_data", "train", "eval_set", "eval_generate", "results"])
    assert again["train"]["finished_at"] == trained_at and again["sft_data"] == stages["sft_data"]
    assert "Parallel: SFT on references (1 per source)" in (run_dir / "summary.md").read_text()
    assert again["eval_set"]["summary"]["data"] == str(other)
    eval_set = pd.read_parquet(run_dir / "eval_set")
    source_100 = (turk / "tune.8turkers.tok.norm").read_text(encoding="utf-8").splitlines()[100]
    assert eval_set["id"].str.startswith("turk-test-").all() and eval_set["source"].iloc[0] == source_100
    capsys.readouterr()
    # a mistyped path is an error naming the key, never the demo references in its place
    assert cli_main([*args, f"evaluate.path={tmp_path / 'no-such-dir'}"]) == 2
    assert "evaluate.path" in capsys.readouterr().err


def test_oracle_selector_with_sft_think_marks_its_pairs_and_tables(ray_local, tiny_model_dir, shared_data, tmp_path):
    args = ["run", str(REPO / "configs" / "demo.yaml"), "run.id=oracle",
            *tiny(tiny_model_dir, tmp_path, shared_data / "turkcorpus"), "selector.kind=reference",
            "train.trainer.loss=sft"]
    assert cli_main(args) == 0
    run_dir = tmp_path / "policy_simplify" / "oracle"
    stages = manifest(run_dir)
    assert "jury" not in stages and stages["select"]["summary"]["oracle"] is True
    selected = pd.read_parquet(run_dir / "select")
    assert (selected["judge"] == "oracle:sari").all()
    pairs = pd.read_parquet(run_dir / "pairs")
    assert len(pairs) > 0 and pairs["oracle"].all()
    sft = pd.read_parquet(run_dir / "sft_data")
    lexical = pairs[pairs["policy"] == "lexical"]
    # SFT_Think: the chosen candidate of every lexical pair is a target, the rejected one never
    assert sorted(sft["target"]) == sorted(lexical["chosen"]) and sft["oracle"].all()
    summary = (run_dir / "summary.md").read_text()
    assert "ORACLE pairs (reference SARI)" in summary
    assert "SFT_Think: SFT on chosen candidates, ORACLE (reference SARI) selector" in summary
