"""TG-MCTS (eval.craft.mcts, eval.craft.tree) on hand-worked trees (the degenerate guard: tests/test_craft_guard.py).

The fake policy is a script (tests/craft_script.py): node id -> the children ``expand`` returns; the fake scorer looks
each revision up in a table of (R_g, accuracy, n_checks). With the paper's reward R = R_g + 100 * accuracy every
number below is worked by hand. Pure: no model, no Ray.
"""

from __future__ import annotations

import doctest
import json
import math
import random

import pytest

from core.config import build
from core.errors import ConfigError
from eval.craft import guard as craft_guard
from eval.craft import mcts as craft_mcts
from eval.craft import tree as craft_tree
from eval.craft.mcts import TGMCTS, combine_reward, run_search, uct
from eval.craft.mcts_config import MCTSConfig
from eval.craft.tree import Node, Proposal, RewardTerms, SearchResult
from tests.craft_script import FILLER, INITIAL, NO_STOPS, ORIGINAL, SCENARIO_A, Script, nodes, search, text


def test_doctests_pass():
    for module in (craft_mcts, craft_tree, craft_guard):
        assert doctest.testmod(module).failed == 0


# -----------------------------------------------------------------------------
# Arithmetic


def test_uct_arithmetic():
    # 0.5 + 0.2 * sqrt(ln 6 / 2) = 0.5 + 0.2 * sqrt(1.7917595 / 2) = 0.5 + 0.2 * 0.9465092 = 0.6893018
    assert uct(0.5, 2, 6, 0.2) == pytest.approx(0.6893018, abs=1e-7)
    # c2 in scenario A after two expansions: V = 425 / 4 = 106.25, N = 4, N(root) = 6:
    # 106.25 + 0.2 * sqrt(1.7917595 / 4) = 106.25 + 0.2 * 0.6692831 = 106.3838566
    assert uct(106.25, 4, 6, 0.2) == pytest.approx(106.3838566, abs=1e-7)
    # ln 1 = 0: a single visit of the parent adds no exploration bonus
    assert uct(7.0, 1, 1, 0.2) == 7.0
    assert uct(0.0, 0, 5, 0.2) == math.inf


def test_combine_reward_terms_weights_and_switches():
    terms = RewardTerms(quality=60.0, accuracy=0.75, n_checks=4)
    assert combine_reward(terms, MCTSConfig()) == pytest.approx(135.0)  # 60 + 100 * 0.75
    assert combine_reward(terms, MCTSConfig(use_constraints=False)) == pytest.approx(60.0)  # w/o R_c
    assert combine_reward(terms, MCTSConfig(use_quality=False)) == pytest.approx(75.0)  # w/o R_g
    assert combine_reward(terms, MCTSConfig(reward_scale=1 / 200)) == pytest.approx(0.675)  # 135 / 200
    weighted = MCTSConfig(quality_weight=0.5, constraint_weight=0.5)  # the authors' code: a weighted mean
    assert combine_reward(terms, weighted) == pytest.approx(67.5)
    assert combine_reward(terms, MCTSConfig(constraint_scale=1.0)) == pytest.approx(60.75)  # R_c as a bare fraction


# -----------------------------------------------------------------------------
# Selection, expansion, backpropagation on scenario A


def test_first_expansion_creates_k_children_and_backs_up_each():
    script, result = search(SCENARIO_A, 1)
    tree = nodes(result)
    assert [r.node_id for r in script.requests] == [0]
    assert script.requests[0].k == 3 and script.requests[0].depth == 0
    assert tree[0]["children"] == [1, 2, 3]
    for i, reward in zip((1, 2, 3), (90.0, 110.0, 50.0)):  # 40 + 50, 60 + 50, 50 + 0
        assert tree[i]["parent_id"] == 0 and tree[i]["depth"] == 1
        assert tree[i]["reward"] == reward and tree[i]["visits"] == 1 and tree[i]["value_sum"] == reward
    assert (tree[0]["visits"], tree[0]["value_sum"]) == (3, 250.0)
    assert tree[0]["value"] == pytest.approx(250 / 3)
    assert result.counts.model_calls == 9 and result.counts.children == 3 and result.counts.scored == 3


def test_selection_and_backpropagation_numbers():
    script, result = search(SCENARIO_A, 3)
    tree = nodes(result)
    # iteration 2: all root children have N = 1 and N(root) = 3, so the bonus is equal (0.2 * sqrt(ln 3) = 0.2096)
    # and the highest V wins: c2 (110.2096) over c1 (90.2096) and c3 (50.2096).
    # iteration 3: c1 90.2677, c2 106.3839, c3 50.2677 -> c2; under c2 (N = 4): c4 120.2355, c6 115.2355, c5 80.2355
    assert [r.node_id for r in script.requests] == [0, 2, 4]
    assert [r.depth for r in script.requests] == [0, 1, 2]
    assert tree[4]["children"] == [7, 8, 9] and {tree[i]["depth"] for i in (7, 8, 9)} == {3}
    # rewards c7 130, c8 60, c9 100 (sum 290) back up through c4, c2 and the root:
    expected = {
        0: (9, 250 + 315 + 290),  # 3 + 3 + 3 visits; 90+110+50 + 120+80+115 + 130+60+100
        1: (1, 90), 2: (7, 110 + 315 + 290), 3: (1, 50),
        4: (4, 120 + 290), 5: (1, 80), 6: (1, 115),
        7: (1, 130), 8: (1, 60), 9: (1, 100),
    }
    for node_id, (visits, value_sum) in expected.items():
        assert (tree[node_id]["visits"], tree[node_id]["value_sum"]) == (visits, pytest.approx(value_sum))
    assert tree[2]["value"] == pytest.approx(715 / 7)
    assert result.stop_reason == "max_iterations" and result.counts.iterations == 3


def test_large_exploration_constant_visits_the_less_visited_child():
    # after two expansions, alpha = 30: c1 = 90 + 30 * 1.3385662 = 130.1570 beats c2 = 106.25 + 30 * 0.6692831 = 126.3285
    script, _ = search(SCENARIO_A, 3, exploration=30.0)
    assert [r.node_id for r in script.requests] == [0, 2, 1]


def test_reward_scale_changes_exploration_balance():
    # rewards / 200: c1 V = 0.45, c2 V = 0.53125; alpha 0.2: c1 = 0.45 + 0.2677 = 0.7177 > c2 0.53125 + 0.1339 = 0.6651
    script, result = search(SCENARIO_A, 3, reward_scale=1 / 200)
    assert [r.node_id for r in script.requests] == [0, 2, 1]
    assert nodes(result)[2]["value"] == pytest.approx(425 / 4 / 200)


def test_each_child_gets_its_own_history():
    script = Script(SCENARIO_A)
    searcher = TGMCTS(ORIGINAL, INITIAL, MCTSConfig(max_iterations=3, **NO_STOPS))
    for _ in range(3):
        request = searcher.select()
        scoring = searcher.add_children(request, script.expand(request))
        searcher.record_scores(scoring, script.score(ORIGINAL, list(scoring.revisions), scoring.tool_calls))
    h4 = script.requests[2].history  # root prompt, then c2's turns, then c4's turns
    assert h4 == INITIAL + [
        {"role": "assistant", "content": "plan c2"}, {"role": "user", "content": "obs c2"},
        {"role": "assistant", "content": "plan c4"}, {"role": "user", "content": "obs c4"},
    ]
    # a sibling's history holds its own turns only (the reference code appends siblings to one shared list)
    assert craft_tree.history(searcher.nodes, 5)[-2:] == [
        {"role": "assistant", "content": "plan c5"}, {"role": "user", "content": "obs c5"}]
    assert len(craft_tree.history(searcher.nodes, 5)) == 6
    # the search hands out copies: a caller that edits its request leaves the tree alone
    h4[0]["content"] = "mutated by the caller"
    assert craft_tree.history(searcher.nodes, 4)[0]["content"] == "framework"


# -----------------------------------------------------------------------------
# Budgets and stops


def test_iteration_budget():
    script, result = search(SCENARIO_A, 2)
    assert result.stop_reason == "max_iterations"
    assert (result.counts.iterations, result.counts.expansions, result.counts.children) == (2, 2, 6)
    assert len(script.requests) == 2


def test_depth_budget_marks_terminal_and_exhausts():
    chain = {0: [("a", 10, 0.5, 2)], 1: [("b", 20, 0.5, 2)], 2: [("c", 30, 0.5, 2)]}
    script, result = search(chain, 30, width=1, max_depth=2)
    tree = nodes(result)
    assert [r.depth for r in script.requests] == [0, 1]  # the depth-2 node is never expanded
    assert tree[2]["terminal"] and not tree[2]["expanded"]
    assert tree[1]["exhausted"] and tree[0]["exhausted"]
    assert result.stop_reason == "exhausted" and result.counts.iterations == 2


def test_early_stop_when_every_constraint_holds():
    children = {**SCENARIO_A, 4: [("c7", 80, 0.5, 2), ("c8", 10, 1.0, 2), ("c9", 50, 0.5, 2)]}
    script, result = search(children, 30, stop_when_all_met=True)
    assert result.stop_reason == "all_constraints_met"
    assert result.counts.iterations == 3 and len(script.requests) == 3
    # c8: 10 + 100 * 1.0 = 110 < c7's 80 + 50 = 130: early stop ends the search, final_strategy still picks
    assert result.node_id == 7


def test_no_early_stop_without_constraint_checks():
    # C0: accuracy is 1 trivially (nothing checked); stop_min_checks = 1 keeps the search going
    c0 = {i: [(f"n{i}{k}", 50 + i + k, 1.0, 0) for k in range(3)] for i in range(40)}
    _, result = search(c0, 4, stop_when_all_met=True)
    assert result.stop_reason == "max_iterations" and result.counts.iterations == 4


def test_a_misreading_planner_does_not_end_the_search_after_one_expansion():
    # wrong result 2: every child satisfies the planner's own (misread) check, accuracy 1 over 1 check. The search
    # used to stop `all_constraints_met` after 1 of 30 expansions; by default it now stops as the paper's does:
    # when the best reward stalls. Rewards fall with the node id, so the first expansion's best (49 + 100) is never
    # beaten: 1 improving iteration + 5 stalled ones (patience 5)
    misread = {i: [(f"n{i}k{k}", 50 - i - k, 1.0, 1) for k in range(3)] for i in range(40)}
    script = Script(misread)
    result = run_search(ORIGINAL, INITIAL, script.expand, script.score, MCTSConfig())
    assert result.stop_reason == "patience" and result.counts.iterations == 6
    assert result.node_id == 1 and result.node["reward"] == 150.0
    _, result = search(misread, 30, stop_when_all_met=True)  # the early stop is a declared knob
    assert result.stop_reason == "all_constraints_met" and result.counts.iterations == 1


def test_patience_stops_when_the_best_reward_stalls():
    stall = {**SCENARIO_A, 2: [("c4", 10, 0.5, 2), ("c5", 30, 0.5, 2), ("c6", 5, 0.5, 2)]}  # best stays 110
    _, result = search(stall, 30, patience=1)
    assert result.stop_reason == "patience" and result.counts.iterations == 2
    # patience 2: iteration 3 expands c1 (V 90 > c2's (110+60+80+55)/4 = 76.25); its children (70) stall again
    _, result = search(stall, 30, patience=2)
    assert result.stop_reason == "patience" and result.counts.iterations == 3
    _, result = search(stall, 3, patience=3)  # three stalls needed: the budget ends the search first
    assert result.stop_reason == "max_iterations"


def test_empty_expansion_returns_the_original():
    _, result = search({}, 30)
    assert result.stop_reason == "exhausted" and result.chosen_is_root and result.text == ORIGINAL
    assert result.counts.short_expansions == 1 and result.path == [0]


# -----------------------------------------------------------------------------
# Final selection, R_c tools, determinism, dump


SCENARIO_B = {
    0: [("c1", 40, 0.5, 2), ("c2", 60, 0.5, 2), ("c3", -15, 1.0, 2)],  # 90, 110, 85
    2: [("c4", 50, 0.5, 2), ("c5", 30, 0.5, 2), ("c6", 45, 0.5, 2)],  # 100, 80, 95
}


@pytest.mark.parametrize("strategy, chosen, path", [
    ("best_reward", 2, [0, 2]),  # c2 has the largest reward, 110
    ("greedy_value_path", 4, [0, 2, 4]),  # V: c1 90, c2 (110+100+80+95)/4 = 96.25, c3 85 -> c2; then c4 100
    ("best_accuracy", 3, [0, 3]),  # the only node with accuracy 1
])
def test_final_selection_strategies(strategy, chosen, path):
    _, result = search(SCENARIO_B, 2, final_strategy=strategy)
    assert (result.node_id, result.path, result.text) == (chosen, path, text(f"c{chosen}"))
    assert nodes(result)[chosen] == result.node


def test_rc_tools_node_first_fixed():
    calls = {"c1": ["a()"], "c2": ["b()"], "c3": ["c()"]}
    one = {0: SCENARIO_A[0]}
    for mode, fixed, expected in (("node", None, [["a()"], ["b()"], ["c()"]]),
                                  ("first", None, [["a()"], ["a()"], ["a()"]]),
                                  ("fixed", ["gold()"], [["gold()"]] * 3)):
        script = Script(one, calls)
        cfg = MCTSConfig(max_iterations=1, rc_tools=mode, **NO_STOPS)
        result = run_search(ORIGINAL, INITIAL, script.expand, script.score, cfg, fixed_calls=fixed)
        assert script.scored[0][1] == expected
        assert result.rc_calls == (None if mode == "node" else expected[0])
    with pytest.raises(ValueError, match="fixed_calls"):
        TGMCTS(ORIGINAL, INITIAL, MCTSConfig(rc_tools="fixed"))


def uniform(request):
    return [Proposal(text=f"n{request.node_id}k{i} {FILLER}") for i in range(request.k)]


def constant(original, revisions, calls):
    return [RewardTerms(quality=50.0, accuracy=0.5, n_checks=1) for _ in revisions]


def test_ties_go_to_the_lowest_id():
    seen = []
    run_search(ORIGINAL, INITIAL, lambda r: seen.append(r.node_id) or uniform(r), constant,
               MCTSConfig(max_iterations=3, **NO_STOPS))
    assert seen == [0, 1, 2]  # all rewards equal: node 1, then node 2 (node 1's children have fewer parent visits)


def test_determinism_with_a_seed():
    def run(seed):
        seen = []
        cfg = MCTSConfig(max_iterations=8, tie_break="random", **NO_STOPS)
        result = run_search(ORIGINAL, INITIAL, lambda r: seen.append((r.node_id, r.seed)) or uniform(r), constant,
                            cfg, rng=random.Random(seed))
        return seen, result.to_dict()

    assert run(7) == run(7)
    assert run(7)[0] != run(8)[0]  # the expansion seeds (and here the order) come from the injected rng


def test_step_api_matches_run_search():
    script = Script(SCENARIO_A)
    cfg = MCTSConfig(max_iterations=3, **NO_STOPS)
    searcher = TGMCTS(ORIGINAL, INITIAL, cfg)
    while (request := searcher.select()) is not None:
        scoring = searcher.add_children(request, script.expand(request))
        searcher.record_scores(scoring, script.score(ORIGINAL, list(scoring.revisions), scoring.tool_calls))
    _, expected = search(SCENARIO_A, 3)
    assert searcher.result().to_dict() == expected.to_dict()


def test_protocol_misuse_is_an_error():
    searcher = TGMCTS(ORIGINAL, INITIAL, MCTSConfig(width=2))
    request = searcher.select()
    with pytest.raises(RuntimeError):
        searcher.select()
    with pytest.raises(ValueError, match="3 proposals for width 2"):
        searcher.add_children(request, [Proposal(text=text("a"))] * 3)
    scoring = searcher.add_children(request, [Proposal(text=text("a")), Proposal(text=text("b"))])
    with pytest.raises(ValueError, match="1 results for 2 revisions"):
        searcher.record_scores(scoring, [RewardTerms(1.0, 1.0)])
    with pytest.raises(ValueError, match="accuracy"):
        RewardTerms(quality=1.0, accuracy=1.5)


def test_tree_dump_round_trips_through_json():
    _, result = search(SCENARIO_A, 3)
    dumped = json.loads(json.dumps(result.to_dict()))
    assert dumped == result.to_dict()
    assert SearchResult.from_dict(dumped) == result
    for d in dumped["tree"]:
        assert Node.from_dict(d).to_dict() == d
    assert dumped["tree"][7]["terms"] == {"quality": 80, "accuracy": 0.5, "n_checks": 2, "parts": {}}
    assert dumped["config"]["exploration"] == 0.2 and dumped["config"]["guard"]["min_len_ratio"] == 0.5


# -----------------------------------------------------------------------------
# Config


def test_paper_defaults():
    cfg = MCTSConfig()
    assert (cfg.exploration, cfg.width, cfg.max_depth, cfg.max_iterations) == (0.2, 3, 5, 30)
    assert (cfg.quality_weight, cfg.constraint_weight, cfg.constraint_scale, cfg.reward_scale) == (1, 1, 100, 1)
    # D.5: R_c with the planner's tools, one frozen list for the search (the authors' code); no early stop
    assert (cfg.rc_tools, cfg.stop_when_all_met) == ("first", False)


@pytest.mark.parametrize("knobs, match", [
    ({"exploration": -0.1}, "exploration"),
    ({"width": 0}, "width"),
    ({"max_depth": 0}, "max_depth"),
    ({"reward_scale": 0.0}, "reward_scale"),
    ({"final_strategy": "most_visits"}, "final_strategy"),
    ({"rc_tools": "gold"}, "rc_tools"),
    ({"use_quality": False, "use_constraints": False}, "at least one reward term"),
    ({"degenerate_reward": math.inf}, "degenerate_reward"),
])
def test_config_rejects_bad_values(knobs, match):
    with pytest.raises(ValueError, match=match):
        MCTSConfig(**knobs)


def test_config_builds_from_yaml_mapping():
    cfg = build(MCTSConfig, {"exploration": 0.5, "final_strategy": "greedy_value_path",
                             "guard": {"min_len_ratio": 0.3, "truncation": "off"}}, "mcts")
    assert cfg.exploration == 0.5 and cfg.guard.min_len_ratio == 0.3 and cfg.guard.truncation == "off"
    with pytest.raises(ConfigError, match="mcts.guard.bogus"):
        build(MCTSConfig, {"guard": {"bogus": 1}}, "mcts")
    with pytest.raises(ConfigError, match="width"):
        build(MCTSConfig, {"width": 0}, "mcts")


# -----------------------------------------------------------------------------
# A degenerate child is backed up below every usable child (D.3's R_g has no lower bound)


def test_a_degenerate_child_is_backed_up_below_every_usable_child():
    # root -> u1 (R_g -30, acc 0: R -30), a collapsed child (3 words of 10), u2 (R_g -56, acc 0.5: R -6).
    # The old fixed reward 0 backed the collapsed child up above both usable children; the default puts it at
    # min(0, -30, -6) - 100 = -130. Selection then takes u2 (V -6 > -30); u2 -> u3 (R_g -80, acc 0: R -80) and an
    # empty child: min(0, -30, -6, -80) - 100 = -180.
    children = {0: [("u1", -30.0, 0.0, 1), ("x", None, None, None), ("u2", -56.0, 0.5, 1)],
                3: [("u3", -80.0, 0.0, 1), ("e", None, None, None)]}
    proposals = {nid: [Proposal(text="too short." if label == "x" else "" if label == "e" else text(label),
                                planner_output=f"plan {label}") for label, *_ in kids]
                 for nid, kids in children.items()}
    table = {text(label): (q, a, n) for kids in children.values() for label, q, a, n in kids if q is not None}

    def score(original, revisions, calls):
        return [RewardTerms(quality=q, accuracy=a, n_checks=n) for q, a, n in (table[r] for r in revisions)]

    result = run_search(ORIGINAL, INITIAL, lambda r: proposals.get(r.node_id, []), score,
                        MCTSConfig(max_iterations=2, **NO_STOPS))
    tree = nodes(result)
    assert [tree[i]["degenerate"] for i in (1, 2, 3)] == ["", "collapsed", ""]
    usable = [tree[i]["reward"] for i in (1, 3)]
    assert usable == [pytest.approx(-30.0), pytest.approx(-6.0)]
    assert tree[2]["reward"] == pytest.approx(-130.0) and tree[2]["reward"] < min(usable)
    assert tree[2]["value"] == pytest.approx(-130.0)  # backed up with N = 1, V = R
    assert tree[3]["children"] == [4, 5] and tree[5]["degenerate"] == "empty"
    assert tree[5]["reward"] == pytest.approx(-180.0)  # below u3's -80 and every earlier usable child
    assert tree[5]["reward"] < min(n["reward"] for n in tree.values() if n["id"] and not n["degenerate"])
    # root: -30 - 130 - 6 + (-80 - 180) over 5 visits
    assert (tree[0]["visits"], tree[0]["value_sum"]) == (5, pytest.approx(-30 - 130 - 6 - 80 - 180))
    # a fixed degenerate reward, negative allowed, is used as is
    fixed = run_search(ORIGINAL, INITIAL, lambda r: proposals.get(r.node_id, []), score,
                       MCTSConfig(max_iterations=1, degenerate_reward=-500.0, **NO_STOPS))
    assert nodes(fixed)[2]["reward"] == -500.0


def test_degenerate_reward_accepts_negative_and_none_but_not_inf():
    assert MCTSConfig().degenerate_reward is None and MCTSConfig().degenerate_margin == 100.0
    assert build(MCTSConfig, {"degenerate_reward": -250.0}, "mcts").degenerate_reward == -250.0
    with pytest.raises(ConfigError, match="degenerate_margin"):
        build(MCTSConfig, {"degenerate_margin": -1.0}, "mcts")
