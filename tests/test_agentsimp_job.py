"""AgentSimp (paper 004) job: the worker against an OpenAI-compatible fake team (exact call sequences, retries and
fallbacks seen at the HTTP edge), the Ray job end to end with resume, and `quorum simplify-doc`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from actors.agentsimp_worker import AgentSimpWorker
from eval.agentsimp.docs import Block, Document
from eval.agentsimp.parse import parse_output
from eval.agentsimp.records import document_row
from eval.agentsimp.roles import join_paragraphs
from jobs.cli import main as cli_main
from tests.agentsimp_fake import OUTLINE, ServerTeam
from tests.fake_openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parents[1]
PARAS = ["P0", "P1", "P2"]
ARTICLE = join_paragraphs(PARAS)
JURY_ANSWER = "Clear enough. Answer: [4]"


def worker(server, configs, **kw) -> AgentSimpWorker:
    # one request at a time, so the server sees each batch in the plan's order
    spec = {"kind": "openai", "model": "team", "base_url": server.base_url, "max_concurrency": 1, "max_retries": 0}
    return AgentSimpWorker(spec, {}, configs, max_tokens=256, **kw)


def run_one(configs, **kw):
    team = ServerTeam(**kw.pop("team", {}))
    doc = Document("d", tuple(Block("paragraph", p) for p in PARAS))
    with FakeOpenAIServer(reply_body=team) as server:
        out = worker(server, configs, **kw)(pd.DataFrame([document_row(doc)]))
    return team, out


def paragraph_stage(g="G"):
    """The calls every configuration starts its paragraph stage with: CS, SS (suggestions), CS' per paragraph."""
    cs = [("content_simplifier", {"guidelines": g, "paragraph": p}) for p in PARAS]
    ss = [("simplify_supervisor", {"guidelines": g, "simplified_paragraph": f"cs({p})"}) for p in PARAS]
    rev = [("content_simplifier_revise", {"guidelines": g, "paragraph": p, "simplified": f"cs({p})",
                                          "suggestions": f"ss(cs({p}))"}) for p in PARAS]
    return cs, ss, rev


def pipeline_calls():
    cs, ss, rev = paragraph_stage()
    ma = [("metaphorical_analyst", {"guidelines": "G", "paragraph": f"rev(cs({p}))"}) for p in PARAS]
    ti = [("terminology_interpreter", {"guidelines": "G", "paragraph": f"ma(rev(cs({p})))"}) for p in PARAS]
    return cs + ss + rev + ma + ti, [f"ti(ma(rev(cs({p}))))" for p in PARAS]


def sync_calls():
    cs, ss, rev = paragraph_stage()
    ma = [("metaphorical_analyst", {"guidelines": "G", "paragraph": p}) for p in PARAS]
    ti = [("terminology_interpreter", {"guidelines": "G", "paragraph": p}) for p in PARAS]
    ci = [("content_integrator", {"guidelines": "G", "original_paragraph": p,
                                  "basic_simplification_paragraph": f"rev(cs({p}))",
                                  "metaphorical_simplification_paragraph": f"ma({p})",
                                  "terminology_simplification_paragraph": f"ti({p})"}) for p in PARAS]
    # sync: CS, MA and TI of every paragraph in one batch, then the supervisor rounds, then the integrator
    return cs + ma + ti + ss + rev + ci, [f"ci(rev(cs({p})))" for p in PARAS]


def direct_tail(chunks):
    body = join_paragraphs(chunks)
    article = f"# T\n\n## S1\n\n{body}"
    return [("article_architect_direct", {"guidelines": "G", "outline": json.dumps(OUTLINE), "paragraphs": body}),
            ("proofreader", {"article": article})], article


def iterative_tail(chunks):
    # C = 2: window 0 = chunks 0-1 (+ G); keep A(c0), carry A(c1); window 1 = carry + chunk 2, all kept
    w0 = ("article_architect_iterative_guided", {"guidelines": "G", "paragraphs": join_paragraphs(chunks[:2])})
    w1 = ("article_architect_iterative", {"paragraphs": join_paragraphs([f"A({chunks[1]})", chunks[2]])})
    article = join_paragraphs([f"A({chunks[0]})", f"A(A({chunks[1]}))", f"A({chunks[2]})"])
    return [w0, w1, ("proofreader", {"article": article})], article


PD = ("project_director", {"article": ARTICLE})
ALA = ("article_logic_analyst", {"article": ARTICLE})


@pytest.mark.parametrize("config", ["pl_direct", "pl_iterative", "sync_direct", "sync_iterative"])
def test_each_configuration_makes_exactly_the_papers_calls_in_order(config):
    team, out = run_one([config])
    stage, chunks = pipeline_calls() if config.startswith("pl") else sync_calls()
    tail, final = direct_tail(chunks) if config.endswith("direct") else iterative_tail(chunks)
    planning = [PD, ALA] if config.endswith("direct") else [PD]
    assert team.calls == planning + stage + tail
    (row,) = out.to_dict("records")
    assert row["config"] == config and row["final"] == final and row["fallbacks"] == 0
    record = json.loads(row["record_json"])
    assert [c["role"] for c in record["calls"]] == [role for role, _ in team.calls]
    if config.endswith("iterative"):
        assert [w["carry"] for w in record["windows"]] == [f"A({chunks[1]})", None]


def test_four_configurations_in_one_run_share_their_calls():
    team, out = run_one(["pl_direct", "pl_iterative", "sync_direct", "sync_iterative"])
    keys = [(role, json.dumps(inputs, sort_keys=True)) for role, inputs in team.calls]
    assert len(keys) == len(set(keys)), "a shared call was made twice"
    rows = out.set_index("config")
    # M = 3, C = 2: PL 5M+4, PL† 5M+2+2, SYNC 6M+4, SYNC† 6M+2+2 calls; pl_iterative shares PD and its whole
    # paragraph stage with pl_direct, sync_* share PD, (ALA), CS/SS/CS' with the pipeline ones
    assert rows["calls"].to_dict() == {"pl_direct": 19, "pl_iterative": 19, "sync_direct": 22, "sync_iterative": 22}
    assert rows["shared"].to_dict() == {"pl_direct": 0, "pl_iterative": 16, "sync_direct": 11, "sync_iterative": 19}
    assert len(team.calls) == 82 - 46


def test_invalid_json_is_retried_then_accepted_or_recorded_as_fallback():
    # CS answers prose for P1 twice (then JSON: accepted on the third attempt); TI on anything from P2, always
    team, out = run_one(["pl_direct"], team={"invalid": {"P1": ("content_simplifier", 2),
                                                         "P2": ("terminology_interpreter", None)}},
                        max_retries=2)
    cs_p1 = [c for c in team.calls if c == ("content_simplifier", {"guidelines": "G", "paragraph": "P1"})]
    assert len(cs_p1) == 3
    ti_p2 = [c for c in team.calls if c[0] == "terminology_interpreter" and "P2" in c[1]["paragraph"]]
    assert len(ti_p2) == 3
    record = json.loads(out.iloc[0]["record_json"])
    calls = {(c["role"], c["unit"]): c for c in record["calls"]}
    assert calls[("content_simplifier", "p1")]["attempts"] == 3 and not calls[("content_simplifier", "p1")]["fell_back"]
    ti = calls[("terminology_interpreter", "p2")]
    assert ti["attempts"] == 3 and ti["fell_back"] and len(ti["errors"]) == 3
    # the stage falls back to its input: the metaphorical analyst's paragraph goes on unchanged
    assert record["paragraphs"][2]["stages"]["ti"] == "ma(rev(cs(P2)))"
    assert out.iloc[0]["fallbacks"] == 1


def job_overrides(root: Path, url: str) -> list[str]:
    engine = f"{{kind: openai, model: team, base_url: '{url}', max_concurrency: 4}}"
    # one judge (one more actor pool to start); the demo config has all three aspects
    judges = (f"{{name: faithfulness, template: agentsimp_jury_faithfulness, engine: {engine}, "
              "pool: {num_cpus: 0.25}, sampling: {max_tokens: 32}}")
    return [f"run.root={root}", "wandb.mode=disabled", "ray.num_cpus=2", f"backbone.engine={engine}",
            "backbone.pool.num_cpus=0.5", "evaluation.n_boot=50", f"evaluation.jury.judges=[{judges}]",
            # two documents (plain text, Markdown), both with references in the corpus file
            "inputs.paths=[configs/data/agentsimp_demo/notice_road_works.txt,configs/data/agentsimp_demo/terms_library.md]",
            "inputs.references_path=configs/data/agentsimp_demo/corpus.jsonl"]


@pytest.mark.slow
def test_job_end_to_end_then_resumes_fast(ray_local, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    team = ServerTeam(unknown=JURY_ANSWER)
    with FakeOpenAIServer(reply_body=team) as server:
        args = ["run", "configs/agentsimp_demo.yaml", *job_overrides(tmp_path, server.base_url)]
        started = time.time()
        assert cli_main(args) == 0
        first = time.time() - started
        calls = len(server.calls)
        started = time.time()
        assert cli_main(args) == 0
        second = time.time() - started
        assert len(server.calls) == calls, "the resumed run asked the model again"
    run_dir = tmp_path / "agentsimp" / "agentsimp_demo"
    runs = pd.read_parquet(run_dir / "runs")
    # 2 documents x (4 configurations + the 3 single-prompt baselines of Table 2)
    assert len(runs) == 2 * (4 + 3) and (runs["fallbacks"] == 0).all()
    table = pd.read_parquet(run_dir / "table")
    final = table[table["label"].isin(["PL", "PL†", "SYNC", "SYNC†"])].set_index("config")
    assert len(final) == 4
    baselines = table[table["config"].str.startswith("llm_")].set_index("config")
    assert list(baselines["label"]) == ["LLM T1", "LLM T2", "LLM T3", "LLM (T1-T3 mean)"]
    assert baselines["sari"].notna().all() and baselines.loc["llm_mean", "sari"] == pytest.approx(
        baselines.loc[["llm_t1", "llm_t2", "llm_t3"], "sari"].mean())
    for column in ("sari", "dsari", "fkgl", "bertscore", "jury"):
        assert final[column].notna().all(), column
    assert (final["jury"] == 4).all()
    costs = pd.read_parquet(run_dir / "costs")
    totals = costs[costs["step"] == "total"].set_index("config")
    assert totals.loc["all", "calls"] < totals.drop("all")["calls"].sum()  # shared calls made once
    stages = pd.read_parquet(run_dir / "stages")
    assert {"cs_draft", "cs", "ma", "ti", "ci", "aa", "pf", "window_in"} <= set(stages["stage"])
    report = (run_dir / "report.md").read_text()
    assert "Cost per configuration and step" in report and "SYNC†" in report
    assert second < max(0.25 * first, 5.0), (first, second)


def test_simplify_doc_prints_side_by_side_and_writes_html(tmp_path, capsys):
    team = ServerTeam()
    doc = tmp_path / "note.md"
    doc.write_text("# A note\n\nP0\n\nP1\n\nP2\n", encoding="utf-8")
    html = tmp_path / "out.html"
    with FakeOpenAIServer(reply_body=team) as server:
        code = cli_main(["simplify-doc", str(doc), "--configuration", "pl_iterative", "--html", str(html),
                         f"backbone.engine={{kind: openai, model: team, base_url: '{server.base_url}'}}"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "P1" in printed and "A(ti(ma(rev(cs(P1)))))" in printed and "[ti]" in printed
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "A(A(ti(ma(rev(cs(P1))))))" in page and "<table" in page
    assert len(team.calls) == 1 + 3 * 5 + 2 + 1


def test_hf_engine_decodes_every_json_role_under_its_grammar(tiny_model_dir):
    """A random 2-layer model never writes the roles' JSON by itself; under the grammars every JSON answer parses."""
    from eval.agentsimp.roles import role_spec

    doc = Document("d", (Block("paragraph", "The council will resurface Mill Road."),
                         Block("paragraph", "Buses will divert via Station Street.")))
    spec = {"kind": "hf", "model": tiny_model_dir, "num_threads": 1}
    out = AgentSimpWorker(spec, {}, ["sync_direct"], max_tokens=96, max_retries=0)(pd.DataFrame([document_row(doc)]))
    calls = json.loads(out.iloc[0]["record_json"])["calls"]
    json_calls = [c for c in calls if role_spec(c["role"]).output == "json"]
    assert {c["role"] for c in json_calls} >= {"article_logic_analyst", "content_simplifier", "terminology_interpreter",
                                               "metaphorical_analyst", "simplify_supervisor", "proofreader"}
    # every answer parses; a random model runs its strings to their token share, which the guard reads as a cut
    # answer when the main field's re-tokenized count reaches it (falls back at once, counted), never as invalid JSON
    assert all(parse_output(c["role"], c["raws"][-1]).error == "" for c in json_calls)
    assert all(e.startswith("truncated: ") for c in json_calls for e in c["errors"])
    assert all(c["attempts"] == 1 and c["fell_back"] == bool(c["errors"]) for c in json_calls)
