"""AgentSimp (paper 004) role outputs: extract, validate, and retry-or-fall-back, as pure data.

Each role answers in the format its prompt asks for (configs/prompts/agentsimp_*.yaml):

===================================  ==========================================================  =================
role id                              answer                                                      value.text
===================================  ==========================================================  =================
project_director                     free text: the seven-aspect guideline                       the guideline
article_logic_analyst                ``{"title": str, "subheadings": [str, ...]}``               outline as JSON
content_simplifier(_revise)          ``{"simplified result": str}``                              the paragraph
simplify_supervisor                  ``{"suggestions": str | "None"}``                           None for "None"
metaphorical_analyst                 ``{"analyzed result": str|"None", "simplified result": …}``  None for "None"
terminology_interpreter              ``{"terminology": [str, ...], "parsed result": str}``       the paragraph
content_integrator                   free text after "Fusion Simplification:"                    the paragraph
article_architect_*                  free text, paragraphs separated by blank lines              the text
proofreader                          ``{"mistakes": str|"None", "corrected article": str|…}``    None for "None"
===================================  ==========================================================  =================

**Extraction is tolerant**: reasoning (``<think>``) is dropped, a fenced ```json block or the first decodable
``{...}`` anywhere in the answer is taken (leading prose is fine), an object whose outer braces are missing (as the
paper prints its output specs) is re-wrapped, and the paper's malformed Fig. 16 list ``[{"a", "b"}]`` is read as
``["a", "b"]``. A free-text answer loses a leading echo of its prompt's last line ("Fusion Simplification:").
**Validation is strict**: the object must match the role's JSON schema (`role_schema`: exactly the keys, strings
with a non-space character, lists of such strings; "None" or null only where the role may decline).

**"None" findings** (the metaphorical analyst's Fig. 13 and the proofreader's prompts, §3.2.4 "If no issues are
found, no changes are applied"): when the analysis (``"analyzed result"``) or the mistakes (``"mistakes"``) are
"None", the role changes nothing (value.text None: the plan keeps its input), whatever text the answer carries in
its other field; a "None" text with a finding also keeps the input.

**Retries** (`decide`, `settle`): an answer that fails extraction or validation, or an engine error, is retried
up to `max_retries` times (new seed, `retry_sampling`); then the stage *falls back* to the value given by the plan
(the stage's input, e.g. the unsimplified paragraph), and the `RoleOutcome` records every raw answer, every error
and `fell_back=True`. Nothing raises on model output, and nothing is dropped.

**Guards** (`guard_error`): two answers fall back to the stage's input at once, without a retry (a retry under the
same budget is cut again), recorded in `RoleOutcome.guard`:

- ``truncated``: the engine stopped at the token limit (``finish_reason == "length"``, any role), or a JSON answer
  decoded under its grammar used at least its main field's token share (`Reply.budget`, from
  `eval.agentsimp_grammar.main_field_tokens`): the grammar closes a string when its share runs out, so a cut
  article still parses, and that is the only trace it leaves.
- ``collapsed``: a call with ``min_ratio`` > 0 (the architect and the proofreader: document-level rewrites that
  must not shorten the article) answered with fewer than ``min_ratio`` × the words of its input, or with one
  sentence where its input had three or more (`collapsed`).

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import jsonschema

from eval.agentsimp_roles import render_outline, role_spec, split_paragraphs
from eval.judge_parse import Parsed, split_think
from eval.textnorm import count_punkt_sentences

ACCEPT, RETRY, FALL_BACK = "accept", "retry", "fallback"
TRUNCATED, COLLAPSED = "truncated", "collapsed"
GUARDS = (TRUNCATED, COLLAPSED)
# retries draw a new sample; a greedy retry would repeat itself, so they run at least this hot (as the juries do)
RETRY_MIN_TEMPERATURE = 0.7

# (key, kind, may_decline): kind "text" is a string, "list" a list of strings; a declining role may answer "None"
_FIELDS = {
    "article_logic_analyst": (("title", "text", False), ("subheadings", "list", False)),
    "content_simplifier": (("simplified result", "text", False),),
    "content_simplifier_revise": (("simplified result", "text", False),),
    "simplify_supervisor": (("suggestions", "text", True),),
    "metaphorical_analyst": (("analyzed result", "text", True), ("simplified result", "text", True)),
    "terminology_interpreter": (("terminology", "list", False), ("parsed result", "text", False)),
    "proofreader": (("mistakes", "text", True), ("corrected article", "text", True)),
}
# the echo of a free-text prompt's last line that a model may repeat before its answer
_ECHOES = {
    "content_integrator": "Fusion Simplification:",
    "article_architect_direct": "The combined well-structured article:",
    "article_architect_iterative": "The combined well-structured article:",
    "article_architect_iterative_guided": "The combined well-structured article:",
}
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)```", re.DOTALL)
_SET_LIST = re.compile(r'\[\s*\{((?:\s*"(?:[^"\\]|\\.)*"\s*,?)*)\s*\}\s*\]')
_NON_SPACE = r"\S"


@dataclass(frozen=True)
class RoleValue:
    """A role's parsed answer.

    Attributes:
        text: What the role hands on (guideline, paragraph, article, suggestions; the outline as JSON). None when
            the role answered "None" (metaphorical analyst, supervisor, proofreader): the plan keeps its input.
        note: The metaphorical analyst's analysis or the proofreader's mistakes (None for "None").
        items: The terminology interpreter's terms or the outline's subheadings.
        title: The outline's title.
    """

    text: str | None
    note: str | None = None
    items: tuple[str, ...] = ()
    title: str = ""

    def text_or(self, default: str) -> str:
        return default if self.text is None else self.text


@dataclass(frozen=True)
class Reply:
    """One engine answer to one attempt (the fields of `actors.engine.Completion` the plan needs, plus timing)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"
    error: str = ""
    cached: bool = False
    # the main JSON field's token share under the role's grammar (0: decoded freely or a free-text role)
    budget: int = 0


@dataclass(frozen=True)
class RoleOutcome:
    """The settled result of one role call: its value and the history behind it.

    Attributes:
        value: The accepted value, or the fallback when every attempt failed.
        attempts: Engine answers used (1 + retries).
        errors: One error code per failed attempt, in order ("" never appears).
        fell_back: True when `value` is the fallback, not a model answer.
        raws: The raw text of every attempt, in order.
        prompt_tokens, completion_tokens, seconds, cached: Summed over attempts (cached = attempts served from
            the request cache).
        guard: "truncated" or "collapsed" when a guard made the call fall back (module docstring), else "".
    """

    value: RoleValue
    attempts: int
    errors: tuple[str, ...] = ()
    fell_back: bool = False
    raws: tuple[str, ...] = field(default=(), repr=False)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached: int = 0
    guard: str = ""


# ----------------------------------------------------------------------------- schemas


def role_fields(role: str) -> tuple[tuple[str, str, bool], ...]:
    """(key, kind, may_decline) of a JSON role's answer, in the order its prompt shows them; () for free text."""
    role_spec(role)
    return _FIELDS.get(role, ())


def role_schema(role: str) -> dict | None:
    """The JSON schema of a role's answer (None for a free-text role).

    >>> role_schema("content_simplifier")["required"]
    ['simplified result']
    """
    fields = role_fields(role)
    if not fields:
        return None
    text = {"type": "string", "pattern": _NON_SPACE}
    properties = {}
    for key, kind, may_decline in fields:
        schema = {"type": "array", "items": text} if kind == "list" else dict(text)
        if may_decline:
            schema = {"anyOf": [schema, {"type": "null"}]}
        properties[key] = schema
    return {"type": "object", "properties": properties, "required": [k for k, _, _ in fields],
            "additionalProperties": False}


# ----------------------------------------------------------------------------- extraction and validation


def extract_json_object(text: str) -> tuple[dict | None, str]:
    """The JSON object in a model answer, or None and an error code ("empty", "no_json", "unterminated_think").

    >>> extract_json_object('Sure! ```json\\n{"a": "b"}\\n``` Hope it helps.')
    ({'a': 'b'}, '')
    >>> extract_json_object('"simplified result": "Cats sleep."')
    ({'simplified result': 'Cats sleep.'}, '')
    """
    if text is None or not text.strip():
        return None, "empty"
    answer, unterminated = split_think(text)
    candidates = [m.group(1) for m in _FENCE.finditer(answer)] + [answer]
    for candidate in candidates:
        for attempt in (candidate, _SET_LIST.sub(r"[\1]", candidate)):
            found = _first_object(attempt)
            if found is not None:
                return found, ""
    bare = answer.strip().rstrip(",")
    if bare.startswith('"'):
        found = _first_object("{" + _SET_LIST.sub(r"[\1]", bare) + "}")
        if found is not None:
            return found, ""
    return None, "unterminated_think" if unterminated else "no_json"


def _first_object(text: str) -> dict | None:
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def schema_error(role: str, obj: object) -> str:
    """"" when `obj` matches the role's schema, else "schema: <first problem, with its path>"."""
    errors = sorted(jsonschema.Draft202012Validator(role_schema(role)).iter_errors(obj), key=lambda e: list(e.path))
    if not errors:
        return ""
    where = "/".join(str(p) for p in errors[0].path)
    return f"schema: {where + ': ' if where else ''}{errors[0].message}"


def is_none(value: str | None) -> bool:
    """True for JSON null or a "None" answer (case, quotes and a final period ignored).

    >>> [is_none(v) for v in (None, "None", " none. ", "'None'", "Nonetheless.")]
    [True, True, True, True, False]
    """
    return value is None or value.strip().strip("'\"").rstrip(".").strip().lower() == "none"


def parse_output(role: str, text: str | None, expect_paragraphs: int = 0) -> Parsed:
    """Parse one answer of `role`: `Parsed(RoleValue)` or `Parsed(None, error)`; the raw text is kept.

    Args:
        role: A role id (eval.agentsimp_roles).
        text: The model's answer.
        expect_paragraphs: For the iterative architect, the number of paragraphs its answer must have
            (0 = any number >= 1).

    >>> parse_output("metaphorical_analyst", '{"analyzed result": "None", "simplified result": "None"}').value
    RoleValue(text=None, note=None, items=(), title='')
    >>> parse_output("content_simplifier", '{"simplified": "x"}').error
    "schema: 'simplified result' is a required property"
    """
    if role_fields(role):
        obj, error = extract_json_object(text or "")
        if obj is None:
            return Parsed(None, error, text)
        error = schema_error(role, obj)
        return Parsed(None, error, text) if error else Parsed(_json_value(role, obj), "", text)
    return _parse_text(role, text, expect_paragraphs)


def _json_value(role: str, obj: dict) -> RoleValue:
    def declined(key: str) -> str | None:
        return None if is_none(obj[key]) else obj[key].strip()

    if role == "article_logic_analyst":
        subheadings = tuple(s.strip() for s in obj["subheadings"])
        return RoleValue(render_outline(obj["title"].strip(), subheadings), items=subheadings,
                         title=obj["title"].strip())
    if role in ("content_simplifier", "content_simplifier_revise"):
        return RoleValue(obj["simplified result"].strip())
    if role == "simplify_supervisor":
        return RoleValue(declined("suggestions"))
    if role in ("metaphorical_analyst", "proofreader"):
        # a "None" finding changes nothing, whatever the text field says (module docstring)
        finding, text = ("analyzed result", "simplified result") if role == "metaphorical_analyst" else (
            "mistakes", "corrected article")
        note = declined(finding)
        return RoleValue(None if note is None else declined(text), note=note)
    return RoleValue(obj["parsed result"].strip(), items=tuple(t.strip() for t in obj["terminology"]))


def _parse_text(role: str, text: str | None, expect_paragraphs: int) -> Parsed:
    if text is None or not text.strip():
        return Parsed(None, "empty", text)
    answer, unterminated = split_think(text)
    answer = answer.strip()
    fenced = _FENCE.fullmatch(answer)
    if fenced:
        answer = fenced.group(1).strip()
    echo = _ECHOES.get(role)
    if echo and answer.lower().startswith(echo.lower()):
        answer = answer[len(echo):].strip()
    if not answer:
        return Parsed(None, "unterminated_think" if unterminated else "empty", text)
    if expect_paragraphs and len(split_paragraphs(answer)) != expect_paragraphs:
        return Parsed(None, f"paragraphs: {len(split_paragraphs(answer))} instead of {expect_paragraphs}", text)
    return Parsed(RoleValue(answer), "", text)


# ----------------------------------------------------------------------------- retry policy


def decide(errors: Sequence[str], max_retries: int) -> str:
    """What to do after the attempts so far, given one error per attempt ("" = that attempt parsed).

    ACCEPT when the last attempt parsed; RETRY while there were at most `max_retries` failures (so at most
    1 + max_retries attempts in all; no attempt yet also means RETRY, i.e. make the first); FALL_BACK otherwise.

    A guard error (truncated, collapsed) falls back at once.

    >>> [decide(h, 1) for h in ([], ["no_json"], ["no_json", ""], ["no_json", "empty"], ["truncated: length"])]
    ['retry', 'retry', 'accept', 'fallback', 'fallback']
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if errors and not errors[-1]:
        return ACCEPT
    if errors and errors[-1].split(":")[0] in GUARDS:
        return FALL_BACK
    return RETRY if len(errors) <= max_retries else FALL_BACK


def _words(text: str) -> int:
    return len(text.split())


def collapsed(source: str, output: str, min_ratio: float) -> str:
    """Why `output` is a collapsed rewrite of `source` (module docstring), or "" when it is not.

    >>> collapsed("One cat. Two cats sat. Three cats ran off.", "Cats.", 0.5)
    'collapsed: 1 of 9 words'
    >>> collapsed("One cat. Two cats sat. Three cats ran off.", "One cat sat and two more cats ran off fast", 0.5)
    'collapsed: 1 sentence from 3'
    >>> collapsed("One cat. Two cats sat.", "A cat. Two cats sat down.", 0.5)
    ''
    """
    have, had = _words(output), _words(source)
    if have < min_ratio * had:
        return f"{COLLAPSED}: {have} of {had} words"
    before = count_punkt_sentences(source)
    if before >= 3 and count_punkt_sentences(output) <= 1:
        return f"{COLLAPSED}: 1 sentence from {before}"
    return ""


def guard_error(reply: Reply, value: RoleValue | None, fallback: RoleValue, min_ratio: float = 0.0) -> str:
    """The guard a parsed reply trips (module docstring): "truncated: ...", "collapsed: ..." or ""."""
    if reply.finish_reason == "length":
        return f"{TRUNCATED}: finish_reason length after {reply.completion_tokens} tokens"
    if reply.budget and reply.completion_tokens >= reply.budget:
        return f"{TRUNCATED}: {reply.completion_tokens} tokens reached the main field's budget of {reply.budget}"
    if min_ratio > 0 and value is not None and value.text is not None and fallback.text:
        return collapsed(fallback.text, value.text, min_ratio)
    return ""


def reply_error(role: str, reply: Reply, expect_paragraphs: int = 0, fallback: RoleValue | None = None,
                min_ratio: float = 0.0) -> tuple[RoleValue | None, str]:
    """Parse one reply: (value, "") or (None, error); an engine error is "engine: <message>", a guard's
    "truncated: ..." / "collapsed: ..." (checked when `fallback`, the stage's input, is given)."""
    if reply.error or reply.finish_reason == "error":
        return None, f"engine: {reply.error or 'error'}"
    if reply.finish_reason == "length":
        return None, guard_error(reply, None, RoleValue(None))
    parsed = parse_output(role, reply.text, expect_paragraphs)
    if parsed.value is not None and fallback is not None:
        guard = guard_error(reply, parsed.value, fallback, min_ratio)
        if guard:
            return None, guard
    return parsed.value, parsed.error


def settle(role: str, replies: Sequence[Reply], fallback: RoleValue, max_retries: int,
           expect_paragraphs: int = 0, min_ratio: float = 0.0) -> RoleOutcome | None:
    """The outcome of a call after `replies` (one per attempt, in order), or None when it needs another attempt.

    >>> bad, good = Reply("no json here"), Reply('{"simplified result": "Cats sleep."}')
    >>> settle("content_simplifier", [bad], RoleValue("Felines slumber."), 1) is None
    True
    >>> settle("content_simplifier", [bad, good], RoleValue("Felines slumber."), 1).value.text
    'Cats sleep.'
    >>> out = settle("content_simplifier", [bad, bad], RoleValue("Felines slumber."), 1)
    >>> (out.value.text, out.fell_back, out.errors)
    ('Felines slumber.', True, ('no_json', 'no_json'))
    """
    parsed = [reply_error(role, r, expect_paragraphs, fallback, min_ratio) for r in replies]
    action = decide([error for _, error in parsed], max_retries)
    if action == RETRY:
        return None
    value = parsed[-1][0] if action == ACCEPT else fallback
    last = parsed[-1][1].split(":")[0]
    return RoleOutcome(
        value=value, attempts=len(replies), errors=tuple(e for _, e in parsed if e), fell_back=action == FALL_BACK,
        raws=tuple(r.text for r in replies), prompt_tokens=sum(r.prompt_tokens for r in replies),
        completion_tokens=sum(r.completion_tokens for r in replies), seconds=sum(r.seconds for r in replies),
        cached=sum(1 for r in replies if r.cached), guard=last if action == FALL_BACK and last in GUARDS else "",
    )


def retry_sampling(temperature: float, seed: int, attempt: int) -> tuple[float, int]:
    """(temperature, seed) of attempt `attempt` (0 = the first): retries get a new seed and T >= 0.7.

    >>> retry_sampling(0.6, 11, 0), retry_sampling(0.6, 11, 2), retry_sampling(0.9, 11, 1)
    ((0.6, 11), (0.7, 13), (0.9, 12))
    """
    if attempt == 0:
        return temperature, seed
    return max(temperature, RETRY_MIN_TEMPERATURE), seed + attempt
