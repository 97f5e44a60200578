"""The jury_eval job end to end on real Ray with a random 2-layer model, and its input errors (exit code 2).

A random model never writes `Answer: [k]`, so every judgment fails to parse: the run must still finish, count
those failures, print the jury statistics as n/a, and still compute the metric-vs-human correlations.
"""

from __future__ import annotations

import base64
import csv
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from jobs.cli import main as cli_main
from tests.wandb_reader import read_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def tiny_config(tmp_path: Path, model_dir: str, shared_data: Path, simpeval: Path | None = None,
                asset: Path | None = None) -> Path:
    engine = {"kind": "hf", "model": model_dir, "num_threads": 1, "max_batch_size": 16}
    pool = {"concurrency": 1, "num_cpus": 0.5, "batch_size": 8}

    def model(name: str, temperature: float, **extra) -> dict:
        return {"name": name, "engine": engine, "pool": pool,
                "sampling": {"temperature": temperature, "max_tokens": 8, "seed": 1}, **extra}

    config = {
        "job": "jury_eval", "ray": {"num_cpus": 2}, "wandb": {"project": "quorum-test"},
        "synth": {"n": 3, "seed": 5, "writer": model("writer", 0.8),
                  "simplifiers": [model("small", 1.0, size_b=1), model("big", 0.0, size_b=8)]},
        "simpeval": {"path": str(simpeval or shared_data / "simpeval" / "simpeval_2022.csv"), "limit": 6},
        "asset": {"path": str(asset or shared_data / "asset" / "human_ratings.csv"), "limit": 6},
        # the panel decodes freely (constrained: false) to exercise the unparseable path; the ablation judge
        # decodes under the score grammar, so its every judgment parses, and it stays out of the jury mean
        "jury": {"judges": [model("j-greedy", 0.0, max_parse_retries=0, constrained=False),
                            model("j-hot", 1.0, max_parse_retries=0, constrained=False)]},
        "ablations": [model("a-grammar", 0.0, max_parse_retries=0)],
        "report": {"metrics": ["fkgl", "compression_ratio", "levenshtein", "bertscore", "sari"], "n_boot": 50},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_job_end_to_end_with_unparseable_judges(ray_local, tiny_model_dir, shared_data, tmp_path):
    cfg = tiny_config(tmp_path, tiny_model_dir, shared_data)
    root = tmp_path / "runs"
    assert cli_main(["run", str(cfg), f"run.root={root}", "wandb.mode=offline", "run.id=t"]) == 0
    run = root / "jury_eval" / "t"
    manifest = json.loads((run / "manifest.json").read_text())
    stages = ["human", "prompts", "complex", "simplify", "pairs", "jury", "ablations", "metrics", "scores", "stats"]
    assert [manifest["stages"][s]["status"] for s in stages] == ["complete"] * len(stages)

    scores = pd.read_parquet(run / "scores")
    judgments = pd.read_parquet(run / "jury")
    usable = scores[scores["generation_error"] == ""]
    assert set(scores["set"]) <= {"synthetic", "simpeval", "asset"}
    assert (scores["set"] == "simpeval").sum() == 6 and (scores["set"] == "asset").sum() == 6
    assert len(judgments) == 2 * len(usable)  # every usable pair judged by both judges, none dropped
    assert (judgments["parse_error"] != "").all() and scores["jury"].isna().all()
    assert scores["n_unparsed"].sum() == len(judgments)
    ablation = pd.read_parquet(run / "ablations")
    assert len(ablation) == len(usable) and (ablation["parse_error"] == "").all()
    assert scores.loc[scores["generation_error"] == "", "judge:a-grammar"].between(1, 5).all()

    stats = pd.read_parquet(run / "stats")
    icc = stats[(stats["section"] == "inter_judge") & (stats["set"] == "all")].iloc[0]
    assert math.isnan(icc["value"]) and icc["n_used"] == 0 and icc["n_excluded"] == len(scores)
    # the automatic metrics still meet the human ratings: check one cell against scipy on the saved scores
    simp = scores[scores["set"] == "simpeval"]
    cell = stats[(stats["section"] == "metric_vs_human") & (stats["set"] == "simpeval") & (stats["a"] == "fkgl")]
    expected = sps.spearmanr(simp["fkgl"], simp["human"]).statistic
    assert cell["value"].iloc[0] == pytest.approx(expected) and cell["n_used"].iloc[0] == 6
    assert scores["bertscore_src"][scores["generation_error"] == ""].between(-1, 1).all()

    trend = stats[(stats["section"] == "expected_trend") & (stats["statistic"] == "spearman")]
    assert "a-grammar" in set(trend["a"])  # the ablation is scored like a judge ...
    assert not (stats["section"].isin(["inter_judge", "judge_vs_jury"]) & (stats["a"] == "a-grammar")).any()

    page = (run / "report.html").read_text()
    assert page.count("<table") >= 9 and "n/a" in page and "Full Spearman matrix" in page
    images = page.split('src="data:image/png;base64,')[1:]
    assert len(images) == 4
    assert all(base64.b64decode(img.split('"', 1)[0]).startswith(b"\x89PNG") for img in images)
    markdown = (run / "report.md").read_text()
    for judge in ("j-greedy", "j-hot"):  # judgments, scored, parse failures
        n = len(usable)
        assert re.search(rf"\|\s*{judge}\s*\|\s*{n}\s*\|\s*0\s*\|\s*{n}\s*\|", markdown), judge
    assert "Expected trend" in markdown and "Metric meta-evaluation" in markdown

    (wandb_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    logged = read_run(wandb_file)
    types = {k.removesuffix("/_type"): v for step in logged["history"] for k, v in step.items()
             if k.endswith("/_type")}
    assert types["report/stats"] == types["report/jury_health"] == "table-file"
    for plot in ("mean_jury_score_per_system", "human_vs_jury", "judge_x_judge_spearman", "full_spearman_matrix"):
        assert types[f"report/{plot}"] == "image-file"
    assert "jury/parse_failures" in logged["summary"]

    before = {s: manifest["stages"][s]["finished_at"] for s in stages}
    assert cli_main(["run", str(cfg), f"run.root={root}", "wandb.mode=disabled", "run.id=t"]) == 0
    again = json.loads((run / "manifest.json").read_text())
    assert {s: again["stages"][s]["finished_at"] for s in stages} == before  # every stage resumed


def _copy_csv(src: Path, dst: Path, rows: int, edit=None, drop: str = "") -> Path:
    with open(src, newline="", encoding="utf-8") as f:
        data = list(csv.DictReader(f))[:rows]
    fields = [c for c in data[0] if c != drop]
    if edit:
        edit(data)
    with open(dst, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data)
    return dst


def test_ratings_file_missing_a_column_exits_2_naming_it(tiny_model_dir, shared_data, tmp_path, capsys):
    bad = _copy_csv(shared_data / "simpeval" / "simpeval_2022.csv", tmp_path / "simpeval.csv", 10, drop="rating_2")
    cfg = tiny_config(tmp_path, tiny_model_dir, shared_data, simpeval=bad)
    assert cli_main(["run", str(cfg), f"run.root={tmp_path / 'runs'}", "wandb.mode=disabled"]) == 2
    err = capsys.readouterr().err
    assert "simpeval.csv" in err and "missing column(s) ['rating_2']" in err


def test_non_numeric_rating_exits_2_naming_column_and_line(tiny_model_dir, shared_data, tmp_path, capsys):
    def corrupt(rows):
        rows[4]["rating"] = "eighty"  # 5th data row = line 6 (the header is line 1)

    bad = _copy_csv(shared_data / "asset" / "human_ratings.csv", tmp_path / "ratings.csv", 20, edit=corrupt)
    cfg = tiny_config(tmp_path, tiny_model_dir, shared_data, asset=bad)
    assert cli_main(["run", str(cfg), f"run.root={tmp_path / 'runs'}", "wandb.mode=disabled"]) == 2
    err = capsys.readouterr().err
    assert "ratings.csv: line 6, column 'rating': non-numeric value 'eighty'" in err


def test_judge_pools_that_cannot_fit_the_local_cluster_are_a_config_error(capsys):
    # two 1-CPU judge pools fill a 2-CPU local cluster: the jury stage would wait forever, so refuse up front
    demo = str(REPO / "configs" / "jury_eval_demo.yaml")
    assert cli_main(["run", demo, "jury.judges.0.pool.num_cpus=1", "jury.judges.1.pool.num_cpus=1"]) == 2
    assert "jury.judges: the judge pools ask for 2 CPUs together" in capsys.readouterr().err
