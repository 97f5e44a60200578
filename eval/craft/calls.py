"""Planner-written CRAFT tool calls: find them in a ``###TOOLS:`` section, parse them safely, canonicalise them.

The planner writes calls such as ``word_count_check(300, "less than")`` as text; the authors' code runs
them with ``eval``. Here a call is parsed with ``ast.parse(mode="eval")`` and accepted only if it is one
call of a whitelisted tool name (``TOOLS``) whose arguments are literals (``ast.literal_eval`` on each
argument node) of the right type. Nothing is ever executed or looked up by name: ``os.system("x")``,
``word_count_check(__import__("os"))``, ``text.split()`` and ``len(x)`` arguments are all rejected as
data. A rejected call is a :class:`CallError` whose ``message`` is feedback for the planner; parsing never
raises.

Accepted variants (all seen in the planners' outputs stored with CORD): single or double quotes, keyword
arguments by the E.2 parameter names (``count=5, relation="more than"``), a digit string for a count
(the reference ``int()``s it), one sentence id as an int instead of a list, the E.2 header's alias
``sentence_check`` for ``sentence_modification_check``, and relation spellings in ``RELATION_ALIASES``
(case, underscores and extra spaces are ignored). The canonical form (:attr:`ToolCall.text`) is the CORD
gold format: double quotes, ``", "`` separators, sentence ids as a sorted list without duplicates; it
is what tool-usage F1 compares.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import dataclass

COMPARISONS = ("less than", "more than", "equal")
KEEP_REMOVE = ("keep", "remove")
CHANGE_UNCHANGE = ("change", "unchange")
RELATION_ALIASES = {"greater than": "more than", "fewer than": "less than", "equals": "equal", "equal to": "equal",
                    "exactly": "equal", "unchanged": "unchange", "changed": "change", "kept": "keep",
                    "removed": "remove"}


@dataclass(frozen=True)
class Param:
    """One tool parameter: its E.2 name and kind (``count``, ``keyword``, ``ids`` or ``relation``)."""

    name: str
    kind: str
    relations: tuple[str, ...] = ()


def _relation(allowed: tuple[str, ...]) -> Param:
    return Param("relation", "relation", allowed)


# The 8 tools of App. E.2, in its order. text_eval and detect_keyword are model-backed (the caller fills them).
TOOLS: dict[str, tuple[Param, ...]] = {
    "text_eval": (),
    "detect_keyword": (),
    "word_count_check": (Param("count", "count"), _relation(COMPARISONS)),
    "keyword_keep_removal_check": (Param("keyword", "keyword"), _relation(KEEP_REMOVE)),
    "keyword_frequency_check": (Param("keyword", "keyword"), Param("frequency", "count"), _relation(COMPARISONS)),
    "sentence_modification_check": (Param("sentence_id", "ids"), _relation(CHANGE_UNCHANGE)),
    "sentence_count_check": (Param("count", "count"), _relation(COMPARISONS)),
    "sentence_length_check": (Param("length", "count"), _relation(COMPARISONS)),
}
MODEL_BACKED = ("text_eval", "detect_keyword")
NAME_ALIASES = {"sentence_check": "sentence_modification_check"}
# A planner's call is a line of code; anything longer is not one, and a size cap bounds the parser's work.
MAX_CALL_CHARS = 2000


@dataclass(frozen=True)
class ToolCall:
    """A parsed, validated call. ``args`` are normalised: ints, the keyword, a tuple of ids, a relation."""

    name: str
    args: tuple

    @property
    def text(self) -> str:
        """The canonical call string, e.g. ``sentence_modification_check([3, 9], "unchange")``."""
        return f"{self.name}({', '.join(_render(value) for value in self.args)})"

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class CallError:
    """A call that was not accepted. ``kind`` is a short code; ``message`` is feedback for the planner.

    Kinds: ``empty``, ``too_long``, ``syntax``, ``not_a_call``, ``not_a_tool_name`` (an attribute or other
    callee), ``unknown_tool``, ``arity``, ``not_literal``, ``type``, ``value``, ``relation``.
    """

    call: str
    kind: str
    message: str
    # a malformed call counts as a failed check wherever results are scored
    satisfied: bool = False


def _render(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string literal is a valid Python literal
    return str(value)


def signature(name: str) -> str:
    """The tool's E.2 signature, for messages: ``word_count_check(count: int, relation: str)``."""
    kinds = {"count": "int", "keyword": "str", "ids": "list", "relation": "str"}
    return f"{name}({', '.join(f'{p.name}: {kinds[p.kind]}' for p in TOOLS[name])})"


def parse_call(text: str) -> ToolCall | CallError:
    """Parse one call string; never executes anything and never raises on bad input.

    >>> parse_call("sentence_check(3, 'Unchanged')").text
    'sentence_modification_check([3], "unchange")'
    >>> parse_call('os.system("rm -rf /")').kind
    'not_a_tool_name'
    """
    source = text.strip() if isinstance(text, str) else ""
    if not source:
        return CallError(str(text), "empty", "An empty tool call was given; write one call per line.")
    if len(source) > MAX_CALL_CHARS:
        return CallError(source, "too_long", f"The tool call is longer than {MAX_CALL_CHARS} characters.")
    try:
        node = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        detail = err.msg if isinstance(err, SyntaxError) else type(err).__name__
        return CallError(source, "syntax", f"The tool call `{source}` is not valid call syntax ({detail}); "
                                           'write it like word_count_check(300, "less than").')
    if not isinstance(node, ast.Call):
        return CallError(source, "not_a_call", f"`{source}` is not a tool call; write name(arguments).")
    if not isinstance(node.func, ast.Name):
        return CallError(source, "not_a_tool_name",
                         f"`{source}` does not call a tool by name; only the listed tools can be called.")
    name = NAME_ALIASES.get(node.func.id, node.func.id)
    if name not in TOOLS:
        close = difflib.get_close_matches(name, TOOLS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        return CallError(source, "unknown_tool", f"`{name}` is not one of the available tools.{hint}")
    bound = _bind(source, name, node)
    if isinstance(bound, CallError):
        return bound
    values = []
    for param, arg in zip(TOOLS[name], bound):
        value = _literal(source, param, arg)
        if isinstance(value, CallError):
            return value
        value = _convert(source, name, param, value)
        if isinstance(value, CallError):
            return value
        values.append(value)
    return ToolCall(name, tuple(values))


def _bind(source: str, name: str, node: ast.Call) -> list[ast.expr] | CallError:
    """Match positional and keyword argument nodes to the tool's parameters, as Python would."""
    params = TOOLS[name]
    usage = f"{name} takes {len(params)} argument(s): {signature(name)}."

    def arity(detail: str) -> CallError:
        return CallError(source, "arity", f"`{source}`: {detail} {usage}")

    if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
        return CallError(source, "not_literal", f"`{source}`: arguments must be literal values. {usage}")
    if len(node.args) > len(params):
        return arity(f"{len(node.args)} positional arguments given.")
    slots: list[ast.expr | None] = list(node.args) + [None] * (len(params) - len(node.args))
    names = [p.name for p in params]
    for keyword in node.keywords:
        if keyword.arg not in names:
            return arity(f"unknown argument name `{keyword.arg}`.")
        index = names.index(keyword.arg)
        if slots[index] is not None:
            return arity(f"argument `{keyword.arg}` given twice.")
        slots[index] = keyword.value
    missing = [n for n, slot in zip(names, slots) if slot is None]
    if missing:
        return arity(f"missing {', '.join(missing)}.")
    return slots


def _literal(source: str, param: Param, node: ast.expr):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return CallError(source, "not_literal", f"`{source}`: `{param.name}` must be a literal value "
                                                f"(a number, a quoted string or a list of numbers), not code.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _convert(source: str, name: str, param: Param, value):
    """Check one literal against its parameter kind; return the normalised value or a CallError."""

    def bad(kind: str, detail: str) -> CallError:
        return CallError(source, kind, f"`{source}`: {detail} ({signature(name)}).")

    if param.kind == "count":
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())  # the reference int()s counts, so "20" is accepted
        if not _is_int(value):
            return bad("type", f"`{param.name}` must be a whole number, got {value!r}")
        if value < 0:
            return bad("value", f"`{param.name}` cannot be negative")
        return value
    if param.kind == "keyword":
        if not isinstance(value, str):
            return bad("type", f"`{param.name}` must be a quoted string, got {value!r}")
        if not value.strip():
            return bad("value", f"`{param.name}` cannot be empty")
        return value
    if param.kind == "ids":
        ids = [value] if _is_int(value) else value
        if not isinstance(ids, (list, tuple)) or not all(_is_int(i) for i in ids):
            return bad("type", f"`{param.name}` must be a list of sentence numbers, got {value!r}")
        if not ids:
            return bad("value", f"`{param.name}` must list at least one sentence")
        if min(ids) < 1:
            return bad("value", "sentence numbers start at 1")
        return tuple(sorted(set(ids)))
    if not isinstance(value, str):
        return bad("type", f"`relation` must be a quoted string, got {value!r}")
    relation = " ".join(value.replace("_", " ").lower().split())
    relation = RELATION_ALIASES.get(relation, relation)
    if relation not in param.relations:
        allowed = ", ".join(f'"{r}"' for r in param.relations)
        return bad("relation", f"relation {value!r} is not one of {allowed}")
    return relation


def canonical(call: str | ToolCall) -> str:
    """The canonical text of a call; a call that does not parse keeps its own text, whitespace collapsed."""
    parsed = call if isinstance(call, ToolCall) else parse_call(call)
    return parsed.text if isinstance(parsed, ToolCall) else " ".join(str(call).split())


# a callee name (dotted names too, so that `os.system(...)` is found and then rejected) right before "("
_CALL_START = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(")
# a code comment outside any call: "#" alone between whitespace ("###TOOLS:" is not one)
_COMMENT = re.compile(r"(?:^|(?<=\s))#(?=\s|$)")


def extract_calls(text: str) -> list[str]:
    """Every ``name(...)`` in a ``###TOOLS:`` section, in order, as written.

    Calls are code lines, so a call ends on its line: markdown, bullets, backticks, commas, ``;``,
    ``tool1 = `` prefixes and ``# comments`` around calls are skipped, a call nested in another's
    arguments stays part of it, and an unclosed call is returned up to the end of its line (it then fails
    to parse, as it should).

    >>> extract_calls('- `text_eval()`, **word_count_check(300, "less than")**; x = len(s)')
    ['text_eval()', 'word_count_check(300, "less than")', 'len(s)']
    """
    calls = []
    for line in text.splitlines():
        position = 0
        while match := _CALL_START.search(line, position):
            comment = _COMMENT.search(line, position)
            if comment and comment.start() < match.start():
                break  # the rest of the line is a comment (a "#" inside a call's string is not looked at)
            end = closing_paren(line, match.end())
            if end is None:
                calls.append(line[match.start():].strip())
                break
            calls.append(line[match.start():end])
            position = end
    return calls


def closing_paren(line: str, start: int) -> int | None:
    """Index just past the ``)`` closing the ``(`` before ``start``, skipping quoted strings; None if unclosed."""
    depth, quote, index = 1, "", start
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return None


def template_type(call: ToolCall) -> str:
    """The Table 14 sub-group a checker call verifies (``keep_sentence`` ... ``keyword_frequency``)."""
    relation = call.args[-1] if call.args else ""
    if call.name == "sentence_modification_check":
        return "keep_sentence" if relation == "unchange" else "modify_sentence"
    if call.name == "keyword_keep_removal_check":
        return "include_keyword" if relation == "keep" else "remove_keyword"
    return {"word_count_check": "word_count", "sentence_count_check": "sentence_count",
            "sentence_length_check": "per_sentence_length", "keyword_frequency_check": "keyword_frequency",
            }.get(call.name, call.name)
