"""jobs/craft end to end on real Ray with a scripted hosted model (faked at the HTTP edge), resume, bad input.

The scripted model answers by what the last user message is: a planner prompt or observation -> a Table 17 answer
whose tools are the row's gold calls and whose plan keeps every sentence; the reviser's E.7 prompt -> the plan's
sentences (so the revision equals the original text); E.8 feedback -> nothing; Iter's later rounds -> "Shorter.".
Direct's prompt is the planner's user turn (instruction, blank line, text), so Direct gets the planner answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from eval.craft.agent import quality
from eval.craft.cord import read_cord
from eval.craft.tools import constraint_accuracy
from jobs.cli import main as cli_main
from tests.fake_openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parents[1]
CORD = REPO.parent / "shared" / "data" / "cord"
ROWS = {r.text: r for r in read_cord(CORD, levels=[1, 2])}


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def scripted(user: str) -> str:
    if user.startswith("### INSTRUCTIONS:"):  # reviser: copy the plan's sentences
        return "\n".join(re.findall(r'Sentence: "(.*?)"; Improvement Plan:', user))
    if user.startswith("Please analyze"):
        return ""
    if "Your previous revision" in user:
        return "Shorter."
    text = user.split("\n\n", 1)[-1]
    row = ROWS.get(text)
    if row is None and not user.startswith("###OBSERVATION"):
        return "Short."  # should not happen: every prompt carries a known text or an observation
    if row is None:
        text = user.split("\n", 1)[1].split("\n\n")[0]  # the observation's revised text
        calls = ['sentence_count_check(1, "more than")']
    else:
        calls = row.gold_calls
    plan = "\n".join(f'Sentence: "{s}"; Improvement Plan: "Keep it."' for s in sentences(text))
    return "###THOUGHT: Check and keep.\n###ACTION:\n   -###TOOLS:\n" + "\n".join(calls) + f"\n   -###PLAN:\n{plan}"


def config(tmp_path: Path, url: str, data_path: Path = CORD, **data) -> Path:
    engine = {"kind": "openai", "model": "craft", "base_url": url, "max_concurrency": 4}
    cfg = {"job": "craft", "ray": {"num_cpus": 2}, "wandb": {"project": "quorum-test", "mode": "disabled"},
           "data": {"path": str(data_path), "levels": [1, 2], "per_level": 1, **data},
           "planner": engine, "reviser": engine, "pool": {"num_cpus": 0.5, "batch_size": 1, "concurrency": 1},
           "agent": {"max_steps": 2, "iter_rounds": 2, "planner_prompt": "craft_planner_brief",
                     "quality_feedback": True, "planner_max_tokens": 64, "reviser_max_tokens": 2688},
           "mcts": {"width": 2, "max_iterations": 2, "max_depth": 2}, "report": {"n_boot": 50},
           # the old proxy keeps this test model-free (no scorer model to stage); D.3: tests/test_craft_quality.py
           "quality": {"metric": "difflib", "ppl_model": "", "bart_model": ""}}
    path = tmp_path / "craft.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
def test_craft_job_end_to_end_and_resume(ray_local, tmp_path):
    root = tmp_path / "runs"
    with FakeOpenAIServer(reply=scripted) as server:
        cfg = config(tmp_path, server.base_url)
        assert cli_main(["run", str(cfg), f"run.root={root}", "run.id=t"]) == 0
        first_calls = len(server.calls)
        run = root / "craft" / "t"
        runs = pd.read_parquet(run / "runs")
        assert runs.groupby("system").size().to_dict() == {"direct": 2, "iter": 2, "agent": 2, "mcts": 2,
                                                           "mcts_oracle_rc": 2, "mcts_gold_planner": 2}
        assert (runs["error"] == "").all() and (runs["engine_errors"] == 0).all()
        by = runs.set_index(["system", "level"])
        assert by.loc["direct", "revision"].str.startswith("###THOUGHT").all()
        # one guard rule: Iter's collapsed "Shorter." falls back to the text it revised (Direct's answer), counted
        assert (by.loc["iter", "revision"] == by.loc["direct", "revision"]).all()
        assert (by.loc["iter", "guard_flags_json"] == '{"collapsed": 1}').all()
        # agent: a copy of the original, so its gold-call accuracy is the copy floor; one step (the planner's
        # checks are the gold calls and... hold only if the copy meets them) or two; 2 calls per step + 3 feedback
        for row in runs[runs["system"].isin(["agent", "mcts", "mcts_oracle_rc"])].itertuples():
            assert quality(row.text, row.revision) > 90  # a copy, up to the fake's naive sentence quoting
            assert row.quality == pytest.approx(quality(row.text, row.revision))  # the recorded R_g (difflib here)
        # both controls grade R_c on CORD's gold calls; each search row counts its children against the copy
        for row in runs[runs["system"].isin(["mcts_oracle_rc", "mcts_gold_planner"])].itertuples():
            detail = json.loads(row.detail_json)
            assert detail["rc_calls"] == list(row.gold_calls)
            vs = detail["children_vs_copy"]
            assert vs["children"] == 4 and vs["usable"] <= vs["children"] and 0 <= vs["better"] <= vs["usable"]
        calls = (by["llm_calls"] + by["cache_hits"]).to_dict()  # requests, whether the cache answered or not
        # Iter's first round is Direct's request: the cache answers it, so it costs no call
        assert calls[("direct", 1)] == 1 and calls[("iter", 1)] == 2 and by.loc[("iter", 1), "llm_calls"] == 1
        assert calls[("agent", 1)] % 5 == 0  # planner + reviser + 3 feedback per step
        assert calls[("mcts", 1)] % 10 == 0  # 2 children x 5 calls per expansion
        assert calls[("mcts_oracle_rc", 1)] % 10 == 0
        # the gold planner sends no planner request: 2 children x (reviser + 3 feedback) per expansion
        assert calls[("mcts_gold_planner", 1)] % 8 == 0 and calls[("mcts_gold_planner", 1)] > 0
        assert runs["llm_calls"].sum() == first_calls  # every call reached the server once (fresh cache)
        manifest = json.loads((run / "manifest.json").read_text())
        assert all(manifest["stages"][s]["status"] == "complete"
                   for s in ("data", "runs", "accuracy", "accuracy_by_type", "quality"))
        level = pd.read_parquet(run / "accuracy").set_index(["system", "level"])
        for row in runs[runs["system"] == "direct"].itertuples():
            acc, _ = constraint_accuracy(row.gold_calls, row.text, row.revision)
            assert level.loc[("direct", f"C{row.level}"), "accuracy"] <= 1.0 and 0.0 <= acc <= 1.0
        assert set(level.index.get_level_values("level")) == {"C1", "C2", "all"}
        # the copy-the-input floor is in every table, computed without a model call
        assert set(level.index.get_level_values("system")) == {"copy", "direct", "iter", "agent", "mcts",
                                                               "mcts_oracle_rc", "mcts_gold_planner"}
        summary = (run / "summary.md").read_text()
        assert "Constraint accuracy per level" in summary and "LLM calls per solved instance" in summary
        assert re.search(r"^\| copy +\|", summary, re.MULTILINE)
        assert "One-tailed sign tests: each system against copy and against Iter" in summary
        assert "Search children that meet more gold constraints than the copy" in summary
        assert (run / "report.html").exists()
        # resume: the second run reuses every stage and sends nothing
        assert cli_main(["run", str(cfg), f"run.root={root}", "run.id=t"]) == 0
        assert len(server.calls) == first_calls
        assert json.loads((run / "manifest.json").read_text())["stages"]["runs"] == manifest["stages"]["runs"]


def bad_cord(tmp_path: Path, bad_line: str) -> Path:
    good = (CORD / "cord.constraint_1.jsonl").read_text().split("\n")[0]
    folder = tmp_path / "cord"
    folder.mkdir()
    (folder / "cord.constraint_1.jsonl").write_text(good + "\n" + bad_line + "\n")
    return folder


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "line 2"),
    ('{"id": 7, "other_info": {}}', "no test_input"),
])
def test_bad_cord_line_stops_the_run_naming_file_and_line(tmp_path, capsys, bad_line, message):
    folder = bad_cord(tmp_path, bad_line)
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", folder, levels=[1], per_level=0)
    assert cli_main(["run", str(cfg), f"run.root={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert "cord.constraint_1.jsonl: line 2" in err and message in err
    assert not (tmp_path / "runs" / "craft").exists()  # nothing started


def test_unparseable_constraint_names_file_and_line(tmp_path, capsys):
    good = json.loads((CORD / "cord.constraint_1.jsonl").read_text().split("\n")[0])
    good["other_info"]["constraint_info"][0]["function_call"] = "word_count_check(__import__('os'))"
    good.get("tool_test_result", {}).pop("constraint_info", None)
    folder = bad_cord(tmp_path, json.dumps(good))
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", folder, levels=[1], per_level=0)
    assert cli_main(["run", str(cfg), f"run.root={tmp_path / 'runs'}"]) == 2
    assert "cord.constraint_1.jsonl: line 2" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_line_kept_and_counted_as_failed_with_on_error_keep(ray_local, tmp_path):
    folder = bad_cord(tmp_path, "{not json")
    root = tmp_path / "runs"
    with FakeOpenAIServer(reply=scripted) as server:
        cfg = config(tmp_path, server.base_url, folder, levels=[1], per_level=0, on_error="keep")
        assert cli_main(["run", str(cfg), f"run.root={root}", "run.id=k", "systems=[direct]"]) == 0
        assert len(server.calls) == 1  # the bad row calls no model
    runs = pd.read_parquet(root / "craft" / "k" / "runs")
    assert len(runs) == 2
    bad = runs[runs["error"] != ""].iloc[0]
    assert bad["error"].startswith("bad input: ") and bad["llm_calls"] == 0 and bad["source"].endswith(":2")
    level = pd.read_parquet(root / "craft" / "k" / "accuracy").set_index(["system", "level"])
    assert level.loc[("direct", "C1"), "instances"] == 2  # the failed row is scored (0), not dropped
    assert "failed" in (root / "craft" / "k" / "summary.md").read_text()


@pytest.mark.parametrize("override, key", [("systems=[direct,nope]", "systems"), ("data.on_error=skip", "data.on_error"),
                                           ("agent.planner_prompt=no_such_prompt", "agent.planner_prompt"),
                                           ("mcts.width=0", "width: must be >= 1"), ("data.levels=[7]", "data.levels"),
                                           ("agent.reviser_max_tokens=128", "agent.reviser_max_tokens"),
                                           ("quality.some_model=gfm-models", "quality.some_model")])
def test_config_errors_name_the_key(tmp_path, capsys, override, key):
    cfg = config(tmp_path, "http://127.0.0.1:9/v1")
    assert cli_main(["run", str(cfg), f"run.root={tmp_path / 'runs'}", override]) == 2
    assert key in capsys.readouterr().err
