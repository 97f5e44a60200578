"""eval.agentsimp.records: run-store rows of AgentSimp runs, the cost table and the score table, by hand."""

from __future__ import annotations

import doctest
import json

import pytest

from eval.agentsimp import records
from eval.agentsimp.plan import configurations, plan_document
from eval.agentsimp.run import run_schedules
from tests.agentsimp_fake import FakeTeam

PARAS = ["P0", "P1", "P2"]


def test_doctests_pass():
    assert doctest.testmod(records).failed == 0


def four_runs(team=None):
    team = team or FakeTeam()
    schedules = {name: plan_document("\n\n".join(PARAS), PARAS, c) for name, c in configurations().items()}
    return run_schedules(schedules, team, max_retries=1), team


def test_run_rows_count_shared_calls_and_keep_the_whole_run():
    runs, team = four_runs()
    rows = records.run_rows("d", runs)
    assert [r["config"] for r in rows] == ["pl_direct", "pl_iterative", "sync_direct", "sync_iterative"]
    assert [r["calls"] for r in rows] == [19, 19, 22, 22]
    assert [r["shared"] for r in rows] == [0, 16, 11, 19]
    # what the team was asked: each distinct call once
    assert sum(len(b) for b in team.batches) == 36
    record = json.loads(rows[1]["record_json"])
    assert record["label"] == "PL†" and len(record["windows"]) == 2


def test_stage_rows_hold_document_paragraph_and_window_texts():
    runs, _ = four_runs()
    record = json.loads(records.run_rows("d", {"pl_iterative": runs["pl_iterative"]})[0]["record_json"])
    rows = records.stage_rows("d", record)
    doc = {r["stage"]: r["text"] for r in rows if r["paragraph"] == -1 and r["window"] == -1}
    assert list(doc) == ["cs_draft", "cs", "ma", "ti", "aa", "pf"]
    assert doc["ti"] == "ti(ma(rev(cs(P0))))\n\nti(ma(rev(cs(P1))))\n\nti(ma(rev(cs(P2))))"
    p1 = {r["stage"]: r["text"] for r in rows if r["paragraph"] == 1}
    assert p1 == {"original": "P1", "cs_draft": "cs(P1)", "cs": "rev(cs(P1))", "ma": "ma(rev(cs(P1)))",
                  "ti": "ti(ma(rev(cs(P1))))"}
    windows = [(r["window"], r["stage"], r["text"]) for r in rows if r["window"] >= 0]
    assert windows[3] == (1, "window_in", "A(ti(ma(rev(cs(P1)))))\n\nti(ma(rev(cs(P2))))")
    assert windows[2] == (0, "window_kept", "A(ti(ma(rev(cs(P0)))))")


def test_cost_table_counts_each_configuration_alone_and_distinct_calls_once():
    runs, _ = four_runs(FakeTeam(bad={("content_simplifier", "p0"): 1}))
    calls = [row for name, run in runs.items()
             for row in records.call_rows("d", json.loads(records.run_rows("d", {name: run})[0]["record_json"]))]
    table = {(r["config"], r["step"]): r for r in records.cost_table(calls)}
    # the fake: 100 prompt tokens, 10 completion tokens and 0.5 s per attempt; CS on p0 answered badly once
    pl = table[("pl_direct", "total")]
    assert (pl["calls"], pl["attempts"], pl["prompt_tokens"], pl["alloc_seconds"]) == (19, 20, 2000, 10.0)
    assert table[("pl_direct", "initial")]["calls"] == 9 and table[("pl_direct", "plan")]["calls"] == 2
    everything = table[("all", "total")]
    assert (everything["calls"], everything["attempts"], everything["completion_tokens"]) == (36, 37, 370)
    assert sum(table[(c, "total")]["calls"] for c in configurations()) == 82


def test_score_table_means_ci_labels_and_jury():
    scores = [{"doc_id": d, "config": "pl_direct", "stage": s, "sari": v, "dsari": None, "fkgl": 10.0 + v,
               "bertscore": float("nan"), "compression": 1.0, "length_ratio": 1.0, "coverage": 1.0,
               "content_recall": 1.0, "is_summary": 0.0}
              for d, v in (("a", 30.0), ("b", 40.0)) for s in ("ti", "aa", "pf")]
    jury = {("a", "pl_direct"): {"jury_coherence": 2.0, "jury": 2.0}, ("b", "pl_direct"): {"jury_coherence": 4.0,
                                                                                          "jury": 4.0}}
    table = records.score_table(scores, jury, n_boot=200, seed=0)
    assert [(r["stage"], r["label"]) for r in table] == [("ti", "w/o AA"), ("aa", "w/o PF"), ("pf", "PL")]
    final = table[-1]
    assert final["sari"] == pytest.approx(35.0) and final["fkgl"] == pytest.approx(45.0)
    assert 30.0 <= final["sari_lo"] <= 35.0 <= final["sari_hi"] <= 40.0
    assert final["dsari"] is None and final["bertscore"] is None  # None and NaN are both "no value"
    assert final["jury"] == pytest.approx(3.0) and final["jury_coherence"] == pytest.approx(3.0)
    assert "jury" not in table[0]  # the jury judges final documents only
