"""A deterministic fake AgentSimp team for tests: every role answers a function of its inputs, in its format.

Answers are readable traces: the content simplifier turns "P1" into "cs(P1)", the revision into "rev(cs(P1))", the
metaphorical analyst wraps in "ma(...)", the terminology interpreter in "ti(...)", the integrator in "ci(...)", and
the iterative architect turns each paragraph x of its window into "A(x)"; so a final text spells the path it took.
`bad` makes chosen (role, unit) calls answer badly for their first n attempts: prose instead of JSON, or nothing
for a free-text role. Every attempt
costs 100 prompt tokens, 10 completion tokens and 0.5 s, so costs can be checked by hand.
"""

from __future__ import annotations

import json

from eval.agentsimp_outputs import Reply, role_fields
from eval.agentsimp_roles import join_paragraphs, split_paragraphs

OUTLINE = {"title": "T", "subheadings": ["S1", "S2"]}
INVALID = "Sure! Here is the simplified paragraph, without any JSON."


def answer(role: str, inputs: dict, ma_none: bool = False, pf_fix: bool = False) -> str:
    """The fake's valid answer of `role` to `inputs`."""
    if role == "project_director":
        return "G"
    if role == "article_logic_analyst":
        return json.dumps(OUTLINE)
    if role == "content_simplifier":
        return json.dumps({"simplified result": f"cs({inputs['paragraph']})"})
    if role == "simplify_supervisor":
        return json.dumps({"suggestions": f"ss({inputs['simplified_paragraph']})"})
    if role == "content_simplifier_revise":
        return json.dumps({"simplified result": f"rev({inputs['simplified']})"})
    if role == "metaphorical_analyst":
        if ma_none:
            return json.dumps({"analyzed result": "None", "simplified result": "None"})
        return json.dumps({"analyzed result": "a metaphor", "simplified result": f"ma({inputs['paragraph']})"})
    if role == "terminology_interpreter":
        return json.dumps({"terminology": ["term"], "parsed result": f"ti({inputs['paragraph']})"})
    if role == "content_integrator":
        return f"Fusion Simplification: ci({inputs['basic_simplification_paragraph']})"
    if role == "article_architect_direct":
        return f"# T\n\n## S1\n\n{inputs['paragraphs']}"
    if role.startswith("article_architect_iterative"):
        return join_paragraphs([f"A({p})" for p in split_paragraphs(inputs["paragraphs"])])
    if role == "proofreader":
        if pf_fix:
            return json.dumps({"mistakes": "typo", "corrected article": f"pf({inputs['article']})"})
        return json.dumps({"mistakes": "None", "corrected article": "None"})
    raise AssertionError(f"unexpected role {role}")


class FakeTeam:
    """A `complete` function (eval.agentsimp_run) that records every batch as (role, unit, attempt) triples."""

    def __init__(self, bad: dict | None = None, ma_none: bool = False, pf_fix: bool = False):
        self.bad = dict(bad or {})
        self.ma_none = ma_none
        self.pf_fix = pf_fix
        self.batches: list[list[tuple[str, str, int]]] = []
        self.attempts = []

    def __call__(self, attempts):
        self.batches.append([(a.call.role, a.call.unit, a.number) for a in attempts])
        self.attempts.extend(attempts)
        return [self.reply(a) for a in attempts]

    def reply(self, attempt) -> Reply:
        call = attempt.call
        if attempt.number < self.bad.get((call.role, call.unit), 0):
            text = INVALID if role_fields(call.role) else ""
        else:
            text = answer(call.role, dict(call.inputs), self.ma_none, self.pf_fix)
        return Reply(text, prompt_tokens=100, completion_tokens=10, seconds=0.5)
