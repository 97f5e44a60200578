"""eval.craft.agent: Direct, Iter, the planner/reviser agent and TG-MCTS wiring, with a scripted fake model."""


import pytest

from eval.craft.agent import AgentConfig, Systems, expander, quality, scorer
from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig
from eval.craft.tree import Proposal
from tests.craft_fake import Script

TEXT = "The cat sat. It was happy."
INSTRUCTION = "Polish the text. Use exactly one sentence"
PLAN = ('###THOUGHT: One sentence is asked.\n###ACTION:\n   -###TOOLS:\nsentence_count_check(1, "equal")\n'
        '   -###PLAN:\nSentence: "The cat sat."; Improvement Plan: "Merge."\n'
        'Sentence: "It was happy."; Improvement Plan: "Merge."')


def systems(script, **kw):
    cfg = AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False, **kw)
    return Systems(cfg, script, script)


def test_quality_is_word_level_similarity():
    assert quality("a b c d", "a b x d") == 75.0  # 2 * 3 matched / 8 words
    assert quality("", "") == 100.0
    assert quality("a b", "") == 0.0


def test_agent_feeds_tool_feedback_back_and_stops_when_the_planners_checks_hold_with_the_knob():
    script = Script([PLAN, PLAN, PLAN], ["The cat sat.\nIt was happy.", "The happy cat sat."])
    run = systems(script, stop_when_all_met=True).agent(INSTRUCTION, TEXT)
    assert run.revision == "The happy cat sat."
    assert run.stop_reason == "all_constraints_met"
    assert [s["accuracy"] for s in run.steps] == [0.0, 1.0]
    assert [s["n_checks"] for s in run.steps] == [1, 1]
    # 2 planner + 2 reviser calls; the second planner request is the first one + (its answer, the observation)
    planner_calls = [m for m, _ in script.seen if m[0]["role"] == "system"]
    assert len(script.seen) == 4 and len(planner_calls) == 2
    first, second = planner_calls
    assert len(second) == len(first) + 2 and second[-2] == {"role": "assistant", "content": PLAN}
    observation = second[-1]["content"]
    assert observation.startswith("###OBSERVATION: The revised text:\nThe cat sat. It was happy.")
    assert "- The polished text contains 2 sentences, but it should contain exactly 1" in observation
    # the reviser read the plan lines, not the text
    assert 'Sentence: "It was happy."; Improvement Plan: "Merge."' in script.seen[1][0][0]["content"]
    # planner and reviser sample at D.6's 0.7 with a per-step seed
    assert script.seen[0][1]["temperature"] == 0.7 and script.seen[2][1]["seed"] == 1000
    assert script.seen[1][1]["temperature"] == 0.7 and script.seen[3][1]["seed"] == 1000
    assert "grammar" not in script.seen[0][1]  # planner_grammar is off by default (the paper's planner needs none)


def test_agent_keeps_the_text_when_the_guard_flags_a_revision_and_counts_parse_errors():
    script = Script(["no sections here", PLAN], ["I'm sorry, but I cannot help with that."])
    run = systems(script, max_steps=2).agent(INSTRUCTION, TEXT)
    assert run.revision == TEXT
    assert run.stop_reason == "max_steps"
    assert run.guard_flags == {"empty": 1, "refusal": 1}  # step 1: no plan -> no revision; step 2: refusal
    assert run.parse_errors == 1
    assert len(script.seen) == 3  # a plan-less step sends nothing to the reviser


R1, R2, R3 = "The cat sat down. It was happy.", "The cat sat. It was glad.", "The cat sat. It was very glad."


def test_direct_and_iter_rounds():
    script = Script([], [R1, R2, R3])
    sys = systems(script, iter_rounds=3)
    run = sys.iterate(INSTRUCTION, TEXT)
    assert run.revision == R3 and len(run.steps) == 3 and run.guard_flags == {}
    assert script.seen[0][0] == [{"role": "user", "content": f"{INSTRUCTION}\n\n{TEXT}"}]
    second = script.seen[1][0][0]["content"]
    assert TEXT in second and f"Your previous revision of the text above:\n\n{R1}" in second
    assert R2 in script.seen[2][0][0]["content"]
    assert {s["temperature"] for _, s in script.seen} == {0.7}  # D.6: the reviser samples at 0.7


def test_direct_and_iter_fall_back_under_the_same_guard_rule_as_the_agent():
    # wrong result 3: Direct and Iter kept refusals and collapsed answers while the agent and the search fell back
    sys = systems(Script([], ["I'm sorry, but I cannot help with that."]))
    run = sys.direct(INSTRUCTION, TEXT)
    assert (run.revision, run.guard_flags) == (TEXT, {"refusal": 1})  # Direct: a flagged answer -> the input
    script = Script([], [R1, "Cat.", R3])  # round 2 collapses (1 word < 0.5 x 6): round 3 revises round 1's text
    run = systems(script, iter_rounds=3).iterate(INSTRUCTION, TEXT)
    assert run.guard_flags == {"collapsed": 1} and [s["accepted"] for s in run.steps] == [True, False, True]
    assert f"Your previous revision of the text above:\n\n{R1}" in script.seen[2][0][0]["content"]
    assert run.revision == R3


def test_a_misreading_planner_does_not_end_the_agent_after_one_step():
    # wrong result 2: the planner reads "fewer than 5 words" as "more than"; its own check holds at once, which
    # ended the agent after step 1. Now the step reward (R_g + 100 x acc on its first tool list) must stall
    misread = PLAN.replace('sentence_count_check(1, "equal")', 'word_count_check(5, "more than")')
    script = Script([misread] * 3, ["The cat sat.\nIt was happy."] * 3)
    run = systems(script).agent("Polish the text. Use fewer than 5 words", TEXT)
    assert [s["accuracy"] for s in run.steps] == [1.0, 1.0, 1.0]  # its own (wrong) check holds every time
    # step 1 sets the best reward (100 + 100); steps 2 and 3 do not beat it: patience 2 stops after 3 steps
    assert [s["reward"] for s in run.steps] == [200.0, 200.0, 200.0]
    assert run.stop_reason == "patience" and len(run.steps) == 3
    run = systems(Script([misread], ["The cat sat.\nIt was happy."]), stop_when_all_met=True).agent(
        "Polish the text. Use fewer than 5 words", TEXT)
    assert run.stop_reason == "all_constraints_met" and len(run.steps) == 1  # the early stop is a knob


def test_copying_the_input_with_only_text_eval_no_longer_reaches_the_maximum_reward():
    # wrong result 1: with each child graded on its own calls and an empty check list scoring 1, copying the input
    # and calling only text_eval() earned R_g 100 + R_c 100 = 200, the maximum, above a real revision
    original = "The cat sat on the mat. It was a very happy cat."
    real = "The cat sat on the mat. It was happy."
    check = 'word_count_check(12, "less than")'
    proposals = {0: [Proposal(text=real, tool_calls=(check,)), Proposal(text=original, tool_calls=("text_eval()",))]}
    cfg = MCTSConfig(max_iterations=1, width=2)
    result = run_search(original, [], lambda r: proposals.get(r.node_id, []), scorer, cfg)
    real_node, copy_node = result.tree[1], result.tree[2]
    # real: 11 NLTK tokens (7 + 4) < 12 holds; quality = 100 * 2 * 8 matched / (12 + 9) words = 76.19
    assert real_node["reward"] == pytest.approx(100 * 16 / 21 + 100)
    # copy: graded on the search's one frozen list (the planner's first calls): 14 tokens, not < 12 -> R_c 0
    assert copy_node["reward"] == pytest.approx(100.0)
    assert result.rc_calls == [check] and result.text == real
    # graded on its own calls (rc_tools: node), the copy checks nothing, which scores 0, never 1
    result = run_search(original, [], lambda r: proposals.get(r.node_id, []), scorer,
                        MCTSConfig(max_iterations=1, width=2, rc_tools="node"))
    assert result.tree[2]["reward"] == pytest.approx(100.0) and result.text == real


def test_mcts_wiring_stops_when_a_child_meets_every_constraint_with_the_knob():
    # width 2: the first expansion's children are "two sentences" (fails) and "one sentence" (holds)
    script = Script([PLAN, PLAN], ["The cat sat.\nIt was happy.", "The happy cat sat."])
    sys = systems(script)
    cfg = MCTSConfig(width=2, max_iterations=3, max_depth=2, stop_when_all_met=True)
    result = run_search(TEXT, sys.initial_messages(INSTRUCTION, TEXT), expander(sys, TEXT), scorer, cfg)
    assert result.stop_reason == "all_constraints_met"
    assert result.text == "The happy cat sat."
    assert result.counts.model_calls == 4 and result.counts.iterations == 1
    # planner seeds differ per sample (seed + i)
    seeds = [s["seed"] for m, s in script.seen if m[0]["role"] == "system"]
    assert len(set(seeds)) == 2
    # reward of the winning child: R_g = quality + 100 * accuracy
    node = result.tree[result.node_id]
    assert abs(node["reward"] - (quality(TEXT, "The happy cat sat.") + 100.0)) < 1e-9


def test_w_o_feedback_ablation_drops_every_tool_feedback_from_the_observation():
    # Table 7's "w/o Feedback": agent.quality_feedback=false only drops the E.8 suggestions; tool_feedback=false
    # leaves the revised text alone in the observation
    with_text_eval = PLAN.replace('sentence_count_check(1, "equal")', 'text_eval()\nsentence_count_check(1, "equal")')
    sys = systems(Script([with_text_eval], ["The happy cat sat."]))
    full = sys.steps(sys.initial_messages(INSTRUCTION, TEXT), TEXT, TEXT, 1, 0)[0]
    # text_eval() -> score: the quality proxy, 100 * 2 * 3 matched / 10 words
    assert "Constraint check feedback:" in full.observation and "Text quality score: 60.00" in full.observation
    sys = systems(Script([with_text_eval], ["The happy cat sat."]), tool_feedback=False)
    bare = sys.steps(sys.initial_messages(INSTRUCTION, TEXT), TEXT, TEXT, 1, 0)[0]
    assert "feedback" not in bare.observation.lower() and "The happy cat sat." in bare.observation
