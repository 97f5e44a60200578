"""A grammar for the CRAFT planner's answer (paper 002, Table 17): ``###THOUGHT / ###TOOLS / ###PLAN`` that always parses.

Why: a small planner (SmolLM2-135M on CPU) almost never writes the Table 17 layout on its own, so every step has
no plan, the reviser gets nothing and the agent and the search return the input. Decoding under this grammar (the
judges' treatment, ``eval.judging.grammar``; hf: llguidance masks, vLLM: its ``guidance`` backend) makes every
finished answer parse with ``eval.craft.react.parse_planner_output``: a bounded thought, 1 to ``max_calls`` tool
calls that pass the whitelisting parser (``eval.craft.calls``: known names, literal arguments of the right types,
the E.2 relation words), and 1 to ``max_plan_lines`` plan lines. With ``sentences`` given (the current text's
sentences), a plan line can only quote one of them verbatim, so every plan line points at a real sentence. What
the model writes in the thought, the call arguments and the improvement plans stays free, within token bounds
that keep the whole answer inside ``max_tokens``. Not the paper's setting (its planner is a trained 8B model):
a declared deviation, the knob is ``agent.planner_grammar``.

Pure: no ray, vllm, torch or llguidance import; the engines compile the string.
"""

from __future__ import annotations

from collections.abc import Sequence

from eval.lark_text import lark_string, up_to

RELATIONS = '"\\"less than\\"" | "\\"more than\\"" | "\\"equal\\""'
_HEAD = "###THOUGHT: "
_ACTION = "\n###ACTION:\n   -###TOOLS:\n"
_PLAN = "   -###PLAN:\n"
_AFTER = '"; Improvement Plan: "'
_SENTENCE = 'Sentence: "'
_CLOSE = '"\n'
_MORE_IDS = '", " num'
# tokens of the fixed parts of a call line / a plan line, an upper bound (a BPE token covers >= 2 characters
# of this ASCII text on average; the bound assumes 2)
_CALL_TOKENS = 20
_PLAN_FIXED = 16


def planner_grammar(max_tokens: int, sentences: Sequence[str] = (), *, max_calls: int = 3,
                    max_plan_lines: int = 8, thought_tokens: int = 24, improvement_tokens: int = 20,
                    max_sentence_tokens: int = 48) -> str:
    """The Lark grammar (llguidance dialect) of one planner answer within ``max_tokens`` completion tokens.

    Args:
        max_tokens: The answer's token cap. The plan gets as many lines (up to ``max_plan_lines``) as fit after
            the thought and ``max_calls`` call lines; the model may end after any complete plan line.
        sentences: The current text's sentences. Given: a plan line quotes one of them verbatim (sentences over
            ``2 * max_sentence_tokens`` characters or holding a control character are left out; if none is left the
            sentence is free text). Empty: the sentence is free text without quotes or newlines.
        max_calls: Tool-call lines at most (at least 1).
        max_plan_lines: Plan lines at most (at least 1).
        thought_tokens / improvement_tokens / max_sentence_tokens: Token bounds of the free parts.

    Raises:
        ValueError: ``max_tokens`` too small for the thought, the calls and one plan line, or a count below 1.

    >>> g = planner_grammar(256, ["It rains.", 'He said "no".'])
    >>> 'quoted: "It rains.' in g
    True
    """
    if max_calls < 1 or max_plan_lines < 1:
        raise ValueError(f"max_calls and max_plan_lines must be >= 1, got {max_calls}, {max_plan_lines}")
    quotable = [s for s in dict.fromkeys(s.strip() for s in sentences)
                if s and s.isprintable() and len(s) <= 2 * max_sentence_tokens]
    fixed = (len(_HEAD) + len(_ACTION) + len(_PLAN)) // 2 + 4
    sentence_cost = max((len(s) + 1) // 2 for s in quotable) if quotable else max_sentence_tokens
    line_cost = _PLAN_FIXED + sentence_cost + improvement_tokens
    lines = min(max_plan_lines, (max_tokens - fixed - thought_tokens - max_calls * _CALL_TOKENS) // line_cost)
    if lines < 1:
        raise ValueError(f"max_tokens {max_tokens} leaves no room for one plan line (about "
                         f"{fixed + thought_tokens + max_calls * _CALL_TOKENS + line_cost} tokens); raise it")
    # a quoted sentence carries the closing quote and the next label, so no alternative is a prefix of another
    # (the lexer never backtracks)
    if quotable:
        quoted = ["quoted: " + " | ".join(lark_string(s + _AFTER) for s in quotable)]
    else:
        quoted = [f"quoted: sentence {lark_string(_AFTER)}",
                  f"sentence[max_tokens={max_sentence_tokens}]: /[^\"\\n]+/"]
    rules = [
        f"start: {lark_string(_HEAD)} thought {lark_string(_ACTION)} calls {lark_string(_PLAN)} plan",
        f"thought[max_tokens={thought_tokens}]: /[^\\n#]+/",
        f"calls: call_line {up_to('call_line', max_calls - 1)}",
        'call_line: call "\\n"',
        "call: " + " | ".join(_CALLS),
        f"plan: plan_line {up_to('plan_line', lines - 1)}",
        f"plan_line: {lark_string(_SENTENCE)} quoted improvement {lark_string(_CLOSE)}",
        *quoted,
        f"improvement[max_tokens={improvement_tokens}]: /[^\"\\n]+/",
        "num: /[1-9][0-9]{0,3}/",
        f"ids: num | {lark_string('[')} num {up_to(_MORE_IDS, 3)} {lark_string(']')}",
        "keyword[max_tokens=12]: /[^\"\\n]+/",
        f"relation: {RELATIONS}",
    ]
    return "\n".join(rules) + "\n"


# the eight E.2 tools with typed arguments, in the form eval.craft.calls parses (ints, quoted keywords, relations)
_CALLS = (
    '"text_eval()"',
    '"detect_keyword()"',
    '"word_count_check(" num ", " relation ")"',
    '"sentence_count_check(" num ", " relation ")"',
    '"sentence_length_check(" num ", " relation ")"',
    '"keyword_keep_removal_check(\\"" keyword "\\", " ("\\"keep\\"" | "\\"remove\\"") ")"',
    '"keyword_frequency_check(\\"" keyword "\\", " num ", " relation ")"',
    '"sentence_modification_check(" ids ", " ("\\"change\\"" | "\\"unchange\\"") ")"',
)
