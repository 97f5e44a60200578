"""AgentSimp schedules (eval.agentsimp.plan) driven by a deterministic fake team (tests/agentsimp_fake.py).

The exact batches of each of the four configurations on a 5-paragraph document with C = 2, the window contents and
carry-over, the keys shared between configurations, retries and fallbacks, and the knobs where the paper is silent.
"""

from __future__ import annotations

import json

import pytest

from eval.agentsimp.parse import RoleValue
from eval.agentsimp.plan import PlanConfig, RoleCall, configurations, plan_document
from eval.agentsimp.roles import load_role_book
from eval.agentsimp.run import Attempt, attempt_sampling, resolve_calls, run_record, run_schedule, run_schedules
from tests.agentsimp_fake import OUTLINE, FakeTeam

PARAS = ["P1", "P2", "P3", "P4", "P5"]
ARTICLE = "# Title\n\nP1\n\nP2\n\nP3\n\nP4\n\nP5"
PS = [f"p{i}" for i in range(5)]


def run(config: PlanConfig, team: FakeTeam | None = None, paras=PARAS, max_retries: int = 2):
    team = team or FakeTeam()
    return run_schedule(plan_document(ARTICLE, paras, config), team, max_retries), team


def batch(*roles_units):
    return [(role, unit, 0) for role, units in roles_units for unit in units]


CS = ("content_simplifier", PS)
SS = ("simplify_supervisor", PS)
CSR = ("content_simplifier_revise", PS)
MA = ("metaphorical_analyst", PS)
TI = ("terminology_interpreter", PS)
CI = ("content_integrator", PS)
PLAN_DIRECT = batch(("project_director", ["doc"]), ("article_logic_analyst", ["doc"]))
PLAN_ITERATIVE = batch(("project_director", ["doc"]))
WINDOWS = [batch(("article_architect_iterative_guided", ["w0"])), batch(("article_architect_iterative", ["w1"])),
           batch(("article_architect_iterative", ["w2"]))]
PF = batch(("proofreader", ["doc"]))
EXPECTED_BATCHES = {
    "pl_direct": [PLAN_DIRECT, batch(CS), batch(SS), batch(CSR), batch(MA), batch(TI),
                  batch(("article_architect_direct", ["doc"])), PF],
    "pl_iterative": [PLAN_ITERATIVE, batch(CS), batch(SS), batch(CSR), batch(MA), batch(TI), *WINDOWS, PF],
    "sync_direct": [PLAN_DIRECT, batch(CS, MA, TI), batch(SS), batch(CSR), batch(CI),
                    batch(("article_architect_direct", ["doc"])), PF],
    "sync_iterative": [PLAN_ITERATIVE, batch(CS, MA, TI), batch(SS), batch(CSR), batch(CI), *WINDOWS, PF],
}


@pytest.mark.parametrize("name", list(EXPECTED_BATCHES))
def test_exact_batches_of_each_configuration(name):
    doc, team = run(configurations()[name])
    assert team.batches == EXPECTED_BATCHES[name]
    assert len(doc.calls) == {"pl_direct": 29, "pl_iterative": 30, "sync_direct": 34, "sync_iterative": 35}[name]


def test_pipeline_inputs_flow_cs_supervisor_ma_ti():
    doc, team = run(configurations()["pl_direct"])
    calls = {(a.call.role, a.call.unit): dict(a.call.inputs) for a in team.attempts}
    assert calls[("content_simplifier", "p2")] == {"guidelines": "G", "paragraph": "P3"}
    assert calls[("simplify_supervisor", "p2")] == {"guidelines": "G", "simplified_paragraph": "cs(P3)"}
    assert calls[("content_simplifier_revise", "p2")] == {
        "guidelines": "G", "paragraph": "P3", "simplified": "cs(P3)", "suggestions": "ss(cs(P3))"}
    assert calls[("metaphorical_analyst", "p2")] == {"guidelines": "G", "paragraph": "rev(cs(P3))"}
    assert calls[("terminology_interpreter", "p2")] == {"guidelines": "G", "paragraph": "ma(rev(cs(P3)))"}
    assert calls[("project_director", "doc")] == {"article": ARTICLE}
    aa = calls[("article_architect_direct", "doc")]
    assert aa["guidelines"] == "G"
    assert aa["outline"] == '{"title": "T", "subheadings": ["S1", "S2"]}'
    assert aa["paragraphs"] == "\n\n".join(f"ti(ma(rev(cs(P{k}))))" for k in range(1, 6))
    assert doc.paragraphs[2].stages == (("cs_draft", "cs(P3)"), ("cs", "rev(cs(P3))"), ("ma", "ma(rev(cs(P3)))"),
                                        ("ti", "ti(ma(rev(cs(P3))))"))
    assert dict(doc.paragraphs[2].notes) == {"suggestions_1": "ss(cs(P3))", "metaphors": "a metaphor",
                                             "terms": "term"}
    assert [s for s, _ in doc.stages] == ["cs_draft", "cs", "ma", "ti", "aa", "pf"]
    assert doc.stage("ma").split("\n\n")[0] == "ma(rev(cs(P1)))"
    # the proofreader found nothing ("None"): the architect's article is final
    assert doc.final == doc.stage("aa") == "# T\n\n## S1\n\n" + aa["paragraphs"]
    assert doc.guideline == "G" and doc.outline.title == OUTLINE["title"]


def test_sync_agents_read_the_original_and_the_integrator_fuses():
    doc, team = run(configurations()["sync_direct"])
    calls = {(a.call.role, a.call.unit): dict(a.call.inputs) for a in team.attempts}
    assert calls[("metaphorical_analyst", "p0")] == {"guidelines": "G", "paragraph": "P1"}
    assert calls[("terminology_interpreter", "p0")] == {"guidelines": "G", "paragraph": "P1"}
    assert calls[("content_integrator", "p0")] == {
        "guidelines": "G", "original_paragraph": "P1", "basic_simplification_paragraph": "rev(cs(P1))",
        "metaphorical_simplification_paragraph": "ma(P1)", "terminology_simplification_paragraph": "ti(P1)"}
    # the echoed "Fusion Simplification:" is not part of the paragraph
    assert doc.paragraphs[0].final == "ci(rev(cs(P1)))"
    assert [s for s, _ in doc.stages] == ["cs_draft", "cs", "ma", "ti", "ci", "aa", "pf"]


@pytest.mark.parametrize("comm,stage", [("pipeline", "ti(ma(rev(cs(P{}))))"), ("sync", "ci(rev(cs(P{})))")])
def test_iterative_windows_carry_the_last_paragraph(comm, stage):
    doc, team = run(PlanConfig(communication=comm, reconstruction="iterative"))
    t = [stage.format(k) for k in range(1, 6)]
    w0, w1, w2 = doc.windows
    assert (w0.carried, w0.paragraphs, w0.guided) == (None, (t[0], t[1]), True)
    assert (w0.emitted, w0.carry) == ((f"A({t[0]})",), f"A({t[1]})")
    assert (w1.carried, w1.paragraphs, w1.guided) == (f"A({t[1]})", (t[2], t[3]), False)
    assert w1.output == (f"A(A({t[1]}))", f"A({t[2]})", f"A({t[3]})")
    assert (w1.emitted, w1.carry) == ((f"A(A({t[1]}))", f"A({t[2]})"), f"A({t[3]})")
    assert (w2.carried, w2.paragraphs, w2.emitted, w2.carry) == (
        f"A({t[3]})", (t[4],), (f"A(A({t[3]}))", f"A({t[4]})"), None)
    # every paragraph once, in order, none duplicated by the carry-over (Algorithm 2 as printed fails both)
    assert doc.stage("aa").split("\n\n") == [f"A({t[0]})", f"A(A({t[1]}))", f"A({t[2]})", f"A(A({t[3]}))",
                                             f"A({t[4]})"]
    windows = {a.call.unit: dict(a.call.inputs) for a in team.attempts if a.call.role.startswith("article_")}
    assert windows["w0"] == {"guidelines": "G", "paragraphs": f"{t[0]}\n\n{t[1]}"}
    assert windows["w1"] == {"paragraphs": f"A({t[1]})\n\n{t[2]}\n\n{t[3]}"}
    assert doc.outline is None  # no logic analyst without direct reconstruction


def test_short_document_gets_one_window_and_chunk_size_is_a_knob():
    doc, _ = run(PlanConfig(reconstruction="iterative"), paras=["P1", "P2"])
    assert len(doc.windows) == 1 and doc.windows[0].carry is None
    assert doc.stage("aa") == "A(ti(ma(rev(cs(P1)))))\n\nA(ti(ma(rev(cs(P2)))))"
    doc, _ = run(PlanConfig(reconstruction="iterative", chunk_size=3, supervisor="off"))
    assert [(w.carried is not None, len(w.paragraphs)) for w in doc.windows] == [(False, 3), (True, 2)]


def test_all_four_configurations_share_calls_by_key():
    team, outcomes = FakeTeam(), {}
    runs = run_schedules({n: plan_document(ARTICLE, PARAS, c) for n, c in configurations().items()}, team,
                         outcomes=outcomes)
    # distinct: PD, ALA, 5 x (CS, SS, CS'), PL 5 x (MA, TI), SYNC 5 x (MA, TI, CI), 2 direct AA, 2 x 3 windows, 4 PF
    assert len(outcomes) == 2 + 15 + 10 + 15 + 2 + 6 + 4 == 54
    assert len(team.attempts) == 54  # each distinct call made once
    assert sum(len(r.calls) for r in runs.values()) == 29 + 30 + 34 + 35

    def keys(name, role):
        return [c.key for c, _ in runs[name].calls if c.role == role]

    for role in ("project_director", "content_simplifier", "simplify_supervisor", "content_simplifier_revise"):
        assert keys("pl_direct", role) == keys("pl_iterative", role) == keys("sync_direct", role) == \
            keys("sync_iterative", role)
    assert keys("pl_direct", "terminology_interpreter") == keys("pl_iterative", "terminology_interpreter")
    assert keys("sync_direct", "content_integrator") == keys("sync_iterative", "content_integrator")
    assert not set(keys("pl_direct", "metaphorical_analyst")) & set(keys("sync_direct", "metaphorical_analyst"))
    assert runs["pl_iterative"].final == run(configurations()["pl_iterative"])[0].final


def test_key_is_role_and_inputs_only():
    a = RoleCall("content_simplifier", (("guidelines", "G"), ("paragraph", "P")), RoleValue("P"), "p0")
    b = RoleCall("content_simplifier", (("paragraph", "P"), ("guidelines", "G")), RoleValue("x"), "p7")
    c = RoleCall("content_simplifier", (("guidelines", "G"), ("paragraph", "Q")), RoleValue("Q"), "p0")
    d = RoleCall("metaphorical_analyst", (("guidelines", "G"), ("paragraph", "P")), RoleValue("P"), "p0")
    assert a.key == b.key and len({a.key, c.key, d.key}) == 3
    assert len(resolve_calls([a, b], FakeTeam(), 2)) == 1


def test_invalid_json_is_retried_then_falls_back_to_the_stage_input():
    team = FakeTeam(bad={("terminology_interpreter", "p2"): 99, ("content_simplifier", "p1"): 1})
    doc, _ = run(configurations()["pl_direct"], team, max_retries=2)
    outcomes = {(c.role, c.unit): o for c, o in doc.calls}
    ti = outcomes[("terminology_interpreter", "p2")]
    assert (ti.attempts, ti.fell_back, ti.errors) == (3, True, ("no_json",) * 3)
    assert ti.raws == ("Sure! Here is the simplified paragraph, without any JSON.",) * 3
    # the fallback is TI's input: the paragraph goes on as the metaphorical analyst left it, nothing dropped
    assert doc.paragraphs[2].final == "ma(rev(cs(P3)))"
    cs = outcomes[("content_simplifier", "p1")]
    assert (cs.attempts, cs.fell_back, cs.errors, cs.value.text) == (2, False, ("no_json",), "cs(P2)")
    # retries go out in later batches with their attempt number; the plan waits for them
    tis = [b for b in team.batches if any(r == "terminology_interpreter" for r, _, _ in b)]
    assert [b for b in tis[1:]] == [[("terminology_interpreter", "p2", 1)], [("terminology_interpreter", "p2", 2)]]
    assert (ti.prompt_tokens, ti.completion_tokens, ti.seconds) == (300, 30, 1.5)


def test_zero_retries_falls_back_at_once():
    doc, _ = run(configurations()["sync_direct"], FakeTeam(bad={("content_integrator", "p0"): 1}), max_retries=0)
    # a free-text role fails only with an empty answer; the integrator falls back to the basic (CS) version
    assert doc.paragraphs[0].final == "rev(cs(P1))"
    outcome = next(o for c, o in doc.calls if c.role == "content_integrator")
    assert (outcome.attempts, outcome.fell_back, outcome.errors) == (1, True, ("empty",))


def test_metaphor_none_passes_the_input_through():
    pl, _ = run(configurations()["pl_direct"], FakeTeam(ma_none=True))
    assert pl.paragraphs[0].final == "ti(rev(cs(P1)))"
    assert dict(pl.paragraphs[0].notes)["metaphors"] is None
    sync, team = run(configurations()["sync_direct"], FakeTeam(ma_none=True))
    ci = next(dict(a.call.inputs) for a in team.attempts if a.call.role == "content_integrator")
    assert ci["metaphorical_simplification_paragraph"] == "P1"  # sync: the original paragraph
    assert sync.stage("ma").split("\n\n") == PARAS


def test_proofreader_correction_and_switches():
    doc, _ = run(configurations()["pl_direct"], FakeTeam(pf_fix=True))
    assert doc.final == f"pf({doc.stage('aa')})"
    doc, team = run(PlanConfig(proofreader=False, supervisor="off"))
    assert [s for s, _ in doc.stages] == ["cs", "ma", "ti", "aa"] and doc.final == doc.stage("aa")
    assert all(role not in ("simplify_supervisor", "proofreader") for b in team.batches for role, _, _ in b)


def test_supervisor_rounds_and_none_review():
    doc, team = run(PlanConfig(supervisor_rounds=2))
    assert doc.paragraphs[0].stages[:2] == (("cs_draft", "cs(P1)"), ("cs", "rev(rev(cs(P1)))"))
    assert sum(1 for b in team.batches for r, _, _ in b if r == "simplify_supervisor") == 10


def test_guideline_knobs():
    _, team = run(PlanConfig(paragraph_guideline="generic", reconstruction="iterative", window_guideline="none"))
    roles = [r for b in team.batches for r, _, _ in b]
    assert "project_director" not in roles and "article_architect_iterative_guided" not in roles
    generic = PlanConfig().generic_guideline
    assert all(dict(a.call.inputs)["guidelines"] == generic for a in team.attempts if a.call.role != "proofreader"
               and "guidelines" in dict(a.call.inputs))
    _, team = run(PlanConfig(reconstruction="iterative", window_guideline="all"))
    assert [r for b in team.batches for r, _, _ in b if r.startswith("article_")] == \
        ["article_architect_iterative_guided"] * 3


def test_window_keep_count_rejects_other_paragraph_counts():
    config = PlanConfig(reconstruction="iterative", window_keep_count=True, supervisor="off")
    doc, _ = run(config)
    assert [c.expect_paragraphs for c, _ in doc.calls if c.role.startswith("article_")] == [2, 3, 2]


def test_every_call_renders_with_its_template():
    book = load_role_book()
    team = FakeTeam()
    run_schedules({n: plan_document(ARTICLE, PARAS, c) for n, c in configurations().items()}, team)
    for attempt in team.attempts:
        messages = book.messages(attempt.call.role, attempt.call.inputs)
        assert messages[-1]["role"] == "user"
        assert all(value in messages[-1]["content"] for _, value in attempt.call.inputs)


def test_bad_configs_and_inputs_are_named():
    with pytest.raises(ValueError, match=r"agentsimp.chunk_size: must be an integer >= 1"):
        PlanConfig(chunk_size=0).check("agentsimp")
    with pytest.raises(ValueError, match=r"agentsimp.communication: 'star'"):
        next(plan_document("a", ["a"], PlanConfig(communication="star")))
    with pytest.raises(ValueError, match="at least one paragraph"):
        next(plan_document("a", [], PlanConfig()))
    schedule = plan_document(ARTICLE, PARAS, PlanConfig())
    next(schedule)
    with pytest.raises(KeyError, match="no outcome sent for project_director"):
        schedule.send({})


def test_attempt_sampling_and_json_record():
    call = RoleCall("content_integrator", (("guidelines", "G"),), RoleValue("x"))
    first = attempt_sampling(Attempt(call, 0), 256)
    assert first == {"temperature": 0.6, "seed": 0, "max_tokens": 256, "grammar": ""}  # free text: no grammar
    cs = RoleCall("content_simplifier", (("guidelines", "G"), ("paragraph", "P")), RoleValue("P"))
    assert attempt_sampling(Attempt(cs, 2), {"content_simplifier": 200}, seed=10, constrained=False) == {
        "temperature": 0.7, "seed": 12, "max_tokens": 200, "grammar": ""}
    assert attempt_sampling(Attempt(cs, 0), 200)["grammar"].startswith('start: "{" f0 "}"')
    doc, _ = run(configurations()["sync_iterative"], FakeTeam(bad={("content_simplifier", "p0"): 1}))
    record = json.loads(json.dumps(run_record(doc)))
    assert (record["config"], record["label"], record["settings"]["chunk_size"]) == ("sync_iterative", "SYNC†", 2)
    assert record["final"] == doc.final and list(record["stages"]) == ["cs_draft", "cs", "ma", "ti", "ci", "aa", "pf"]
    assert record["paragraphs"][0]["stages"]["ci"] == "ci(rev(cs(P1)))"
    assert [w["carry"] for w in record["windows"]] == [doc.windows[0].carry, doc.windows[1].carry, None]
    first_cs = next(c for c in record["calls"] if c["role"] == "content_simplifier")
    assert (first_cs["unit"], first_cs["attempts"], first_cs["errors"], first_cs["step"]) == (
        "p0", 2, ["no_json"], "initial")
    assert len(record["calls"]) == 35


def test_iterative_carry_is_one_paragraph_when_the_architect_uses_single_newlines():
    class SingleNewlines(FakeTeam):
        def reply(self, attempt):
            reply = super().reply(attempt)
            if attempt.call.role.startswith("article_architect_iterative"):
                return type(reply)(reply.text.replace("\n\n", "\n"))
            return reply

    doc, _ = run(PlanConfig(reconstruction="iterative", supervisor="off", proofreader=False), SingleNewlines())
    # each window carries only its last paragraph on: the windows do not grow with the document
    assert [len(w.paragraphs) + (w.carried is not None) for w in doc.windows] == [2, 3, 2]
    assert [w.carry for w in doc.windows] == ["A(ti(ma(cs(P2))))", "A(ti(ma(cs(P4))))", None]
    assert doc.final.count("\n\n") == 4
