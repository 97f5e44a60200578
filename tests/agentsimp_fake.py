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
import re

from eval.agentsimp.outputs import Reply
from eval.agentsimp.parse import role_fields
from eval.agentsimp.roles import ROLE_IDS, join_paragraphs, load_role_book, split_paragraphs

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
    if role.startswith("baseline_template_"):
        return f"llm{role[-1]}({inputs['raw_text']})"
    raise AssertionError(f"unexpected role {role}")


class FakeTeam:
    """A `complete` function (eval.agentsimp.run) that records every batch as (role, unit, attempt) triples."""

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


# ----------------------------------------------------------------------------- the same team behind an HTTP API


def _role_patterns() -> list[tuple[str, re.Pattern]]:
    """(role, regex) per role: its template rendered with every variable as a named group (repeats backreferenced)."""
    book = load_role_book()
    patterns = []
    for role in ROLE_IDS:
        template = book.template(role)
        marks = {v: f"\x00{v}\x00" for v in template.variables}
        text = _SEP.join(m["content"] for m in template.render(**marks))
        seen: set[str] = set()
        regex = ""
        for piece in re.split("(\x00[a-z_]+\x00)", text):
            name = piece.strip("\x00")
            if piece.startswith("\x00") and name in marks:
                regex += f"(?P={name})" if name in seen else f"(?P<{name}>.*?)"
                seen.add(name)
            else:
                regex += re.escape(piece)
        patterns.append((role, re.compile(regex, re.DOTALL)))
    return patterns


_SEP = "\n\x01\n"


class ServerTeam:
    """`reply_body` for tests/fake_openai_server.py: tells the role and its inputs from the rendered prompt.

    `calls` records (role, inputs) in arrival order. `invalid` maps a marker to (role, times): that role answers
    prose instead of JSON (or nothing, for a free-text role) to its first `times` prompts (None = all) whose inputs
    contain the marker. A prompt of no role (a jury judge) gets `unknown`, or fails the test when it is None.
    """

    def __init__(self, invalid: dict[str, tuple[str, int | None]] | None = None, unknown: str | None = None):
        self.patterns = _role_patterns()
        self.invalid = {marker: list(spec) for marker, spec in (invalid or {}).items()}
        self.unknown = unknown
        self.calls: list[tuple[str, dict]] = []

    def identify(self, body: dict) -> tuple[str, dict]:
        text = _SEP.join(m["content"] for m in body["messages"])
        found = [(role, m.groupdict()) for role, p in self.patterns if (m := p.fullmatch(text))]
        if not found:
            raise AssertionError(f"prompt matches no role template: {text[:200]!r}")
        # a template that extends another (the simplifier's revision prompt) also matches the shorter one, with a
        # variable swallowing the extra blocks: the most specific template leaves the least text to its variables
        return min(found, key=lambda f: sum(len(v) for v in f[1].values()))

    def __call__(self, body: dict) -> str:
        if self.unknown is not None and not any(p.fullmatch(_SEP.join(m["content"] for m in body["messages"]))
                                                for _, p in self.patterns):
            return self.unknown
        role, inputs = self.identify(body)
        self.calls.append((role, inputs))
        for marker, spec in self.invalid.items():
            bad_role, times = spec
            if bad_role == role and any(marker in v for v in inputs.values()) and (times is None or times > 0):
                spec[1] = None if times is None else times - 1
                return INVALID if role_fields(role) else ""
        return answer(role, inputs)
