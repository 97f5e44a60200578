"""CRAFT planner self-training, pure part: constraint sampling, Eq. 1's action score, best/worst pairs, SFT rows
from trajectories, the stop rule (hand-worked numbers)."""

from __future__ import annotations

import math
import random

import pytest

from eval.craft.agent import AgentConfig, Systems
from eval.craft.instances import KINDS, first_sentences, instruction_text, make_instance, sample_constraint
from eval.craft.quality import QualityScore
from eval.craft.react import parse_planner_output
from eval.craft.selftrain import (
    ActionScore,
    Pair,
    ScoreWeights,
    action_score,
    dev_summary,
    oracle_step,
    pick_pair,
    score_state,
    sft_rows,
    stop_decision,
)
from eval.craft.tools import constraint_accuracy, tool_f1
from tests.craft_fake import Script

# 19 NLTK words (punctuation counts), 3 sentences of 6, 4 and 6 whitespace words
TEXT = "The cat sat on the mat. It was happy there. Everyone watched the little animal closely."


class Pick(random.Random):
    """An rng whose `choice` returns `want` whenever it is among the options (fixes a constraint's relation)."""

    def __init__(self, want: str, seed: int = 0):
        super().__init__(seed)
        self.want = want

    def choice(self, seq):
        return self.want if self.want in seq else super().choice(seq)


@pytest.mark.parametrize("kind, relation, round_to, call, prompt", [
    # word count 19, margin round(0.1 * 19) = 2 -> 21 / 17, rounded outward
    ("word_count", "less than", 1, 'word_count_check(21, "less than")', "Output contain less than 21 words."),
    ("word_count", "less than", 5, 'word_count_check(25, "less than")', "Output contain less than 25 words."),
    ("word_count", "more than", 5, 'word_count_check(15, "more than")', "Output contain more than 15 words."),
    ("word_count", "range", 5, 'word_count_check(25, "less than"); word_count_check(15, "more than")',
     "Output contain less than 25 words and more than 15 words."),
    # sentence count 3, margin 1, never rounded
    ("sentence_count", "less than", 5, 'sentence_count_check(4, "less than")', "Output contain less than 4 sentences."),
    ("sentence_count", "equal", 5, 'sentence_count_check(3, "equal")',
     "Output contain should contain exactly 3 sentences."),
    # lengths 6, 4, 6: margin max(1, round(0.6)) = 1 -> every sentence < 7, or > 3
    ("per_sentence_length", "less than", 1, 'sentence_length_check(7, "less than")',
     "Each sentence should contain less than 7 words."),
    ("per_sentence_length", "more than", 1, 'sentence_length_check(3, "more than")',
     "Each sentence should contain more than 3 words."),
])
def test_count_constraints_leave_a_margin_around_the_reference(kind, relation, round_to, call, prompt):
    c = sample_constraint(kind, TEXT, Pick(relation), slack=0.1, round_to=round_to)
    assert (c.type, c.relation, c.call, c.prompt) == (kind, relation, call, prompt)
    assert constraint_accuracy(c.calls, TEXT, TEXT)[0] == 1.0  # satisfiable: the reference itself meets it


def test_keyword_and_sentence_constraints():
    freq = sample_constraint("keyword_frequency", "Apples and apples. Figs.", Pick("more than"))
    # "Apples" is the only 5+ letter word; the substring count is case-insensitive: 2 -> "at least 2" = more than 1
    assert freq.call == 'keyword_frequency_check("Apples", 1, "more than")'
    assert freq.prompt == "The word 'Apples' should appear at least 2 times."
    keep = sample_constraint("keep_sentence", TEXT, random.Random(0))
    assert keep.relation == "unchange" and 1 <= len(keep.args["ids"]) <= 2  # never all 3 sentences
    assert keep.prompt.startswith("Do not change the ") and keep.prompt.endswith(" sentence.")
    assert sample_constraint("remove_keyword", "A b c. Tiny.", random.Random(0)) is None  # no 5-letter word
    with pytest.raises(ValueError, match="unknown constraint kind"):
        sample_constraint("sentiment", TEXT, random.Random(0))


def test_instances_have_distinct_groups_and_satisfiable_gold_calls():
    for seed in range(40):
        inst = make_instance(f"i{seed}", TEXT, random.Random(seed), 3)
        types = [c.type for c in inst.constraints]
        assert len(types) == 3 and len(set(types)) == 3 and set(types) <= set(KINDS)
        assert not {"keep_sentence", "modify_sentence"} <= set(types)
        assert inst.instruction == instruction_text(inst.constraints)
        assert inst.instruction.startswith("Polish the following text. ")
        # every constraint but "only change sentence i" and "do not use word A" holds on the unrevised reference
        kept = [call for c in inst.constraints if c.type not in ("modify_sentence", "remove_keyword") for call in c.calls]
        assert constraint_accuracy(kept, TEXT, TEXT)[0] == 1.0
    assert make_instance("z", TEXT, random.Random(0), 0).gold_calls == []


def test_first_sentences():
    assert first_sentences(TEXT, 2) == "The cat sat on the mat. It was happy there."
    assert first_sentences(TEXT, 0) == TEXT


GOLD = ['word_count_check(21, "less than")', 'sentence_count_check(4, "less than")']
PREDICTED = ["text_eval()", "word_count_check(21, 'less than')", 'sentence_length_check(7, "less than")']


def test_action_score_is_eq1_on_a_0_to_100_scale():
    # F1 over {text_eval, wc21, sl7} vs {text_eval, wc21, sc4}: 2 hits, P = R = 2/3
    assert tool_f1(PREDICTED, GOLD) == pytest.approx(2 / 3)
    s = action_score(PREDICTED, GOLD, TEXT, "The cat sat on the mat. It was happy.", 30.0, ScoreWeights())
    # 12 words < 21 and 2 sentences < 4: accuracy 1 -> 0.5*100*2/3 + 0.25*30 + 0.25*100*1
    assert (s.tool_f1, s.accuracy, s.quality, s.n_calls) == (pytest.approx(2 / 3), 1.0, 30.0, 3)
    assert s.total == pytest.approx(100 / 3 + 7.5 + 25)
    five = action_score(PREDICTED, GOLD, TEXT, "A. B. C. D. E.", 10.0, ScoreWeights())
    assert five.accuracy == 0.5 and five.total == pytest.approx(100 / 3 + 2.5 + 12.5)
    # a degenerate revision keeps its tool term only (an empty text would pass both "less than" checks)
    empty = action_score(PREDICTED, GOLD, TEXT, "", 80.0, ScoreWeights(), degenerate="empty")
    assert (empty.accuracy, empty.quality, empty.total) == (0.0, 0.0, pytest.approx(100 / 3))
    # the authors' script weights 0.4 / 0.3 / 0.3
    code = action_score(PREDICTED, GOLD, TEXT, "The cat sat on the mat. It was happy.", 30.0,
                        ScoreWeights(tool=0.4, quality=0.3, constraints=0.3))
    assert code.total == pytest.approx(40 * 2 / 3 + 9 + 30)


def test_score_weights_are_checked():
    with pytest.raises(ValueError, match="w.tool"):
        ScoreWeights(tool=1.5).validate("w")
    with pytest.raises(ValueError, match="at least one weight"):
        ScoreWeights(0, 0, 0).validate("w")


def test_pick_pair_best_worst_ties_and_empty_responses():
    assert pick_pair([3.0, 9.0, 1.0, 9.0], ["a", "b", "c", "d"]) == Pair(1, 2, 8.0)
    # worst ties: lowest index
    assert pick_pair([2.0, 7.0, 2.0], ["a", "b", "c"]) == Pair(1, 0, 5.0)
    # the empty response scores highest but is never a pair member (SimPO's length normaliser)
    assert pick_pair([10.0, 1.0, 5.0], ["  ", "a", "b"]) == Pair(2, 1, 4.0)
    assert pick_pair([10.0, 1.0], ["", "a"]) == "too_few"
    assert pick_pair([5.0], ["a"]) == "too_few"
    assert pick_pair([5.0, 4.5], ["a", "b"], min_margin=0.5) == "tie"
    assert pick_pair([5.0, 4.0], ["a", "b"], min_margin=0.5) == Pair(0, 1, 1.0)
    assert pick_pair([9.0, 1.0], ["x", "x "]) == "identical"
    with pytest.raises(ValueError):
        pick_pair([1.0], ["a", "b"])


def test_sft_rows_put_each_assistant_turn_in_a_target_once():
    initial = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    a = parse_planner_output("###THOUGHT: t1\n###ACTION:\n-###TOOLS:\ntext_eval()\n-###PLAN:\n"
                             'Sentence: "x"; Improvement Plan: "y"')
    b = parse_planner_output("###THOUGHT: t2\n###ACTION:\n-###TOOLS:\ntext_eval()\n-###PLAN:\n"
                             'Sentence: "z"; Improvement Plan: "w"')
    rows = sft_rows(initial, [(a, "###OBSERVATION: o1"), (b, "###OBSERVATION: o2")])
    assert [r["target"] for r in rows] == [a.raw, b.raw]
    assert rows[0]["prompt_messages"] == initial
    assert rows[1]["prompt_messages"] == [*initial, {"role": "assistant", "content": a.raw},
                                          {"role": "user", "content": "###OBSERVATION: o1"}]
    # the last observation is never in a prompt (nothing follows it)
    assert all("o2" not in m["content"] for r in rows for m in r["prompt_messages"])


def test_oracle_step_uses_the_gold_calls_and_keeps_protected_sentences():
    step = oracle_step(TEXT, GOLD, keep_ids=[2])
    assert step.errors == []
    assert step.tool_calls == ["text_eval()", *GOLD]
    assert tool_f1(step.tool_calls, GOLD) == 1.0
    assert [p.sentence for p in step.plan] == ["The cat sat on the mat", "It was happy there",
                                                "Everyone watched the little animal closely"]
    assert step.plan[1].improvement_plan == "Keep this sentence unchanged."
    assert step.plan[0].improvement_plan != step.plan[1].improvement_plan


def test_stop_rule():
    assert stop_decision([50.0]).stop is False
    assert stop_decision([50.0, 60.0]).stop is False
    d = stop_decision([50.0, 49.0])
    assert (d.stop, d.best_round) == (True, 0)
    assert stop_decision([50.0, 55.0, 54.0], patience=1) == stop_decision([50.0, 55.0, 54.0])
    assert stop_decision([50.0, 55.0, 54.0], patience=1).best_round == 1
    assert stop_decision([50.0, 55.0, 54.0], patience=2).stop is False
    assert stop_decision([50.0, 55.0, 54.0, 53.0], patience=2).stop is True
    assert stop_decision([50.0, 50.5], min_delta=1.0).stop is True   # not a measurable improvement
    assert stop_decision([50.0, 50.5], min_delta=0.4).stop is False
    assert stop_decision([50.0, 55.0, 55.0]).best_round == 1          # ties: the earlier round
    with pytest.raises(ValueError):
        stop_decision([])


def test_dev_summary():
    scores = [ActionScore(80.0, 1.0, 20.0, 1.0, 2), ActionScore(40.0, 0.5, 0.0, 0.5, 1, "empty")]
    s = dev_summary(scores)
    assert (s["dev_score"], s["dev_tool_f1"], s["dev_accuracy"], s["dev_quality"], s["dev_rows"],
            s["dev_degenerate"]) == (60.0, 0.75, 0.75, 10.0, 2, 1)
    assert math.isnan(dev_summary([])["dev_score"])


SHORT = "The cat sat. It was happy."
MERGE = ('###THOUGHT: One sentence.\n###ACTION:\n   -###TOOLS:\nsentence_count_check(1, "equal")\n   -###PLAN:\n'
         'Sentence: "The cat sat."; Improvement Plan: "Merge."\nSentence: "It was happy."; Improvement Plan: "Merge."')
KEEP = ('###THOUGHT: Keep it.\n###ACTION:\n   -###TOOLS:\ntext_eval()\n   -###PLAN:\n'
        'Sentence: "The cat sat."; Improvement Plan: "Keep."\nSentence: "It was happy."; Improvement Plan: "Keep."')


def test_score_state_samples_k_actions_and_scores_them_with_eq1():
    script = Script([MERGE, KEEP], ["The happy cat sat.", "The cat sat.\nIt was happy."])
    systems = Systems(AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False), script, script)
    history, current, cands = score_state(systems, "Polish. Use one sentence.", SHORT,
                                          ['sentence_count_check(1, "equal")'], history_steps=0, k=2, seed=5,
                                          weights=ScoreWeights())
    assert current == SHORT and history == systems.initial_messages("Polish. Use one sentence.", SHORT)
    # MERGE: F1 1; 1 sentence -> accuracy 1; quality 100 * 2 * 3 / (6 + 4) = 60 -> 50 + 15 + 25
    # KEEP: F1 over {text_eval()} vs {sc1, text_eval()} = 2/3; 2 sentences -> 0; quality 100 -> 33.3 + 25 + 0
    assert [c["revision"] for c in cands] == ["The happy cat sat.", SHORT]
    assert [c["tool_f1"] for c in cands] == [1.0, pytest.approx(2 / 3)]
    assert [c["accuracy"] for c in cands] == [1.0, 0.0]
    assert [c["quality"] for c in cands] == [pytest.approx(60.0), pytest.approx(100.0)]
    assert [c["score"] for c in cands] == [pytest.approx(90.0), pytest.approx(100 / 3 + 25)]
    assert pick_pair([c["score"] for c in cands], [c["response"] for c in cands]) == Pair(0, 1, pytest.approx(
        90 - 100 / 3 - 25))
    planner_sampling = [s for m, s in script.seen if m[0]["role"] == "system"]
    assert [s["seed"] for s in planner_sampling] == [5, 6] and all(s["temperature"] == 0.7 for s in planner_sampling)


def test_score_state_rolls_out_history_steps_first():
    # one history step (MERGE accepted as y_1), then one candidate on H_1 whose plan is empty: degenerate
    script = Script([MERGE, "###THOUGHT: nothing"], ["The happy cat sat."])
    systems = Systems(AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False), script, script)
    history, current, cands = score_state(systems, "Polish.", SHORT, [], history_steps=1, k=1, seed=0,
                                          weights=ScoreWeights())
    assert current == "The happy cat sat."
    assert history[-2] == {"role": "assistant", "content": MERGE} and history[-1]["role"] == "user"
    assert cands[0]["degenerate"] == "empty" and cands[0]["accuracy"] == 0.0 and cands[0]["quality"] == 0.0
    # C0 instance: F1 of {text_eval()} against {text_eval()} = 1 -> Eq. 1 alone would give 50; a degenerate
    # candidate with no usable sibling scores min(0) - 100 = -100 (below any usable answer)
    assert cands[0]["score"] == pytest.approx(-100.0)


def test_s_r_is_the_systems_quality_anchored_at_the_original_input():
    # issue 41: S_r of Eq. 1 is App. D.3's score (the job's quality scorer), anchored at the instance's input
    # (D.3's init_text), not the difflib proxy against the current text. A recording scorer stands in for the model.
    from eval.craft.quality import QualityScore

    seen = []

    def scorer(original, revisions):
        seen.append((original, list(revisions)))
        return [QualityScore(42.0 + i) for i, _ in enumerate(revisions)]

    # one history step (MERGE accepted as y_1), then a KEEP candidate on H_1
    script = Script([MERGE, KEEP], ["The happy cat sat.", "The happy cat sat."])
    systems = Systems(AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False), script, script,
                      quality=scorer)
    _, current, cands = score_state(systems, "Polish.", SHORT, [], history_steps=1, k=1, seed=0,
                                    weights=ScoreWeights())
    assert current == "The happy cat sat." != SHORT
    assert cands[0]["quality"] == 42.0
    assert seen[-1][0] == SHORT  # anchored at the original input, not the current text


# -----------------------------------------------------------------------------
# A collapsed answer under D.3's S_r (unbounded below) is never the preferred response


LONG = ("The cat sat on the mat. It was happy there. Everyone watched the little animal closely. "
        "The dog slept by the door.")
COLLAPSE = ('###THOUGHT: Shorter.\n###ACTION:\n   -###TOOLS:\nword_count_check(30, "less than")\n   -###PLAN:\n'
            'Sentence: "The cat sat on the mat."; Improvement Plan: "Keep only this."')
USABLE = ('###THOUGHT: Polish.\n###ACTION:\n   -###TOOLS:\ntext_eval()\n   -###PLAN:\n'
          'Sentence: "The cat sat on the mat."; Improvement Plan: "Polish."')


def test_a_collapsed_answer_and_a_usable_one_meet_eq1_and_the_usable_one_is_preferred():
    # D.3's S_r of the usable revision is -56 (it reads worse than the input: PPL_nom unclamped). Eq. 1:
    #   collapsed: F1 1 -> 50 + 0.25 * 0 + 0.25 * 0 = 50 before the floor (S_r = S_c = 0);
    #   usable:    F1({text_eval()}, {wc30, text_eval()}) = 2/3 -> 33.33 + 0.25 * (-56) + 0.25 * 100 * 1 = 44.33
    #              (word count 21 < 30)
    # the old rule ranked the collapsed answer first (50 > 44.33); the floor puts it at min(0, 44.33) - 100 = -100
    script = Script([COLLAPSE, USABLE], ["The cat sat.", LONG.replace("little ", "")])
    systems = Systems(AgentConfig(planner_prompt="craft_planner_brief", quality_feedback=False), script, script,
                      quality=lambda original, revisions: [QualityScore(-56.0) for _ in revisions])
    _, _, cands = score_state(systems, "Polish.", LONG, ['word_count_check(30, "less than")'], history_steps=0, k=2,
                              seed=0, weights=ScoreWeights())
    assert [c["degenerate"] for c in cands] == ["collapsed", ""]
    assert [c["tool_f1"] for c in cands] == [1.0, pytest.approx(2 / 3)] and cands[1]["accuracy"] == 1.0
    assert cands[1]["score"] == pytest.approx(100 / 3 + 0.25 * -56.0 + 25.0)  # 44.33
    assert cands[0]["score"] == pytest.approx(-100.0)
    picked = pick_pair([c["score"] for c in cands], [c["response"] for c in cands],
                       degenerate=[c["degenerate"] for c in cands])
    assert picked == Pair(1, 0, pytest.approx(100 / 3 + 11.0 + 100.0))


def test_pick_pair_reads_the_guards_flag_not_the_planner_text():
    # the numbers: a collapsed answer's S_a 50.00 against a usable revision's 48.35 (both planner texts
    # non-empty): the flag makes the usable one w and the collapsed one l, whatever the scores
    assert pick_pair([50.0, 48.35], ["plan a", "plan b"], degenerate=["collapsed", ""]) == Pair(
        1, 0, pytest.approx(-1.65))
    # a degenerate candidate is the rejected one before any usable one, even a lower-scoring usable one
    assert pick_pair([10.0, 60.0, 5.0], ["a", "b", "c"], degenerate=["truncated", "", ""]).rejected == 0
    # no usable revision: no pair (nothing to prefer)
    assert pick_pair([10.0, 20.0], ["a", "b"], degenerate=["empty", "refusal"]) == "no_usable"
    # without flags the old behaviour: scores decide
    assert pick_pair([50.0, 48.35], ["plan a", "plan b"]) == Pair(0, 1, pytest.approx(1.65))
    with pytest.raises(ValueError, match="guard flags"):
        pick_pair([1.0, 2.0], ["a", "b"], degenerate=[""])


def test_degenerate_floor_is_below_every_usable_score():
    from eval.craft.selftrain import degenerate_floor

    assert degenerate_floor([48.35, -30.0], 100.0) == pytest.approx(-130.0)
    assert degenerate_floor([], 100.0) == -100.0
    with pytest.raises(ValueError, match="degenerate_margin"):
        ScoreWeights(degenerate_margin=-1.0).validate()
