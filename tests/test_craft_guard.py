"""The degenerate guard of TG-MCTS (eval.craft.guard): its reasons, and that the search never selects, expands or
chooses a degenerate child. Split from tests/test_craft_mcts.py; the scripted policy is tests/craft_script.py."""

from __future__ import annotations

import pytest

from eval.craft.guard import GuardConfig, degenerate_reason
from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig
from eval.craft.tree import Proposal, RewardTerms
from tests.craft_script import INITIAL, NO_STOPS, nodes

PARENT20 = " ".join(f"word{i}" for i in range(1, 20)) + " end."  # 20 words


def test_guard_reasons():
    cfg = GuardConfig()
    assert degenerate_reason("", PARENT20, PARENT20, cfg) == "empty"
    assert degenerate_reason("  \n", PARENT20, PARENT20, cfg) == "empty"
    assert degenerate_reason("I'm sorry, but I can't help with revising this text.", PARENT20, PARENT20,
                             cfg) == "refusal"
    assert degenerate_reason("There appears to be a misunderstanding. Could you please provide the text?",
                             PARENT20, PARENT20, cfg) == "refusal"
    assert degenerate_reason("Two words.", PARENT20, PARENT20, cfg) == "collapsed"  # 2 < 0.5 * 20
    assert degenerate_reason(" ".join(["x"] * 10) + ".", PARENT20, PARENT20, cfg) == ""  # 10 = 0.5 * 20 is fine
    assert degenerate_reason(PARENT20 + " " + PARENT20 + " more.", PARENT20, PARENT20, cfg) == "bloated"  # 41 > 40
    assert degenerate_reason(" ".join(["x"] * 39) + ".", PARENT20, PARENT20, cfg) == ""  # 39 < 40
    assert degenerate_reason(PARENT20, PARENT20, PARENT20, cfg, truncated=True) == "truncated"
    cut = PARENT20.removesuffix(" end.")
    assert degenerate_reason(cut, PARENT20, PARENT20, cfg) == "truncated"  # the default reads the text's end too
    assert degenerate_reason(cut, PARENT20, PARENT20, GuardConfig(truncation="flag")) == ""  # the caller's flag only
    assert degenerate_reason("", PARENT20, PARENT20, GuardConfig(enabled=False)) == ""


def test_guard_refusal_words_in_the_original_are_not_a_refusal():
    story = "I'm sorry, she said, and closed the door behind her without another word that night."
    assert degenerate_reason("I'm sorry, she said, and shut the door behind her without a word that night.",
                             story, story, GuardConfig()) == ""


def test_guard_length_reference_original_catches_slow_shrink():
    parent = " ".join(["p"] * 12) + "."  # already shrunk from 20 words
    child = " ".join(["c"] * 8) + "."  # 9 words: 0.75 of the parent, 0.45 of the original
    assert degenerate_reason(child, parent, PARENT20, GuardConfig()) == ""
    assert degenerate_reason(child, parent, PARENT20, GuardConfig(length_reference="original")) == "collapsed"


def test_degenerate_children_are_counted_never_selected_expanded_or_chosen():
    good = PARENT20.replace("word1 ", "better ")
    proposals = {
        0: [Proposal(text=""), Proposal(text="I'm sorry, but I can't help with revising this text."),
            Proposal(text="Two words."), Proposal(text=good.replace("end.", "cut."), truncated=True),
            Proposal(text=good, tool_calls=("text_eval()",))],
        5: [Proposal(text=""), Proposal(text="Sorry.")],
    }
    requests, scored = [], []

    def expand(request):
        requests.append(request.node_id)
        return proposals.get(request.node_id, [])

    def score(original, revisions, calls):
        scored.append(revisions)
        return [RewardTerms(quality=50.0, accuracy=0.5, n_checks=2) for _ in revisions]

    # a huge floor reward: were degenerate children selectable, UCT would pick them
    cfg = MCTSConfig(width=5, degenerate_reward=1000.0, **NO_STOPS)
    result = run_search(PARENT20, INITIAL, expand, score, cfg)
    tree = nodes(result)
    assert [tree[i]["degenerate"] for i in (1, 2, 3, 4, 5)] == ["empty", "refusal", "collapsed", "truncated", ""]
    assert requests == [0, 5]  # only the usable child is expanded
    assert scored == [[good]]  # degenerate revisions are never scored; node 5's expansion had nothing to score
    assert result.counts.degenerate == 6
    assert result.counts.degenerate_reasons == {"empty": 2, "refusal": 1, "collapsed": 2, "truncated": 1}
    assert tree[1]["reward"] == 1000.0 and tree[1]["terms"] is None and not tree[1]["expanded"]
    assert result.node_id == 5 and result.stop_reason == "exhausted"
    # root: 4 floors + 100 (good: 50 + 50) + node 5's two floors
    assert (tree[0]["visits"], tree[0]["value_sum"]) == (7, 4000 + 100 + 2000)


def test_guard_config_rejects_bad_values():
    with pytest.raises(ValueError, match="refusal_regex"):
        GuardConfig(refusal_regex="(")
    with pytest.raises(ValueError, match="max_len_ratio"):
        GuardConfig(min_len_ratio=0.8, max_len_ratio=0.5)
    with pytest.raises(ValueError, match="truncation"):
        GuardConfig(truncation="sometimes")


# -- issue 53, item 5: the two gaps the search exploited ---------------------------------------------------------

INPUT = ("The council met on Monday. It approved the new library budget. Residents welcomed the decision. "
         "Work on the building starts in the spring.")


def test_a_constraint_meeting_text_cut_mid_sentence_is_flagged_by_the_default_guard():
    # meets "fewer than 20 words" and keeps sentence 1, finished with reason "stop": only its ending shows the cut
    cut = "The council met on Monday. It approved the new library budget. Residents welcomed the"
    assert degenerate_reason(cut, INPUT, INPUT, GuardConfig(), truncated=False) == "truncated"
    # a complete sentence ending (closing quote or bracket after the stop included) passes
    assert degenerate_reason(cut + " decision.", INPUT, INPUT, GuardConfig()) == ""
    assert degenerate_reason(cut + ' "decision."', INPUT, INPUT, GuardConfig()) == ""
    assert GuardConfig().truncation == "flag_or_unterminated"


def test_the_input_written_twice_is_bloated():
    twice = INPUT + " " + INPUT  # exactly 2.0 x the words
    assert len(twice.split()) == 2 * len(INPUT.split())
    assert degenerate_reason(twice, INPUT, INPUT, GuardConfig()) == "bloated"
    assert degenerate_reason(twice, INPUT, INPUT, GuardConfig(max_len_ratio=0.0)) == ""  # the check off
