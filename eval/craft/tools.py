"""CRAFT's constraint tools (paper 002, §6.1 / App. E.2): the six checkers, constraint accuracy, tool-usage F1.

A planner's call (parsed and validated by :mod:`eval.craft.calls`, never executed) is checked against the
original and the revised text with the counting rules of :mod:`eval.craft.text`. Every check returns a
:class:`CheckResult` whose ``message`` is the feedback sentence the planner reads (modelled on the
authors' feedback strings, with their typos fixed: the reference says "should be less than" for a
"more than" word count). A call that does not parse comes back as a :class:`~eval.craft.calls.CallError`
instead; :func:`check` never raises on planner input.

**Label convention.** ``satisfied=True`` means the constraint holds. App. E.2's tool descriptions tell the
planner "'0' if the condition is met, '1' otherwise", while the authors' code returns 1 for satisfied.
The planner never sees a bare label from us (it reads ``message``), so the two cannot disagree silently;
:func:`paper_label` renders the E.2 label where a prompt needs one.

**Model-backed tools.** ``text_eval()`` and ``detect_keyword()`` need a model. :func:`check` returns a
placeholder result for them (``satisfied=None``, ``value=None``) that the caller fills; constraint
accuracy skips them.

**Observed values.** ``value`` is the number the check compared: the word count, the sentence count, the
keyword occurrences in the revision, the number of the listed original sentences still present verbatim
in the revision, and for ``sentence_length_check`` the deciding extreme: the longest sentence's length for
"less than", the shortest's for "more than", and for "equal" the first length that differs (the target
when none does). A text without sentences has no sentence that breaks a per-sentence bound, so it passes.

**Constraint accuracy** follows the reference ``compute_cons_acc``: the fraction of checker calls that
hold; ``text_eval``/``detect_keyword`` are skipped; a malformed call counts as a failure. With nothing
left to score (no call, or only ``text_eval()``) the accuracy is **0.0**, where the reference returns 1: a
search rewarded with 1 for checking nothing pays a planner for calling no tool (a copy of the input with only
``text_eval()`` would reach the maximum reward). Callers that must tell "nothing checked" from "all failed"
read the number of scored results. Unlike the reference, a word-count or
keyword-frequency check counts as passed only when it holds (the reference scores the observed count's
truthiness there, so any non-empty text passes), and a word-count range is two separate calls (the
reference ``eval``s ``"a; b"`` as one expression, which always fails).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eval.craft.calls import MODEL_BACKED, CallError, ToolCall, canonical, extract_calls, parse_call
from eval.craft.text import (
    REFERENCE,
    TextRules,
    contains_sentence,
    keyword_count,
    sentence_lengths,
    split_sentences,
    word_count,
)

# the public API in one place: the parser and the counting rules live in the two modules imported above
__all__ = ["REFERENCE", "CallError", "CheckResult", "TextRules", "ToolCall", "canonical", "check",
           "constraint_accuracy", "constraint_feedback", "count_call_errors", "extract_calls", "paper_label",
           "parse_call", "tool_f1"]


@dataclass(frozen=True)
class CheckResult:
    """One tool call checked against a revision.

    Attributes:
        call: the canonical call text.
        name: the tool name.
        value: the observed number (see the module docstring); None for model-backed tools.
        satisfied: True if the constraint holds; None for a model-backed tool the caller has to fill.
        message: feedback for the planner.
    """

    call: str
    name: str
    value: int | None
    satisfied: bool | None
    message: str

    @property
    def pending(self) -> bool:
        """A model-backed tool whose result the caller still has to fill."""
        return self.satisfied is None


def paper_label(result: CheckResult | CallError) -> str:
    """App. E.2's label: ``"0"`` if the condition is met, ``"1"`` otherwise (a malformed call is not met)."""
    return "0" if result.satisfied else "1"


def _compare(observed: int, relation: str, target: int) -> bool:
    if relation == "less than":
        return observed < target
    if relation == "more than":
        return observed > target
    return observed == target


def _advice(observed: int, relation: str, target: int, fewer: str, more: str) -> str:
    """Which way to move: "less than" and "equal" above the target reduce, everything else increases."""
    return fewer if relation == "less than" or (relation == "equal" and observed > target) else more


def _word_count(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    target, relation = call.args
    count = word_count(revised, rules)
    if _compare(count, relation, target):
        message = f"The word count of the polished text is {count}, which meets the requirement ({relation} {target})."
        return CheckResult(call.text, call.name, count, True, message)
    want = "be" if relation == "equal" else f"be {relation}"
    advice = _advice(count, relation, target, "reducing", "increasing")
    message = (f"The word count for the polished text should {want} {target}, your word count is {count}, "
               f"please consider {advice} it.")
    return CheckResult(call.text, call.name, count, False, message)


def _sentence_count(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    target, relation = call.args
    count = len(split_sentences(revised, rules))
    if _compare(count, relation, target):
        message = f"The polished text contains {count} sentences, which meets the requirement ({relation} {target})."
        return CheckResult(call.text, call.name, count, True, message)
    want = "exactly" if relation == "equal" else relation
    advice = _advice(count, relation, target, "reducing", "increasing")
    message = (f"The polished text contains {count} sentences, but it should contain {want} {target} sentences; "
               f"please consider {advice} the number of sentences.")
    return CheckResult(call.text, call.name, count, False, message)


def _sentence_length(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    target, relation = call.args
    sentences = split_sentences(revised, rules)
    lengths = sentence_lengths(revised, rules)
    offending = next((i for i, n in enumerate(lengths) if not _compare(n, relation, target)), None)
    if relation == "less than":
        value = max(lengths, default=0)
    elif relation == "more than":
        value = min(lengths, default=0)
    else:
        value = target if offending is None else lengths[offending]
    if offending is None:
        message = f"Every sentence of the polished text contains {relation} {target} words, as required."
        return CheckResult(call.text, call.name, value, True, message)
    length = lengths[offending]
    want = "exactly" if relation == "equal" else relation
    advice = _advice(length, relation, target, "shortening", "lengthening")
    message = (f'The sentence "{sentences[offending]}" contains {length} words, but every sentence should '
               f"contain {want} {target} words; please consider {advice} it.")
    return CheckResult(call.text, call.name, value, False, message)


def _keep_remove(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    keyword, relation = call.args
    if relation == "keep":
        before, after = keyword_count(original, keyword, rules), keyword_count(revised, keyword, rules)
        if before == after:
            message = f'The keyword "{keyword}" has been kept ({after} times, as in the original).'
            return CheckResult(call.text, call.name, after, True, message)
        message = (f'The keyword "{keyword}" occurs {after} times in the polished text but {before} times in '
                   f"the original; please keep every occurrence.")
        return CheckResult(call.text, call.name, after, False, message)
    count = keyword_count(revised, keyword, rules, ignore_case=rules.remove_ignore_case)
    if count == 0:
        return CheckResult(call.text, call.name, 0, True, f'The keyword "{keyword}" has been removed, as required.')
    message = f'The keyword "{keyword}" still occurs {count} times in the polished text; please consider removing it.'
    return CheckResult(call.text, call.name, count, False, message)


def _keyword_frequency(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    keyword, target, relation = call.args
    count = keyword_count(revised, keyword, rules)
    if _compare(count, relation, target):
        message = f'The keyword "{keyword}" occurs {count} times, which meets the requirement ({relation} {target}).'
        return CheckResult(call.text, call.name, count, True, message)
    want = "exactly" if relation == "equal" else relation
    advice = _advice(count, relation, target, "reducing", "increasing")
    message = (f'The keyword "{keyword}" should occur {want} {target} times, but it occurs {count} times in '
               f"the polished text; please consider {advice} it.")
    return CheckResult(call.text, call.name, count, False, message)


def _sentence_modification(call: ToolCall, original: str, revised: str, rules: TextRules) -> CheckResult:
    ids, relation = call.args
    sentences = split_sentences(original, rules)
    present = [i for i in ids if i <= len(sentences) and contains_sentence(revised, sentences[i - 1], rules)]
    missing_ids = [i for i in ids if i > len(sentences)]
    if missing_ids:
        message = (f"The original text has {len(sentences)} sentences, so sentence {missing_ids[0]} does not "
                   f"exist; please refer to existing sentences.")
        return CheckResult(call.text, call.name, len(present), False, message)
    if relation == "unchange":
        changed = [i for i in ids if i not in present]
        if not changed:
            message = "The targeted sentences have not been changed, as required."
            return CheckResult(call.text, call.name, len(present), True, message)
        message = (f"The sentence \"{sentences[changed[0] - 1]}\" (sentence {changed[0]}) has been changed; "
                   f"please do not modify it.")
        return CheckResult(call.text, call.name, len(present), False, message)
    if not present:
        return CheckResult(call.text, call.name, 0, True, "The targeted sentences have been changed, as required.")
    message = (f"The sentence \"{sentences[present[0] - 1]}\" (sentence {present[0]}) has not been changed; "
               f"please consider modifying it.")
    return CheckResult(call.text, call.name, len(present), False, message)


_CHECKERS = {
    "word_count_check": _word_count,
    "keyword_keep_removal_check": _keep_remove,
    "keyword_frequency_check": _keyword_frequency,
    "sentence_modification_check": _sentence_modification,
    "sentence_count_check": _sentence_count,
    "sentence_length_check": _sentence_length,
}


def check(call: str | ToolCall, original: str, revised: str, rules: TextRules = REFERENCE) -> CheckResult | CallError:
    """Check one planner call on ``revised`` (``original`` is the text before revision).

    Returns a CallError for a call that does not parse (never raises on it), and a pending placeholder
    (``satisfied=None``) for ``text_eval()`` / ``detect_keyword()``.

    >>> check('word_count_check(5, "less than")', "", "Hello, world.").satisfied
    True
    """
    parsed = call if isinstance(call, ToolCall) else parse_call(call)
    if isinstance(parsed, CallError):
        return parsed
    if parsed.name in MODEL_BACKED:
        return CheckResult(parsed.text, parsed.name, None, None, f"{parsed.name}() is model-backed; filled by the caller.")
    return _CHECKERS[parsed.name](parsed, original, revised, rules)


def constraint_accuracy(calls: Iterable[str | ToolCall], original: str, revised: str,
                        rules: TextRules = REFERENCE) -> tuple[float, list[CheckResult | CallError]]:
    """Fraction of the checker calls that hold on ``revised`` (see the module docstring), and every result.

    >>> constraint_accuracy(["text_eval()"], "A b.", "A b.")[0]   # nothing checked scores 0, never 1
    0.0
    """
    results = [check(call, original, revised, rules) for call in calls]
    scored = [r for r in results if isinstance(r, CallError) or not r.pending]
    if not scored:
        return 0.0, results
    return sum(r.satisfied is True for r in scored) / len(scored), results


def count_call_errors(results: Iterable[CheckResult | CallError]) -> int:
    """How many results are malformed calls."""
    return sum(isinstance(r, CallError) for r in results)


def constraint_feedback(results: Sequence[CheckResult | CallError]) -> str:
    """The observation block for the planner: one line per scored result (the reference's heading)."""
    lines = [r.message for r in results if isinstance(r, CallError) or not r.pending]
    if not lines:
        return "Constraints following feedback:\nAll the constraints have been satisfied."
    return "Constraints following feedback:\n" + "\n".join(lines)


def tool_f1(predicted_calls: Iterable[str | ToolCall], gold_calls: Iterable[str | ToolCall]) -> float:
    """Set F1 of canonical calls, with ``text_eval()`` added on both sides (App. D.4, the reference's F1).

    A call that does not parse keeps its own text, so it is a false positive (or an unmatched gold call).

    >>> tool_f1(["word_count_check(300, 'less than')"], ['word_count_check(300, "less than")'])
    1.0
    """
    predicted = {canonical(c) for c in predicted_calls} | {"text_eval()"}
    gold = {canonical(c) for c in gold_calls} | {"text_eval()"}
    hits = len(predicted & gold)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(gold)
    return 2 * precision * recall / (precision + recall)
