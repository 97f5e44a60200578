"""The gold planner of the CORD comparison (paper 002): a planner that proposes CORD's gold calls and a plan from them.

Why: the search's figure mixes three things (the planner's tool calls and plan, the reviser, the reward). The
``mcts_oracle_rc`` control fixes only R_c's list (CORD's gold calls grade the children; the planner, its plans and its
feedback are unchanged). This planner fixes the planning too: its tools are exactly the gold calls (plus
``text_eval()``), and its plan turns each gold call into instructions on the sentences it concerns, so a search with
it (``mcts_gold_planner``) shows whether search beats the copy when planning is right and only the reviser limits it.

The plan quotes every sentence of the current text (so no sentence is lost when the reviser sees only the plan, E.7)
and says, per sentence, what the gold calls ask of it, measured on the current text:

==================================  ==================================================================================
``word_count_check(n, rel)``        every sentence: shorten (the text has n words or more and must have fewer), or
                                    expand (it must have more); nothing when the text already meets it
``sentence_count_check(n, rel)``    every sentence: merge with the next one, or split in two; nothing when met
``sentence_length_check(n, rel)``   each sentence that breaks the bound: shorten or split it, or lengthen it
``keyword_keep_removal_check``      each sentence holding the keyword: keep it, or rewrite without it
``keyword_frequency_check``         each sentence: use the keyword more, or less; nothing when met
``sentence_modification_check``     the original's sentence i, found in the current text: keep it unchanged, or
                                    rewrite it in other words (a kept sentence gets that line alone)
==================================  ==================================================================================

A sentence no call concerns gets "Keep this sentence unchanged." The output is the Table 17 layout
(``eval.craft.react.parse_planner_output`` reads it back), so it flows through the same reviser, tools, observation
and guard as a model planner's answer. Not the paper's (its planner is a trained model); a control, like the oracle.

Pure: no ray, vllm, deepspeed, torch or transformers.
"""

from __future__ import annotations

from collections.abc import Sequence

from eval.craft.calls import CallError, ToolCall, parse_call
from eval.craft.text import REFERENCE, TextRules, keyword_count, sentence_lengths, sentence_pieces, split_sentences
from eval.craft.text import word_count as nltk_word_count

KEEP = "Keep this sentence unchanged."


def _need(observed: int, relation: str, target: int) -> str:
    """``fewer`` / ``more`` when ``observed`` breaks ``relation target``, else ""."""
    if relation == "less than":
        return "fewer" if observed >= target else ""
    if relation == "more than":
        return "more" if observed <= target else ""
    return "fewer" if observed > target else "more" if observed < target else ""


def _notes(call: ToolCall, piece: str, current: str, original: str, rules: TextRules) -> tuple[str, bool]:
    """What ``call`` asks of the sentence ``piece`` of ``current`` (and whether the sentence must stay as it is)."""
    name, args = call.name, call.args
    if name == "word_count_check":
        n, rel = args
        words = nltk_word_count(current, rules)
        need = _need(words, rel, n)
        if need == "fewer":
            return (f"Shorten this sentence: the whole text must have {_rel(rel)} {n} words (it has {words})."), False
        if need == "more":
            return (f"Add one relevant detail: the whole text must have {_rel(rel)} {n} words "
                    f"(it has {words})."), False
    elif name == "sentence_count_check":
        n, rel = args
        count = len(split_sentences(current, rules))
        need = _need(count, rel, n)
        if need == "fewer":
            return (f"Merge this sentence with the next one: the text must have {_rel(rel)} {n} sentences "
                    f"(it has {count})."), False
        if need == "more":
            return (f"Split this sentence in two: the text must have {_rel(rel)} {n} sentences "
                    f"(it has {count})."), False
    elif name == "sentence_length_check":
        n, rel = args
        length = (sentence_lengths(piece, rules) or [0])[0]
        need = _need(length, rel, n)
        if need == "fewer":
            return (f"Shorten or split this sentence: each sentence must have {_rel(rel)} {n} words "
                    f"(it has {length})."), False
        if need == "more":
            return (f"Lengthen this sentence: each sentence must have {_rel(rel)} {n} words (it has {length})."), False
    elif name == "keyword_keep_removal_check":
        keyword, rel = args
        if rel == "remove" and keyword in piece:
            return (f'Rewrite this sentence without the word "{keyword}".'), False
        if rel == "keep" and keyword_count(piece, keyword, rules):
            return (f'Keep the word "{keyword}" in this sentence.'), False
    elif name == "keyword_frequency_check":
        keyword, n, rel = args
        count = keyword_count(current, keyword, rules)
        need = _need(count, rel, n)
        if need:
            return (f'Use the word "{keyword}" {"less" if need == "fewer" else "more"} often: the text must have it '
                    f"{_rel(rel)} {n} times (it has it {count} times)."), False
    elif name == "sentence_modification_check":
        ids, rel = args
        targets = split_sentences(original, rules)
        for i in ids:
            if 1 <= i <= len(targets) and targets[i - 1] and targets[i - 1] in piece:
                if rel == "unchange":
                    return KEEP, True
                return "Rewrite this sentence in other words; keep its meaning.", False
    return "", False


def _rel(relation: str) -> str:
    return {"less than": "fewer than", "more than": "more than"}.get(relation, "exactly")


def gold_calls_parsed(gold_calls: Sequence[str]) -> list[ToolCall]:
    """The gold calls that parse (a CORD call that does not is skipped here and fails in the accuracy, as ever)."""
    out = []
    for call in gold_calls:
        parsed = parse_call(call)
        if not isinstance(parsed, CallError) and parsed.name not in ("text_eval", "detect_keyword"):
            out.append(parsed)
    return out


def gold_planner_output(current: str, original: str, gold_calls: Sequence[str], rules: TextRules = REFERENCE) -> str:
    """The gold planner's answer on ``current`` (the text being revised) for an instance with ``gold_calls``.

    >>> out = gold_planner_output("The cat sat here. The dog ran off.", "The cat sat here. The dog ran off.",
    ...                           ['sentence_modification_check([1], "unchange")',
    ...                            'keyword_keep_removal_check("dog", "remove")'])
    >>> print(out)
    ###THOUGHT: The instruction's constraints are checked with these tools; the plan changes only what they require.
    ###ACTION:
       -###TOOLS:
    sentence_modification_check([1], "unchange")
    keyword_keep_removal_check("dog", "remove")
    text_eval()
       -###PLAN:
    Sentence: "The cat sat here."; Improvement Plan: "Keep this sentence unchanged."
    Sentence: "The dog ran off."; Improvement Plan: "Rewrite this sentence without the word "dog"."
    """
    calls = gold_calls_parsed(gold_calls)
    lines = []
    for piece in sentence_pieces(current, rules):
        notes: list[str] = []
        keep = False
        for call in calls:
            note, fixed = _notes(call, piece, current, original, rules)
            keep |= fixed
            if note and note not in notes:
                notes.append(note)
        plan = KEEP if keep or not notes else " ".join(notes)
        lines.append(f'Sentence: "{piece}"; Improvement Plan: "{plan}"')
    tools = [c.text for c in calls] + ["text_eval()"]
    thought = "The instruction's constraints are checked with these tools; the plan changes only what they require."
    return ("###THOUGHT: " + thought + "\n###ACTION:\n   -###TOOLS:\n" + "\n".join(tools) + "\n   -###PLAN:\n"
            + "\n".join(lines))
