"""eval.craft_agent: Direct, Iter, the planner/reviser agent and TG-MCTS wiring, with a scripted fake model."""


from eval.craft_agent import AgentConfig, Systems, expander, quality, scorer
from eval.craft_mcts import MCTSConfig, run_search
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


def test_agent_feeds_tool_feedback_back_and_stops_when_the_planners_checks_hold():
    script = Script([PLAN, PLAN, PLAN], ["The cat sat.\nIt was happy.", "The happy cat sat."])
    run = systems(script).agent(INSTRUCTION, TEXT)
    assert run.revision == "The happy cat sat."
    assert run.stop_reason == "all_constraints_met"
    assert [s["own_accuracy"] for s in run.steps] == [0.0, 1.0]
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
    # planner samples at its temperature with a per-step seed; the reviser is greedy
    assert script.seen[0][1]["temperature"] == 0.7 and script.seen[2][1]["seed"] == 1000
    assert script.seen[1][1]["temperature"] == 0.0


def test_agent_keeps_the_text_when_the_guard_flags_a_revision_and_counts_parse_errors():
    script = Script(["no sections here", PLAN], ["I'm sorry, but I cannot help with that."])
    run = systems(script, max_steps=2).agent(INSTRUCTION, TEXT)
    assert run.revision == TEXT
    assert run.stop_reason == "max_steps"
    assert run.guard_flags == {"empty": 1, "refusal": 1}  # step 1: no plan -> no revision; step 2: refusal
    assert run.parse_errors == 1
    assert len(script.seen) == 3  # a plan-less step sends nothing to the reviser


def test_direct_and_iter_rounds():
    script = Script([], ["r1", "r2", "r3"])
    sys = systems(script, iter_rounds=3)
    run = sys.iterate(INSTRUCTION, TEXT)
    assert run.revision == "r3" and len(run.steps) == 3
    assert script.seen[0][0] == [{"role": "user", "content": f"{INSTRUCTION}\n\n{TEXT}"}]
    second = script.seen[1][0][0]["content"]
    assert TEXT in second and "Your previous revision of the text above:\n\nr1" in second
    assert "r2" in script.seen[2][0][0]["content"]


def test_mcts_wiring_stops_when_a_child_meets_every_constraint():
    # width 2: the first expansion's children are "two sentences" (fails) and "one sentence" (holds)
    script = Script([PLAN, PLAN], ["The cat sat.\nIt was happy.", "The happy cat sat."])
    sys = systems(script)
    cfg = MCTSConfig(width=2, max_iterations=3, max_depth=2)
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
