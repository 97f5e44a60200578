"""AgentSimp evaluation helpers (eval.agentsimp.metrics): hand-worked coverage, length and compression numbers, the
per-reference mean of SARI / D-SARI; the paper's row names of every stage and the cost accounting of four runs
(eval.agentsimp.records, what the job uses)."""

from __future__ import annotations

import doctest
import json
from types import SimpleNamespace

import pytest

from eval.agentsimp import metrics as agentsimp_metrics
from eval.agentsimp import records as agentsimp_records
from eval.agentsimp.metrics import (
    content_recall,
    content_words,
    length_ratio,
    score_document,
    sentence_coverage,
    summary_check,
)
from eval.agentsimp.plan import configurations, plan_document
from eval.agentsimp.run import run_schedules
from eval.metrics.dsari import document_sari
from eval.metrics.sari import corpus_sari
from eval.metrics.text import sentence_fkgl
from tests.agentsimp_fake import FakeTeam

SOURCE = "The council raised bus fares. Parks close at dusk."
OUTPUT = "Bus fares went up. The council said so."


def test_doctests_pass():
    assert doctest.testmod(agentsimp_metrics).failed == 0


def test_coverage_and_length_by_hand():
    # content types: source {council, raised, bus, fare, park, close, dusk}; output {bus, fare, went, council, said}
    assert content_words(SOURCE) == ["council", "raised", "bus", "fare", "park", "close", "dusk"]
    assert content_words(OUTPUT) == ["bus", "fare", "went", "council", "said"]
    assert content_recall(SOURCE, OUTPUT) == pytest.approx(3 / 7)
    # sentence 1 has 3 of its 4 types in the output (covered), sentence 2 none of its 3
    assert sentence_coverage(SOURCE, OUTPUT) == 0.5
    assert sentence_coverage(SOURCE, OUTPUT, min_overlap=0.8) == 0.0
    assert length_ratio(SOURCE, OUTPUT) == pytest.approx(8 / 9)
    check = summary_check(SOURCE, OUTPUT)
    assert (check.is_summary, check.reason) == (False, "")
    check = summary_check(SOURCE, OUTPUT, min_coverage=0.6)
    assert (check.is_summary, check.reason) == (True, "coverage 0.50 < 0.6")


def test_a_summary_is_flagged_and_a_simplification_is_not():
    source = ("The committee postponed its decision owing to insufficient evidence. Critics described the delay as "
              "an abdication of responsibility. The chairman insisted that further consultation was indispensable. "
              "A final ruling is anticipated in the autumn.")
    summary = "The decision was delayed."
    check = summary_check(source, summary)
    # 4 words of 9 + 9 + 8 + 8 = 34; no source sentence keeps half its content words: sentence 1 keeps "decision",
    # 1 of its 6 (committee, postponed, decision, owing, insufficient, evidence); "delayed" is not "delay"
    assert check.length_ratio == pytest.approx(4 / 34)
    assert check.is_summary and check.reason == "length ratio 0.12 < 0.5; coverage 0.00 < 0.5"
    simple = ("The committee put off its decision because there was not enough evidence. Critics said the delay "
              "meant the committee was not doing its job. The chairman said more consultation was needed. A final "
              "ruling is expected in the autumn.")
    check = summary_check(source, simple)
    # sentence 2 is paraphrased ("described ... abdication of responsibility" -> "said ... not doing its job"):
    # 2 of its 5 content words remain, so it counts as uncovered; the check is blind to paraphrase, hence loose
    assert not check.is_summary and check.coverage == 0.75


def test_document_scores_average_over_references_one_by_one():
    source = "The feline perched upon the mat.\n\nIt was content."
    output = "The cat sat on the mat.\n\nIt was happy."
    refs = ["The cat sat on the mat.\n\nIt was happy.", "A cat sat on a mat.\n\nThe cat was glad."]
    scores = score_document(source, output, refs, bertscore=lambda c, r: 1.0 if c == r else 0.5)
    one = [corpus_sari([source], [output], [[r]]) for r in refs]
    assert scores["sari"] == pytest.approx(sum(one) / 2)
    assert scores["sari"] != pytest.approx(corpus_sari([source], [output], [[refs[0]], [refs[1]]]))
    assert scores["dsari"] == pytest.approx((document_sari(source, output, refs[:1]) +
                                             document_sari(source, output, refs[1:])) / 2)
    assert scores["bertscore"] == 0.75
    assert scores["fkgl"] == sentence_fkgl(output)
    assert scores["compression"] == pytest.approx(len(output) / len(source))  # 36 / 47 characters
    bare = score_document(source, output)
    assert bare["sari"] is bare["dsari"] is bare["bertscore"] is None
    means = agentsimp_records.score_table([{"doc_id": d, "config": "pl_direct", "stage": "pf", **s}
                                           for d, s in (("a", scores), ("b", bare))], n_boot=10)[0]
    assert (means["n"], means["sari"]) == (2, scores["sari"])
    assert means["fkgl"] == pytest.approx(scores["fkgl"])


@pytest.fixture(scope="module")
def four_runs():
    paras = ["The feline perched upon the mat.", "It was content.", "Then it departed."]
    team = FakeTeam(bad={("terminology_interpreter", "p2"): 99})
    runs = run_schedules({n: plan_document("art", paras, c) for n, c in configurations().items()}, team)
    return {"d1": runs}, " \n\n".join(paras)


def test_every_stage_carries_the_papers_row_name(four_runs):
    runs, source = four_runs
    labels = {}
    for name, run in runs["d1"].items():
        names = [s for s, _ in run.stages]
        labels.update({(name, s): agentsimp_records.stage_label(name, s, names[-1]) for s in names})
    assert [s for (c, s) in labels if c == "pl_direct"] == ["cs_draft", "cs", "ma", "ti", "aa", "pf"]
    assert labels[("pl_direct", "pf")] == "PL" and labels[("pl_iterative", "pf")] == "PL†"
    assert labels[("pl_direct", "aa")] == "w/o PF" and labels[("pl_direct", "ti")] == "w/o AA"
    assert labels[("pl_direct", "ma")] == "w/o TI" and labels[("pl_direct", "cs")] == "w/o MA"
    assert labels[("sync_direct", "ci")] == "w/o AA" and labels[("sync_direct", "cs")] == "w/o CI, w/ CS"
    assert labels[("sync_iterative", "pf")] == "SYNC†" and labels[("pl_direct", "cs_draft")] == ""
    # and every stage of every configuration is scored against the reference
    stages = [row for name, run in runs["d1"].items() for row in agentsimp_records.stage_rows(
        "d1", json.loads(agentsimp_records.run_rows("d1", {name: run})[0]["record_json"]))]
    scored = agentsimp_records.score_rows({"d1": source}, {"d1": ["The cat sat on the mat. It was happy. Then it left."]},
                                          stages)
    assert len(scored) == len(labels) and all(r["sari"] is not None for r in scored)


def test_cost_counts_each_configuration_alone_and_shared_calls_once(four_runs):
    runs, _ = four_runs
    calls = [row for name, run in runs["d1"].items() for row in agentsimp_records.call_rows(
        "d1", json.loads(agentsimp_records.run_rows("d1", {name: run})[0]["record_json"]))]
    rows = {(r["config"], r["step"]): SimpleNamespace(**r) for r in agentsimp_records.cost_table(calls)}
    # 3 paragraphs: pl_direct = PD + ALA + 3 x (CS, SS, CS', MA, TI) + AA + PF = 19 calls; TI on p2 failed 3 times
    total = rows[("pl_direct", "total")]
    assert (total.calls, total.attempts, total.fallbacks) == (19, 21, 1)
    assert (total.prompt_tokens, total.completion_tokens, total.alloc_seconds) == (2100, 210, 10.5)
    assert (rows[("pl_direct", "plan")].calls, rows[("pl_direct", "initial")].calls,
            rows[("pl_direct", "refined")].calls, rows[("pl_direct", "reconstruct")].calls,
            rows[("pl_direct", "revise")].calls) == (2, 9, 6, 1, 1)
    assert rows[("pl_iterative", "reconstruct")].calls == 2  # ceil(3 / 2) windows
    assert rows[("sync_direct", "total")].calls == 2 + 9 + 9 + 1 + 1
    # distinct: PD, ALA, 9 CS/SS/CS', PL 6 MA/TI, SYNC 9 MA/TI/CI, 2 direct AA, 2 x 2 windows, 4 PF = 36; the
    # fake fails TI on p2 in both strategies (pipeline and sync TI calls differ): 2 x 2 retries, 2 fallbacks
    everything = rows[("all", "total")]
    assert (everything.calls, everything.attempts, everything.fallbacks) == (36, 40, 2)
    assert everything.alloc_seconds == 40 * 0.5
    assert list(dict.fromkeys(c for c, _ in rows)) == ["pl_direct", "pl_iterative", "sync_direct",
                                                       "sync_iterative", "all"]
