"""The gold planner (eval.craft.gold_plan, issue 53 item 6): CORD's gold calls as the planner's tools and a plan that
follows them, the control beside the oracle R_c list. Hand-worked plans; the search with it sends no planner request.
"""

from __future__ import annotations

import doctest

import pytest

from eval.craft import gold_plan
from eval.craft.agent import AgentConfig, Systems, expander
from eval.craft.gold_plan import KEEP, gold_planner_output
from eval.craft.guard import GuardConfig
from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig
from eval.craft.react import parse_planner_output
from eval.craft.tools import tool_f1
from tests.craft_fake import Script

TEXT = ("The council met on Monday evening in the old town hall. It approved the new library budget after a long and "
        "heated debate. Residents welcomed the decision. Work on the library starts in spring.")
GOLD = ['sentence_modification_check([1], "unchange")', 'keyword_keep_removal_check("library", "remove")',
        'sentence_length_check(10, "less than")']


def test_doctests_pass():
    assert doctest.testmod(gold_plan).failed == 0


def test_the_plan_follows_each_gold_call_sentence_by_sentence():
    step = parse_planner_output(gold_planner_output(TEXT, TEXT, GOLD))
    assert not step.errors
    assert step.tool_calls == [*GOLD, "text_eval()"]
    assert tool_f1(step.tool_calls, GOLD) == 1.0  # the gold planner's tools are the gold calls
    plans = {line.sentence: line.improvement_plan for line in step.plan}
    assert list(plans) == ["The council met on Monday evening in the old town hall.",
                           "It approved the new library budget after a long and heated debate.",
                           "Residents welcomed the decision.", "Work on the library starts in spring."]
    # sentence 1 must stay: that line alone, though it has 11 words (>= 10)
    assert plans["The council met on Monday evening in the old town hall."] == KEEP
    # sentence 2: 12 words and "library": both calls speak
    assert plans["It approved the new library budget after a long and heated debate."] == (
        'Rewrite this sentence without the word "library". Shorten or split this sentence: each sentence must '
        "have fewer than 10 words (it has 12).")
    assert plans["Residents welcomed the decision."] == KEEP  # no call concerns it
    assert plans["Work on the library starts in spring."] == 'Rewrite this sentence without the word "library".'


@pytest.mark.parametrize("call, text, want", [
    ('word_count_check(10, "less than")', "One two three four five. Six seven eight nine ten.",
     "Shorten this sentence: the whole text must have fewer than 10 words (it has 12)."),  # NLTK counts the dots
    ('word_count_check(20, "more than")', "One two three. Four five.",
     "Add one relevant detail: the whole text must have more than 20 words (it has 7)."),
    ('sentence_count_check(2, "less than")', "One. Two.",
     "Merge this sentence with the next one: the text must have fewer than 2 sentences (it has 2)."),
    ('sentence_count_check(2, "more than")', "One. Two.",
     "Split this sentence in two: the text must have more than 2 sentences (it has 2)."),
    ('word_count_check(50, "less than")', "One two three. Four five.", KEEP),  # already met: nothing to do
])
def test_text_level_calls_speak_only_when_the_text_breaks_them(call, text, want):
    step = parse_planner_output(gold_planner_output(text, text, [call]))
    assert {line.improvement_plan for line in step.plan} == {want}


def test_a_search_with_the_gold_planner_asks_no_planner_model():
    # two children per expansion, one expansion: the reviser answers twice; no request reaches the planner queue
    text = "The cat sat on the mat. The library dog slept by the door."
    gold = ['keyword_keep_removal_check("library", "remove")']
    script = Script([], ["The cat sat on the mat.\nThe dog slept by the door.",
                         "The cat sat on the mat.\nThe old dog slept by the door."])
    systems = Systems(AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False,
                                  unplanned_sentences="keep"), script, script)
    planner = lambda current: gold_planner_output(current, text, gold)
    cfg = MCTSConfig(width=2, max_iterations=1, rc_tools="oracle", guard=GuardConfig(min_len_ratio=0.0))
    result = run_search(text, systems.initial_messages("Remove library.", text), expander(systems, text, planner),
                        systems.scorer, cfg, fixed_calls=gold)
    assert len(script.seen) == 2 and all(m[0]["role"] == "user" for m, _ in script.seen)  # reviser prompts only
    assert result.counts.model_calls == 2  # no planner call counted
    assert result.tree[1]["tool_calls"] == [*gold, "text_eval()"]
    assert result.text in ("The cat sat on the mat. The dog slept by the door.",
                           "The cat sat on the mat. The old dog slept by the door.")
    assert "library" not in result.text
