"""The scripted planner + reviser the TG-MCTS tests search with (tests/test_craft_mcts.py, tests/test_craft_guard.py).

The fake policy is a script: node id -> the children ``expand`` returns; the fake scorer looks each revision up in a
table of (R_g, accuracy, n_checks). Pure: no model, no Ray.
"""

from __future__ import annotations

from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig
from eval.craft.tree import Proposal, RewardTerms, SearchResult

INITIAL = [{"role": "system", "content": "framework"}, {"role": "user", "content": "instruction + text"}]
FILLER = "w2 w3 w4 w5 w6 w7 w8 w9 w10."  # 9 words: every scripted text has 10 words, like the original
ORIGINAL = "orig " + FILLER


def text(label: str) -> str:
    return f"{label} {FILLER}"


class Script:
    """Fake planner + reviser: ``children[node_id]`` = [(label, R_g, accuracy, n_checks)]; logs every request."""

    def __init__(self, children: dict[int, list[tuple]], calls: dict[str, list[str]] | None = None) -> None:
        self.children = children
        self.table = {text(c[0]): c[1:] for kids in children.values() for c in kids}
        self.calls = calls or {}
        self.requests: list = []
        self.scored: list = []

    def expand(self, request):
        self.requests.append(request)
        return [Proposal(text=text(label), planner_output=f"plan {label}", observation=f"obs {label}",
                         tool_calls=tuple(self.calls.get(label, [f"check_{label}()"])), model_calls=3)
                for label, *_ in self.children.get(request.node_id, [])]

    def score(self, original, revisions, tool_calls):
        assert original == ORIGINAL
        self.scored.append((list(revisions), [list(c) for c in tool_calls]))
        return [RewardTerms(quality=q, accuracy=a, n_checks=n) for q, a, n in (self.table[r] for r in revisions)]


# Scenario A (alpha 0.2, paper scale). Root -> c1 90, c2 110, c3 50; c2 -> c4 120, c5 80, c6 115;
# c4 -> c7 130, c8 60, c9 100; c1 -> c10 70, c11 70, c12 70.
SCENARIO_A = {
    0: [("c1", 40, 0.5, 2), ("c2", 60, 0.5, 2), ("c3", 50, 0.0, 2)],
    2: [("c4", 70, 0.5, 2), ("c5", 30, 0.5, 2), ("c6", 65, 0.5, 2)],
    4: [("c7", 80, 0.5, 2), ("c8", 10, 0.5, 2), ("c9", 50, 0.5, 2)],
    1: [("c10", 20, 0.5, 2), ("c11", 20, 0.5, 2), ("c12", 20, 0.5, 2)],
}
NO_STOPS = {"patience": 0, "stop_when_all_met": False}


def search(children, iterations, **knobs):
    script = Script(children)
    cfg = MCTSConfig(max_iterations=iterations, **{**NO_STOPS, **knobs})
    return script, run_search(ORIGINAL, INITIAL, script.expand, script.score, cfg)


def nodes(result: SearchResult) -> dict[int, dict]:
    return {d["id"]: d for d in result.tree}
