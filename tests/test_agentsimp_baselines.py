"""Table 2's single-prompt LLM baselines (eval.agentsimp.baselines): Templates 1-3 (Figs. 6-8) on the same backbone
as the agents, one call per document and template, scored like the configurations, plus the paper's averaged row."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from eval.agentsimp import baselines as agentsimp_baselines
from eval.agentsimp.baselines import baseline_call, baseline_records, read_example, render_example
from eval.agentsimp.outputs import Reply
from eval.agentsimp.records import record_rows, score_rows, score_table, stage_rows
from eval.agentsimp.run import resolve_calls
from tests.agentsimp_fake import FakeTeam

DOC = "# Fares\n\nThe council raised bus fares by a considerable amount.\n\nResidents objected."
EXAMPLE = render_example("Hard words here.", "Easy words.")


def test_doctests_pass():
    assert doctest.testmod(agentsimp_baselines).failed == 0


def test_each_template_is_one_call_on_the_whole_document():
    calls = [baseline_call(name, DOC, EXAMPLE) for name in ("llm_t1", "llm_t2", "llm_t3")]
    assert [(c.role, dict(c.inputs)) for c in calls] == [
        ("baseline_template_1", {"raw_text": DOC}), ("baseline_template_2", {"raw_text": DOC}),
        ("baseline_template_3", {"example": EXAMPLE, "raw_text": DOC})]
    assert all(c.fallback.text == DOC for c in calls)
    with pytest.raises(ValueError, match="llm_t3 .* needs an in-context example pair"):
        baseline_call("llm_t3", DOC)


def test_baselines_are_rows_scored_like_the_configurations_with_a_mean_row():
    team = FakeTeam()
    names = ["llm_t1", "llm_t2", "llm_t3"]
    outcomes = resolve_calls([baseline_call(n, DOC, EXAMPLE) for n in names], team, max_retries=1)
    assert len(team.attempts) == 3
    records = baseline_records(DOC, names, outcomes, EXAMPLE)
    rows = record_rows("d", records)
    assert [(r["config"], r["label"], r["final"], r["calls"]) for r in rows] == [
        (f"llm_t{k}", f"LLM T{k}", f"llm{k}({DOC})", 1) for k in (1, 2, 3)]
    stages = [s for r in rows for s in stage_rows("d", json.loads(r["record_json"]))]
    assert [(s["config"], s["stage"]) for s in stages] == [("llm_t1", "llm"), ("llm_t2", "llm"), ("llm_t3", "llm")]
    source = "The council raised bus fares by a considerable amount.\n\nResidents objected."
    scores = score_rows({"d": source}, {"d": ["The council raised fares. People were not happy."]}, stages)
    assert [s["config"] for s in scores] == ["llm_t1", "llm_t2", "llm_t3", "llm_mean"]
    assert scores[3]["sari"] == pytest.approx(sum(s["sari"] for s in scores[:3]) / 3)
    table = score_table(scores, n_boot=0)
    assert [(r["config"], r["label"]) for r in table] == [
        ("llm_t1", "LLM T1"), ("llm_t2", "LLM T2"), ("llm_t3", "LLM T3"), ("llm_mean", "LLM (T1-T3 mean)")]


def test_a_cut_baseline_falls_back_to_the_document_like_any_stage():
    class Cut(FakeTeam):
        def reply(self, attempt):
            return Reply("The council", completion_tokens=640, finish_reason="length")

    outcomes = resolve_calls([baseline_call("llm_t1", DOC)], Cut(), max_retries=2)
    (row,) = record_rows("d", baseline_records(DOC, ["llm_t1"], outcomes))
    assert (row["final"], row["truncated"], row["fallbacks"], row["attempts"]) == (DOC, 1, 1, 1)


def test_config_checks_the_baselines_and_template_3s_pair(tmp_path, monkeypatch):
    from jobs.agentsimp.config import Config

    monkeypatch.chdir(Path(__file__).resolve().parents[1])

    cfg = load_config(Config, "configs/agentsimp_demo.yaml")
    assert cfg.agentsimp.baselines == ["llm_t1", "llm_t2", "llm_t3"]
    assert cfg.agentsimp.example().startswith("Complex document:\n# Library opening hours change")
    with pytest.raises(ConfigError, match="agentsimp.baselines.0"):
        load_config(Config, "configs/agentsimp_demo.yaml", ["agentsimp.baselines=[gpt4]"])
    with pytest.raises(ConfigError, match=r"agentsimp.baseline_example_path: .*nope.json: file not found"):
        load_config(Config, "configs/agentsimp_demo.yaml", [f"agentsimp.baseline_example_path={tmp_path}/nope.json"])
    bad = tmp_path / "pair.json"
    bad.write_text(json.dumps({"complex": "x"}))
    with pytest.raises(ConfigError, match="expected exactly the keys 'complex' and 'simple'"):
        load_config(Config, "configs/agentsimp_demo.yaml", [f"agentsimp.baseline_example_path={bad}"])
    # without template 3 no pair is needed
    cfg = load_config(Config, "configs/agentsimp_demo.yaml",
                      ["agentsimp.baselines=[llm_t1]", f"agentsimp.baseline_example_path={tmp_path}/nope.json"])
    assert cfg.agentsimp.example() == ""
    assert read_example("configs/data/agentsimp_baseline_example.json").endswith("if enough people want it.")
