"""ReAct I/O of the CRAFT planner (paper 002, §5.1.1, Table 17, App. E.1/E.7/E.8): parse its output, render what it reads.

The planner answers in the Table 17 format::

    ###THOUGHT: [Thought]
    ###ACTION:
       -###TOOLS: [tool calls, one per line]
       -###PLAN: [one line per sentence: Sentence: "..."; Improvement Plan: "..."]

and then reads an ``###OBSERVATION:`` (the revised text and the tools' feedback) as the next user turn. Small and
fine-tuned models bend this format, so :func:`parse_planner_output` accepts markdown bold (``**###THOUGHT:**``),
headers written ``### Thought``, list markers and numbering (``1. ###THOUGHT:``, ``- ###TOOLS:``), code fences,
calls written on one line (``text_eval(), word_count_check(400, 'more than')``, as in the paper's Fig. 10) and
missing sections. Model output is data: nothing here raises on it. Problems come back as error codes in
``PlannerStep.errors`` (counted by the caller; the raw text is kept):

==========================  ============================================================================
``empty``                   blank output
``no_sections``             no ``###`` header at all: calls and plan lines were searched in the whole text
``missing_thought``         no THOUGHT section (likewise ``missing_tools``, ``missing_plan``)
``repeated_section``        a section header appears twice; the first one is used
``observation_in_output``   the planner wrote an ``###OBSERVATION`` itself; everything after it is ignored
``no_tool_calls``           a TOOLS section without any ``name(...)`` call
``unbalanced_call``         a call whose parentheses or quotes never close (kept raw for the tool parser)
``empty_plan``              no plan line could be parsed
``unparsed_plan_line``      at least one line of the PLAN section is neither a plan line nor a heading
==========================  ============================================================================

Tool calls are returned as raw strings and never executed; ``eval.craft.tools`` parses them with a whitelist.

Also parsed here: the reviser's output (:func:`join_revision`, its lines as one paragraph) and the E.8 feedback
(:func:`parse_suggestions`, ``Original: ...; Suggestion: ...`` lines). What the planner reads (observation, chat
history, Table 17 transcript, reviser input) is rendered by ``eval.craft.render``.

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from eval.craft.calls import closing_paren
from eval.craft.calls import extract_calls as tool_calls_in

_SECTIONS = ("thought", "action", "tools", "plan", "observation")
_DECOR = r"[*_`]*"  # markdown emphasis / inline code around a header
_BULLET = r"(?:(?:[-*+•]|\d+[.)])[ \t]*)?"
_NAME = r"(THOUGHTS?|ACTIONS?|TOOLS?|PLANS?|OBSERVATIONS?)\b"
# "###THOUGHT:", "**###THOUGHT:**", "1. ###THOUGHT:", "   -###TOOLS:", "### Plan", "####TOOLS**:**"
_HEADER_RE = re.compile(
    rf"^[ \t>]*{_BULLET}{_DECOR}[ \t]*#{{1,6}}[ \t]*{_DECOR}[ \t]*{_NAME}{_DECOR}[ \t]*:?{_DECOR}[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
# fallback when no "#" header exists: "Thought:", "**Tools:**" at the start of a line (the colon is required)
_BARE_HEADER_RE = re.compile(rf"^[ \t>]*{_BULLET}{_DECOR}[ \t]*{_NAME}{_DECOR}[ \t]*:{_DECOR}[ \t]*",
                             re.IGNORECASE | re.MULTILINE)
_FENCE_RE = re.compile(r"^[ \t]*(```|~~~).*$", re.MULTILINE)
_QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’"}

# plan lines: strict label pair first, then looser labels, then a quoted sentence followed by an arrow or colon
_SEP = r"\s*[;,|]?\s*"
_PLAN_PATTERNS = (
    re.compile(rf"^sentence\s*:\s*(?P<s>.+?){_SEP}improvement\s+plan\s*:\s*(?P<p>.*)$", re.IGNORECASE),
    re.compile(rf"^(?:original\s+)?sentence(?:\s*\d+)?\s*:\s*(?P<s>.+?){_SEP}"
               rf"(?:(?:improvement|revision|editing|edit)\s+plan|plan|improvement|suggestion)\s*:\s*(?P<p>.*)$",
               re.IGNORECASE),
    re.compile(r"^(?P<s>[\"“][^\"”]+[\"”])\s*(?:->|→|=>|:|—|–)\s*(?P<p>.+)$"),
)
_SENTENCE_ONLY_RE = re.compile(r"^(?:original\s+)?sentence(?:\s*\d+)?\s*:\s*(?P<v>.*)$", re.IGNORECASE)
_PLAN_ONLY_RE = re.compile(r"^(?:(?:improvement|revision|editing|edit)\s+)?plan\s*:\s*(?P<v>.*)$", re.IGNORECASE)
# a list marker; a number only with a space after it ("3.5 million" keeps its "3.")
_LEAD_RE = re.compile(r"^[ \t>]*(?:[-*+•]|(?:\d+[.)]|\(\d+\))(?=\s))?[ \t]*")
_SUGGESTION_RE = re.compile(r"original\s*:\s*(?P<o>.+?)\s*[;,|]?\s*suggestion\s*:\s*(?P<s>.+)$", re.IGNORECASE)


@dataclass(frozen=True)
class PlanLine:
    """One per-sentence plan item: the sentence quoted from the current text and how to improve it."""

    sentence: str
    improvement_plan: str


@dataclass
class PlannerStep:
    """One parsed planner output (thought t_i and action a_i).

    Attributes:
        thought: The THOUGHT section.
        tools_text: The TOOLS section as written.
        tool_calls: Raw call strings in order of appearance (not executed, not deduplicated).
        plan: Parsed plan lines.
        raw: The planner's output, verbatim.
        errors: Error codes (see the module docstring); empty when the output is well-formed.
    """

    thought: str
    tools_text: str
    tool_calls: list[str]
    plan: list[PlanLine]
    raw: str
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Suggestion:
    """One line of E.8 feedback: ``Original: [...]; Suggestion: [...]``."""

    original: str
    suggestion: str

    def render(self) -> str:
        return f"Original: {self.original}; Suggestion: {self.suggestion}"


# -----------------------------------------------------------------------------
# Parsing


def parse_planner_output(text: str | None) -> PlannerStep:
    """Parse one planner output in the Table 17 format; never raises on model output.

    >>> step = parse_planner_output('###THOUGHT: Keep it short.\\n###ACTION:\\n-###TOOLS: word_count_check(40, '
    ...     '"less than")\\n-###PLAN:\\nSentence: "A b."; Improvement Plan: "Merge."')
    >>> step.thought, step.tool_calls, step.plan[0].improvement_plan, step.errors
    ('Keep it short.', ['word_count_check(40, "less than")'], 'Merge.', [])
    """
    raw = text or ""
    if not raw.strip():
        return PlannerStep("", "", [], [], raw, ["empty"])
    body = _FENCE_RE.sub("", raw)
    errors: list[str] = []
    sections = _split_sections(body, _HEADER_RE, errors) or _split_sections(body, _BARE_HEADER_RE, errors)
    if not sections:
        calls, call_errors = extract_calls(body)
        plan, unparsed = parse_plan(body)
        errors += ["no_sections", *call_errors, *(["empty_plan"] if not plan else [])]
        return PlannerStep("", "", calls, plan, raw, _unique(errors))
    for name in ("thought", "tools", "plan"):
        if name not in sections:
            errors.append(f"missing_{name}")
    thought = sections.get("thought", "").strip().strip("*").strip()
    tools_text = sections.get("tools", "").strip()
    # without a TOOLS header, calls written straight under ACTION still count
    calls, call_errors = extract_calls(tools_text if "tools" in sections else sections.get("action", ""))
    errors += call_errors
    if "tools" in sections and not calls:
        errors.append("no_tool_calls")
    plan_source = sections["plan"] if "plan" in sections else sections.get("action", "")
    plan, unparsed = parse_plan(plan_source)
    if not plan:
        errors.append("empty_plan")
    elif unparsed:
        errors.append("unparsed_plan_line")
    return PlannerStep(thought, tools_text, calls, plan, raw, _unique(errors))


def _split_sections(body: str, header_re: re.Pattern, errors: list[str]) -> dict[str, str]:
    headers = list(header_re.finditer(body))
    sections: dict[str, str] = {}
    for i, match in enumerate(headers):
        name = next(s for s in _SECTIONS if match.group(1).lower().startswith(s[:4]))
        if name == "observation":
            # the planner wrote the tools' answer itself: nothing after it is its own action
            errors.append("observation_in_output")
            if sections:
                break
            continue
        end = headers[i + 1].start() if i + 1 < len(headers) else len(body)
        if name in sections:
            errors.append("repeated_section")
            continue
        sections[name] = body[match.end():end]
    return sections


def extract_calls(text: str) -> tuple[list[str], list[str]]:
    """`eval.craft.calls.extract_calls` on the text outside code fences, with ``unbalanced_call`` reported for a call
    whose parenthesis never closes (it is kept, to the end of its line, and fails to parse later).

    >>> extract_calls("- `text_eval()`, word_count_check(400,'more than')\\nNone needed (really).")
    (['text_eval()', "word_count_check(400,'more than')"], [])
    >>> extract_calls('sentence_length_check(6, "more than"')
    (['sentence_length_check(6, "more than"'], ['unbalanced_call'])
    """
    calls = tool_calls_in(_FENCE_RE.sub("", text))
    unbalanced = [c for c in calls if closing_paren(c, c.index("(") + 1) is None]
    return [c.rstrip(",;`") if c in unbalanced else c for c in calls], ["unbalanced_call"] if unbalanced else []


def parse_plan_line(line: str) -> PlanLine | None:
    """One ``Sentence: "..."; Improvement Plan: "..."`` line (or a fallback form), else None.

    >>> parse_plan_line('2. **Sentence:** "It rains."; **Improvement Plan:** "Add a subject.".')
    PlanLine(sentence='It rains.', improvement_plan='Add a subject.')
    >>> parse_plan_line('"It rains." -> Say where.')
    PlanLine(sentence='It rains.', improvement_plan='Say where.')
    >>> parse_plan_line("The weather is fine.") is None
    True
    """
    norm = _clean_line(line)
    for pattern in _PLAN_PATTERNS:
        match = pattern.match(norm)
        if match:
            sentence, plan = _unquote(match.group("s")), _unquote(match.group("p"))
            if sentence and plan:
                return PlanLine(sentence, plan)
    return None


def parse_plan(text: str) -> tuple[list[PlanLine], int]:
    """All plan lines of a PLAN section, with the count of lines that could not be parsed.

    Accepts one-line items and the two-line form of the paper's E.3 example (``Sentence: ...`` then
    ``Improvement Plan: ...``); a sentence wrapped over several lines is joined. Blank lines, code fences and
    headings that end with ``:`` (``For each sentence:``) are skipped without counting.

    >>> plan, unparsed = parse_plan('For each sentence:\\nSentence: A b.\\nImprovement Plan: Merge.\\nhello')
    >>> plan, unparsed
    ([PlanLine(sentence='A b.', improvement_plan='Merge.')], 1)
    """
    plan: list[PlanLine] = []
    unparsed = 0
    pending: str | None = None
    for line in _FENCE_RE.sub("", text).splitlines():
        norm = _clean_line(line)
        if not norm or set(norm) <= set("-=*_"):
            continue
        item = parse_plan_line(norm)
        if item is not None:
            unparsed += pending is not None
            pending = None
            plan.append(item)
        elif (m := _SENTENCE_ONLY_RE.match(norm)) is not None:
            unparsed += pending is not None
            pending = m.group("v")
        elif (m := _PLAN_ONLY_RE.match(norm)) is not None and pending is not None:
            sentence, improvement = _unquote(pending), _unquote(m.group("v"))
            if sentence and improvement:
                plan.append(PlanLine(sentence, improvement))
            else:
                unparsed += 1
            pending = None
        elif pending is not None:
            pending = f"{pending} {norm}"
        elif not norm.endswith(":"):
            unparsed += 1
    return plan, unparsed + (pending is not None)


def parse_suggestions(text: str | None) -> list[Suggestion]:
    """The ``Original: ...; Suggestion: ...`` lines of an E.8 feedback answer (other lines are ignored).

    >>> parse_suggestions("Here you go:\\n1. Original: [He go.]; Suggestion: [He goes.]")
    [Suggestion(original='He go.', suggestion='He goes.')]
    """
    out = []
    for line in (text or "").splitlines():
        match = _SUGGESTION_RE.search(_clean_line(line))
        if match:
            original, suggestion = _unquote(match.group("o")), _unquote(match.group("s"))
            if original and suggestion:
                out.append(Suggestion(original, suggestion))
    return out


def _clean_line(line: str) -> str:
    return _LEAD_RE.sub("", line.replace("**", "")).strip().strip("`").strip()


def _unquote(value: str) -> str:
    """Strip one pair of matching outer quotes or brackets (and a trailing ``.``/``;``/``,`` after them)."""
    value = value.strip().rstrip(";,").strip()
    for left, right in (*_QUOTES.items(), ("[", "]")):
        for tail in ("", ".", ";", ","):
            if len(value) >= 2 + len(tail) and value.startswith(left) and value.endswith(right + tail):
                return value[1:len(value) - 1 - len(tail)].strip()
    return value


def _unique(codes: list[str]) -> list[str]:
    return list(dict.fromkeys(codes))


# -----------------------------------------------------------------------------
# Reviser output


def join_revision(text: str | None, separator: str = " ") -> str:
    """The reviser's output (E.7: polished sentences "one after another") as one paragraph.

    List markers and numbering are dropped, as are ``#`` headings and a first line that only introduces the
    answer (``Here are the polished sentences:``). Paragraph breaks are lost, as in the authors' code (the
    paper does not say).

    >>> join_revision("Here are the polished sentences:\\n1. It rains.\\n\\n2. We stay in.")
    'It rains. We stay in.'
    """
    lines = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _FENCE_RE.match(stripped):
            continue
        lines.append(_LEAD_RE.sub("", stripped).strip())
    if len(lines) > 1 and lines[0].endswith(":"):
        lines = lines[1:]
    return separator.join(x for x in lines if x)


def revision_lines(text: str | None) -> list[str]:
    """The reviser's output lines as :func:`join_revision` keeps them (before joining).

    >>> revision_lines("Here are the polished sentences:\\n1. It rains.\\n\\n2. We stay in.")
    ['It rains.', 'We stay in.']
    """
    joined = join_revision(text, separator="\n")
    return [line for line in joined.split("\n") if line]


def splice_revision(current: str, plan: list[PlanLine], reviser_output: str | None) -> str:
    """The current text with the plan's sentences replaced by their revisions; every other sentence stays.

    Why: the paper's reviser sees only the plan (E.7), so its output is the whole revision and a sentence the plan
    does not quote is lost. A planner that quotes every sentence (the paper's) loses nothing; a small one with a
    short token budget quotes a few, and its revision would drop the rest of the text. ``agent.unplanned_sentences:
    keep`` uses this function instead of :func:`join_revision` (a declared deviation).

    Each quoted sentence is looked up verbatim in ``current`` (first occurrence not already taken). If the reviser
    wrote one line per plan line and every quoted sentence was found, line i replaces sentence i in place;
    otherwise the whole revision replaces the first found sentence and the other found sentences are removed.
    A plan none of whose sentences occurs in ``current`` gives the joined output, as :func:`join_revision`; an empty
    answer gives "" (a failed revision, not a shorter text).

    >>> plan = [PlanLine("It rains.", "x"), PlanLine("We stay.", "y")]
    >>> splice_revision("Hi. It rains. We stay. Bye.", plan, "It pours.\\nWe remain.")
    'Hi. It pours. We remain. Bye.'
    >>> splice_revision("Hi. It rains. We stay. Bye.", plan, "It pours and we remain.")
    'Hi. It pours and we remain. Bye.'
    """
    lines = revision_lines(reviser_output)
    if not lines:
        return ""  # no revision at all: the guard counts it as empty, as with the paper's joined output
    spans: list[tuple[int, int, int]] = []  # (start, end, plan index)
    for i, item in enumerate(plan):
        sentence = item.sentence.strip()
        start = current.find(sentence) if sentence else -1
        while start >= 0 and any(s <= start < e for s, e, _ in spans):
            start = current.find(sentence, start + 1)
        if start >= 0:
            spans.append((start, start + len(sentence), i))
    if not spans:
        return " ".join(lines)
    spans.sort()
    if len(lines) == len(plan) == len(spans):
        replacement = {i: lines[i] for _, _, i in spans}
    else:
        replacement = {i: "" for _, _, i in spans}
        replacement[spans[0][2]] = " ".join(lines)
    out, last = [], 0
    for start, end, i in spans:
        out.append(current[last:start] + replacement[i])
        last = end
    out.append(current[last:])
    # a removed sentence leaves its surrounding spaces behind: collapse runs of spaces (not newlines)
    return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip()
