"""CORD (paper 002's COnstrained Revision Dataset) as typed rows: text, instruction, constraints, gold calls.

Where CORD comes from: the authors' release, github.com/nusnlp/CRAFT, ``data/test_input/`` (files
``test.agent.constraint_{0..4}.jsonl``; a directory of them is read as it is, as is one with the files renamed
``cord.constraint_{0..4}.jsonl``). The files (100 rows each; level = number of constraints) hold
per row ``id``, ``test_input`` (the whole planner prompt: framework, tool descriptions, then the user
instruction and the text), ``tool_test_result.constraint_info`` (the gold call strings) and
``other_info.constraint_info`` (one ``{prompt, constrain_type, value, function_call}`` per constraint;
absent at level 0, whose ``other_info`` instead has ``input_content``, the text, and ``final_instruction``).

**Instruction and text.** The authors built ``test_input`` as: framework prompt, ending with the line
``"###OBSERVATION: Tool's output result."``; then the GPT-4o-rendered instruction with its last period
replaced by ``":\\n\\n"``; then the text. So the instruction is what follows that line up to the first
``":\\n\\n"`` and the text is everything after it. This is checked against ``input_content`` where a row
has one (all 100 level-0 rows agree). By default (``instruction="rendered"``) the instruction is the
rendered one the planner saw, because that is what the paper's systems were evaluated on. GPT-4o's
rendering failed on some rows and they are kept as they are: 18 constrained rows have only chatter as
their instruction (``"Certainly! Here is the revised text"``), so their constraints are not stated at
all, and three (C3 line 54, C4 lines 10 and 66) carry added text (a "Here is the revised version" line,
or a whole invented passage) before the real text. ``instruction="template"`` instead rebuilds the
authors' pre-rendering instruction for constrained rows: ``"Polish the following text."`` followed by
the constraints' Table 14 sentences (:attr:`Constraint.prompt`), which states every constraint.

**Constraints.** Each one is parsed from its ``function_call`` with the tool-call parser (never
executed) and must agree with ``constrain_type`` and ``value``; a word-count range is one constraint
with two calls (``"a; b"`` in the file). :attr:`CordRow.gold_calls` are the canonical calls of
``tool_test_result.constraint_info``, which must be the same calls.

**Errors.** A line that is not JSON, lacks ``test_input``, or has a constraint that does not parse or
disagrees with itself raises :class:`CordError` naming the file and the 1-based line; with
``on_error="keep"`` the row is kept with ``error`` set (and empty constraints) and counted, never dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.errors import CorpusError
from core.files import json_object, read_utf8
from core.text import is_blank
from eval.craft.calls import CallError, ToolCall, extract_calls, parse_call, template_type

log = logging.getLogger(__name__)

# The last line of the framework prompt in every test_input; the user instruction starts after it.
PROMPT_END = "\"###OBSERVATION: Tool's output result.\"\n"
INSTRUCTION_END = ":\n\n"
# the authors' base instruction before the constraint sentences were appended and GPT-4o rendered them
TEMPLATE_BASE = "Polish the following text."
INSTRUCTION_MODES = ("rendered", "template")
# quorum's names (cord.constraint_1.jsonl) and the authors' release (test.agent.constraint_1.jsonl)
FILE_PATTERN = "*constraint_[0-9]*.jsonl"

# constrain_type in the files (and in the authors' generator) -> (Table 14 sub-group, relation)
CONSTRAINT_TYPES = {
    "sent_unchange_constraint": ("keep_sentence", "unchange"),
    "unchange_constraint": ("keep_sentence", "unchange"),
    "sent_change_constraint": ("modify_sentence", "change"),
    "change_constraint": ("modify_sentence", "change"),
    "tot_len_more_than": ("word_count", "more than"),
    "tot_len_less_than": ("word_count", "less than"),
    "tot_len_range": ("word_count", "range"),
    "sent_cnt_more_than": ("sentence_count", "more than"),
    "sent_cnt_less_than": ("sentence_count", "less than"),
    "sent_cnt_equal": ("sentence_count", "equal"),
    "per_len_more_than": ("per_sentence_length", "more than"),
    "per_len_less_than": ("per_sentence_length", "less than"),
    "keep_keyword": ("include_keyword", "keep"),
    "remove_keyword": ("remove_keyword", "remove"),
    "keyword_freq": ("keyword_frequency", "equal"),
    "keyword_freq_more": ("keyword_frequency", "more than"),
    "keyword_freq_less": ("keyword_frequency", "less than"),
}


class CordError(CorpusError):
    """A CORD line that cannot be read; the message names the file and the 1-based line."""


@dataclass(frozen=True)
class Constraint:
    """One constraint of an instance.

    Attributes:
        type: Table 14 sub-group: keep_sentence, modify_sentence, word_count, sentence_count,
            per_sentence_length, include_keyword, remove_keyword or keyword_frequency.
        relation: less than, more than, equal, range, keep, remove, change or unchange.
        args: ``{"count": n}``, ``{"min": m, "max": n}`` (range), ``{"ids": [...]}`` or ``{"keyword": k}``
            (plus ``"count"`` for keyword frequency).
        call: the gold call(s) as written in the file (``"a; b"`` for a range).
        prompt: the Table 14 template sentence.
    """

    type: str
    relation: str
    args: dict
    call: str
    prompt: str

    @property
    def calls(self) -> list[str]:
        """The canonical checker calls (two for a word-count range)."""
        return [parse_call(text).text for text in extract_calls(self.call)]


@dataclass(frozen=True)
class CordRow:
    """One CORD instance. ``source`` is where it came from (``file:line``); ``error`` is set on a kept bad row."""

    id: str
    level: int
    text: str
    instruction: str
    constraints: list[Constraint] = field(default_factory=list)
    gold_calls: list[str] = field(default_factory=list)
    source: str = ""
    error: str = ""

    @property
    def prompt_instruction(self) -> str:
        """The instruction as the paper's systems read it: its last period became a colon (CORD's test_input).

        >>> CordRow("x", 1, "T.", "Polish the text. Keep 'a'.").prompt_instruction
        "Polish the text. Keep 'a':"
        >>> CordRow("x", 0, "T.", "Improve the following text").prompt_instruction
        'Improve the following text:'
        """
        if not self.instruction:
            return ""
        return (self.instruction.removesuffix(".")) + ":"

    def to_row(self) -> dict:
        """A flat, JSON-serialisable dict for Ray Data (constraints as JSON text, their types as a list)."""
        return {"id": self.id, "level": self.level, "text": self.text, "instruction": self.instruction,
                "prompt_instruction": self.prompt_instruction,
                "constraint_types": [c.type for c in self.constraints],
                "constraints_json": json.dumps([asdict(c) for c in self.constraints], ensure_ascii=False),
                "gold_calls": list(self.gold_calls), "source": self.source, "error": self.error}

    @classmethod
    def from_row(cls, row: dict) -> CordRow:
        """Inverse of :meth:`to_row` (list-like columns may come back as arrays)."""
        constraints = [Constraint(**c) for c in json.loads(row["constraints_json"])]
        return cls(id=str(row["id"]), level=int(row["level"]), text=row["text"], instruction=row["instruction"],
                   constraints=constraints, gold_calls=[str(c) for c in row["gold_calls"]],
                   source=row["source"], error=row["error"] or "")


def read_cord(paths: str | Path | Iterable[str | Path], levels: Iterable[int] | None = None,
              on_error: str = "raise", instruction: str = "rendered") -> list[CordRow]:
    """Read CORD files (or a directory of ``cord.constraint_<n>.jsonl`` or ``test.agent.constraint_<n>.jsonl``) into rows.

    Args:
        paths: a directory, one file, or several files.
        levels: keep only these levels (the level is the file name's ``constraint_<n>``).
        on_error: ``"raise"`` (a bad line raises CordError) or ``"keep"`` (kept with ``error`` set).
        instruction: ``"rendered"`` (what the planner saw) or ``"template"`` (base instruction + the
            constraints' Table 14 sentences; level 0 keeps its rendered instruction).
    """
    if on_error not in ("raise", "keep"):
        raise ValueError(f"on_error must be 'raise' or 'keep', got {on_error!r}")
    if instruction not in INSTRUCTION_MODES:
        raise ValueError(f"instruction must be one of {list(INSTRUCTION_MODES)}, got {instruction!r}")
    files = _files(paths)
    wanted = None if levels is None else set(levels)
    rows = []
    for path in files:
        level = _level(path)
        if wanted is not None and level not in wanted:
            continue
        rows.extend(_read_file(path, level, on_error, instruction))
    failed = sum(bool(row.error) for row in rows)
    if failed:
        log.warning("CORD: kept %d of %d rows marked failed (on_error='keep')", failed, len(rows))
    return rows


def failed_rows(rows: Iterable[CordRow]) -> list[CordRow]:
    """The rows kept with an error (``on_error="keep"``)."""
    return [row for row in rows if row.error]


def _files(paths) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(item.glob(FILE_PATTERN), key=lambda p: (_level(p), p.name))
            if not found:
                raise CordError(f"{item}: no {FILE_PATTERN} files")
            levels = [_level(p) for p in found]
            if len(set(levels)) != len(levels):
                twice = sorted({lv for lv in levels if levels.count(lv) > 1})
                raise CordError(f"{item}: more than one file for level(s) {twice} "
                                f"({', '.join(p.name for p in found if _level(p) in twice)}); keep one per level")
            files.extend(found)
        elif item.is_file():
            files.append(item)
        else:
            raise CordError(f"{item}: no such file or directory")
    return files


def _level(path: Path) -> int:
    match = re.search(r"constraint_(\d+)", path.name)
    if not match:
        raise CordError(f"{path}: cannot tell the level from the file name (expected constraint_<n>)")
    return int(match.group(1))


def _read_file(path: Path, level: int, on_error: str, instruction: str) -> list[CordRow]:
    text = read_utf8(path, CordError).removeprefix("\ufeff")
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue  # blank lines are not records, but keep the numbering
        where = f"{path.name}:{number}"
        try:
            rows.append(_parse_row(line, level, where, instruction))
        except CordError as err:
            if on_error == "raise":
                raise CordError(f"{path}: line {number}: {err}") from None
            rows.append(CordRow(id=f"cord-c{level}-line{number:06d}", level=level, text="", instruction="",
                                source=where, error=str(err)))
    return rows


def _parse_row(line: str, level: int, where: str, mode: str) -> CordRow:
    record = json_object(line, "", CordError)
    prompt = record.get("test_input")
    if not isinstance(prompt, str) or not prompt:
        raise CordError("no test_input (the planner prompt holding the instruction and the text)")
    other = _mapping(record, "other_info")
    instruction, text = _instruction_and_text(prompt, other)
    items = other.get("constraint_info") or []
    if not isinstance(items, list):
        raise CordError(f"other_info.constraint_info: expected a list, got {type(items).__name__}")
    constraints = [_constraint(item, i) for i, item in enumerate(items, start=1)]
    expected = [call for c in constraints for call in c.calls]
    gold_raw = _mapping(record, "tool_test_result").get("constraint_info")
    gold = expected if gold_raw is None else _gold_calls(gold_raw)
    if sorted(gold) != sorted(expected):
        raise CordError(f"tool_test_result.constraint_info {gold} disagrees with the constraints' calls {expected}")
    raw_id = record.get("id")
    row_id = f"cord-c{level}-{raw_id:06d}" if isinstance(raw_id, int) else f"cord-c{level}-{raw_id}"
    if mode == "template" and constraints:
        instruction = " ".join([TEMPLATE_BASE] + [c.prompt for c in constraints])
    return CordRow(id=row_id, level=level, text=text, instruction=instruction, constraints=constraints,
                   gold_calls=gold, source=where)


def _mapping(record: dict, key: str) -> dict:
    """An optional object field of a CORD line ({} when absent); another type is a CordError naming the field."""
    value = record.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CordError(f"{key}: expected an object, got {type(value).__name__}")
    return value


def _instruction_and_text(prompt: str, other: dict) -> tuple[str, str]:
    _, marker, tail = prompt.partition(PROMPT_END)
    if not marker:
        raise CordError("test_input lacks the framework prompt's last line, so the instruction cannot be found")
    instruction, sep, text = tail.partition(INSTRUCTION_END)
    if not sep or not text.strip():
        raise CordError("test_input has no ':' + blank line between the instruction and the text")
    if is_blank(text):
        raise CordError("the text to revise is empty once normalised (only zero-width or control characters)")
    content = other.get("input_content")
    if content is not None and content != text:
        raise CordError("other_info.input_content differs from the text in test_input")
    return instruction.strip(), text


def _gold_calls(raw) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise CordError("tool_test_result.constraint_info must be a list of call strings")
    calls = []
    for item in raw:
        for text in extract_calls(item) or [item]:
            parsed = parse_call(text)
            if isinstance(parsed, CallError):
                raise CordError(f"gold call {item!r} does not parse: {parsed.message}")
            calls.append(parsed.text)
    return calls


def _constraint(item, index: int) -> Constraint:
    """One other_info.constraint_info entry, parsed and checked for agreement with itself."""
    where = f"constraint {index}"
    if not isinstance(item, dict):
        raise CordError(f"{where}: expected an object, got {type(item).__name__}")
    kind, value, call_text = item.get("constrain_type"), item.get("value") or {}, item.get("function_call")
    if not isinstance(value, dict):
        raise CordError(f"{where}: value: expected an object, got {type(value).__name__}")
    if not isinstance(kind, str) or kind not in CONSTRAINT_TYPES:
        raise CordError(f"{where}: unknown constrain_type {kind!r}")
    if not isinstance(call_text, str):
        raise CordError(f"{where}: no function_call")
    group, relation = CONSTRAINT_TYPES[kind]
    parsed = [parse_call(text) for text in extract_calls(call_text)]
    errors = [p.message for p in parsed if isinstance(p, CallError)]
    if not parsed or errors:
        raise CordError(f"{where}: function_call {call_text!r} does not parse: {errors[0] if errors else 'no call'}")
    if any(template_type(p) != group for p in parsed):
        raise CordError(f"{where}: function_call {call_text!r} does not check a {kind} constraint")
    args = _args(parsed, relation, value)
    if isinstance(args, str):
        raise CordError(f"{where}: {args} ({kind}, value {value}, function_call {call_text!r})")
    return Constraint(type=group, relation=relation, args=args, call=call_text, prompt=str(item.get("prompt", "")))


def _args(calls: list[ToolCall], relation: str, value: dict) -> dict | str:
    """The constraint's arguments from its call(s), or a sentence saying how they disagree with ``value``."""
    if relation == "range":
        bounds = {c.args[1]: c.args[0] for c in calls}
        if len(calls) != 2 or set(bounds) != {"less than", "more than"}:
            return "a range needs one 'less than' and one 'more than' word_count_check"
        args = {"min": bounds["more than"], "max": bounds["less than"]}
        if (value.get("min_cnt"), value.get("max_cnt")) != (args["min"], args["max"]):
            return "value's min_cnt/max_cnt disagree with the calls"
        return args
    if len(calls) != 1:
        return f"expected one call, found {len(calls)}"
    call = calls[0]
    if call.args[-1] != relation:
        return f"the call's relation {call.args[-1]!r} is not {relation!r}"
    if call.name == "sentence_modification_check":
        args = {"ids": list(call.args[0])}
        cnt = value.get("cnt")
        same = (sorted({c for c in cnt if isinstance(c, int)}) if isinstance(cnt, list) else [cnt]) == args["ids"]
    elif call.name == "keyword_keep_removal_check":
        args = {"keyword": call.args[0]}
        same = value.get("keyword") == args["keyword"]
    elif call.name == "keyword_frequency_check":
        args = {"keyword": call.args[0], "count": call.args[1]}
        same = (value.get("keyword"), value.get("cnt")) == (args["keyword"], args["count"])
    else:
        args = {"count": call.args[0]}
        same = value.get("cnt") == args["count"]
    return args if same else "value disagrees with the call's arguments"
