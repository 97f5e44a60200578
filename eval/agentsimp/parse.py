"""AgentSimp (paper 004) role answers: extract and validate each role's output, as pure data.

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

Retrying or falling back when an answer fails here is `eval.agentsimp.outputs`.

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import jsonschema

from eval.agentsimp.roles import render_outline, role_spec, split_paragraphs
from eval.answers import Parsed, split_think

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
        role: A role id (eval.agentsimp.roles).
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
