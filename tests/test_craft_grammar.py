"""The CRAFT planner's grammar (eval.craft.grammar) against llguidance, our ReAct parser and the tools' call parser."""

from __future__ import annotations

import random

import pytest

from eval.craft.calls import CallError, parse_call
from eval.craft.grammar import planner_grammar
from eval.craft.react import parse_planner_output
from tests.grammar_check import accepts, random_walk

SENTENCES = ["The team have finished there project last week.", "It was a big relief.",
             'Everyone said "well done" in the office.']
ANSWER = ('###THOUGHT: Keep it short.\n###ACTION:\n   -###TOOLS:\ntext_eval()\nword_count_check(40, "less than")\n'
          'sentence_modification_check([2], "unchange")\n   -###PLAN:\n'
          'Sentence: "The team have finished there project last week."; Improvement Plan: "Fix their."\n')


def test_table_17_answers_are_accepted_and_malformed_ones_rejected(compiler):
    grammar = planner_grammar(320, SENTENCES)
    assert accepts(compiler, grammar, ANSWER)
    assert parse_planner_output(ANSWER).errors == []
    # a plan line must quote a sentence of the current text verbatim
    assert not accepts(compiler, grammar, ANSWER.replace("there project", "their project"))
    # unknown tools, a relation outside E.2's words, a missing PLAN: rejected
    for bad in (ANSWER.replace("text_eval()", "os.system('x')"),
                ANSWER.replace('"less than"', '"fewer than"'),
                ANSWER.split("   -###PLAN:")[0]):
        assert not accepts(compiler, grammar, bad)
    # free sentences when no text is given (no quotes or newlines inside)
    assert accepts(compiler, planner_grammar(320), ANSWER.replace("there project", "their project"))
    # a sentence with a control character (CORD has a form feed in one text) is left out, never a grammar error
    compiler[0].matcher(planner_grammar(320, ["s c [ v83.02 : v i X r a \x0cproducts such as Ansible.", "Ok."]))


def test_token_budget_arithmetic():
    with pytest.raises(ValueError, match="no room for one plan line"):
        planner_grammar(64, SENTENCES)
    with pytest.raises(ValueError, match="max_calls"):
        planner_grammar(320, max_calls=0)
    # fixed parts ~30 tokens, thought 24, 3 calls x 20: (1000 - 114) // (16 + 25 + 20) = 14 lines, capped at 8
    assert planner_grammar(1000, SENTENCES).count("plan_line") == 8 + 1  # 1 + 7 optional in `plan`, the rule head
    # 320 tokens: (320 - 114) // 61 = 3 lines
    assert planner_grammar(320, SENTENCES).count("plan_line") == 3 + 1


def test_random_walks_always_parse_and_call_only_known_tools(compiler):
    """Any token the mask allows, chosen at random (a worst-case planner), gives a parseable answer in budget."""
    max_tokens = 320
    grammar = planner_grammar(max_tokens, SENTENCES)
    rng = random.Random(0)
    for walk in range(2):
        matcher, text = random_walk(compiler, grammar, max_tokens, rng)
        assert matcher.is_accepting(), f"walk {walk}: not a complete answer in {max_tokens} tokens: {text!r}"
        step = parse_planner_output(text)
        assert step.errors == [], (walk, step.errors, text)
        assert step.tool_calls and not any(isinstance(parse_call(c), CallError) for c in step.tool_calls), text
        assert step.plan and all(p.sentence in SENTENCES for p in step.plan), text
