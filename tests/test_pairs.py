"""Preference pairs from best/worst verdicts: aspect per policy, votes, exclusions counted, split, Table 3."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from train.preference.pairs import assign_split, build_pairs, judge_disagreement, preference_distribution, subsample

MODELS = ["m0", "m1", "m2", "m3"]
PROMPTS = {"lexical": "simplify_lexical_zeroshot", "overall": "simplify_overall_zeroshot"}


def verdict(lex=(0, 1), ovr=(2, 3), lex_error="", ovr_error="") -> str:
    return json.dumps({
        "Lexical": {"best": lex[0], "worst": lex[1], "error": lex_error},
        "Structural": {"best": 0, "worst": 1, "error": ""},
        "Overall": {"best": ovr[0], "worst": ovr[1], "error": ovr_error},
    })


def row(sid, policy, judge, v, candidates=None):
    cands = candidates or [f"{sid} cand {i}" for i in range(4)]
    return {"id": sid, "policy": policy, "source": f"source {sid}", "judge": judge, "models_json": json.dumps(MODELS),
            "candidates_json": json.dumps(cands), "verdict_json": v}


def test_policy_picks_its_aspect_and_prompt_is_zero_shot():
    judgments = pd.DataFrame([row("a", "lexical", "j", verdict(lex=(1, 3))), row("b", "overall", "j", verdict())])
    pairs, status = build_pairs(judgments, PROMPTS, dev_fraction=0.0)
    lex = pairs[pairs["policy"] == "lexical"].iloc[0]
    assert (lex["chosen"], lex["rejected"]) == ("a cand 1", "a cand 3")
    assert (lex["chosen_model"], lex["rejected_model"]) == ("m1", "m3")
    ovr = pairs[pairs["policy"] == "overall"].iloc[0]
    assert (ovr["chosen_model"], ovr["rejected_model"]) == ("m2", "m3")  # the Overall verdict, not Lexical
    messages = json.loads(lex["prompt"])
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == "source a"
    assert list(status["status"]) == ["ok", "ok"] and set(pairs["split"]) == {"train"}


def test_invalid_votes_are_excluded_and_counted():
    judgments = pd.DataFrame([
        row("a", "lexical", "j1", verdict(lex=(None, None), lex_error="missing")),
        row("a", "lexical", "j2", verdict(lex=(2, 2), lex_error="best_equals_worst")),
        row("b", "lexical", "j1", verdict(lex=(0, 1), lex_error="out_of_range")),
        row("b", "lexical", "j2", verdict(lex=(3, 0))),
    ])
    pairs, status = build_pairs(judgments, PROMPTS)
    by_id = status.set_index("id")
    assert by_id.loc["a", "status"] == "no_valid_verdict" and by_id.loc["a", "n_invalid"] == 2
    assert by_id.loc["b", "status"] == "ok" and (by_id.loc["b", "n_votes"], by_id.loc["b", "n_invalid"]) == (1, 1)
    assert list(pairs["id"]) == ["b"] and pairs.iloc[0]["chosen_model"] == "m3"


def test_identical_chosen_and_rejected_texts_give_no_pair():
    same = ["same text", "same text", "other", "another"]
    pairs, status = build_pairs(pd.DataFrame([row("a", "lexical", "j", verdict(lex=(0, 1)), same)]), PROMPTS)
    assert pairs.empty and status.iloc[0]["status"] == "identical_texts"


def test_three_judges_vote():
    # best votes: m1, m1, m2 -> m1; worst votes: m0, m3, m0 -> m0
    judgments = pd.DataFrame([row("a", "lexical", "j1", verdict(lex=(1, 0))),
                              row("a", "lexical", "j2", verdict(lex=(1, 3))),
                              row("a", "lexical", "j3", verdict(lex=(2, 0)))])
    pairs, _ = build_pairs(judgments, PROMPTS)
    pair = pairs.iloc[0]
    assert (pair["chosen_model"], pair["rejected_model"]) == ("m1", "m0")
    meta = json.loads(pair["judge_meta"])
    assert meta["judges"] == ["j1", "j2", "j3"] and meta["tie"] is False


def test_split_is_stable_and_near_the_fraction():
    ids = [f"turk-{i:06d}" for i in range(2000)]
    splits = [assign_split(i, 0.125) for i in ids]
    assert splits == [assign_split(i, 0.125) for i in ids]
    assert 0.10 < splits.count("dev") / len(ids) < 0.15


def test_preference_distribution_table():
    pairs = pd.DataFrame({"policy": ["lexical"] * 4, "chosen_model": ["m0", "m0", "m1", "m2"],
                          "rejected_model": ["m1", "m2", "m2", "m1"]})
    table = preference_distribution(pairs).set_index("model")
    assert list(table["preferred"]) == [2, 1, 1] and list(table["dispreferred"]) == [0, 2, 2]
    assert table.loc["m0", "preferred_pct"] == 50.0


def test_sft_think_rows_are_the_chosen_candidates():
    from train.preference.pairs import sft_rows_from_pairs

    judgments = pd.DataFrame([row("a", "lexical", "j", verdict(lex=(1, 3)))])
    pairs, _ = build_pairs(judgments, PROMPTS, dev_fraction=0.0)
    rows = sft_rows_from_pairs(pairs)
    assert rows["target"].tolist() == ["a cand 1"] and rows["origin"].tolist() == ["chosen:m1"]
    assert rows["prompt"].tolist() == pairs["prompt"].tolist() and rows["split"].tolist() == ["train"]


def test_parallel_rows_take_the_first_reference_or_all_and_refuse_a_source_without_one():
    import pytest

    from train.preference.pairs import sft_rows_from_references

    sources = pd.DataFrame({"id": ["a", "b"], "source": ["The big cat sat.", "Rain fell."],
                            "references": [["A cat sat.", "The cat sat."], ["", "It rained."]]})
    one = sft_rows_from_references(sources, "lexical", "simplify_lexical_zeroshot", per_source=1, dev_fraction=0.0)
    # b's first reference is empty: skipped, the next non-empty one is used
    assert one["target"].tolist() == ["A cat sat.", "It rained."]
    assert one["origin"].tolist() == ["reference:0", "reference:0"] and not one["oracle"].any()
    messages = json.loads(one["prompt"].iloc[0])
    assert messages[-1] == {"role": "user", "content": "The big cat sat."}
    every = sft_rows_from_references(sources, "lexical", "simplify_lexical_zeroshot", per_source=0)
    assert every["target"].tolist() == ["A cat sat.", "The cat sat.", "It rained."]
    with pytest.raises(ValueError, match="'c'"):
        sft_rows_from_references(pd.DataFrame({"id": ["c"], "source": ["x"], "references": [[" "]]}), "lexical",
                                 "simplify_lexical_zeroshot")


def test_subsample_is_seeded_ordered_and_refuses_more_than_exist():
    rows = [{"i": k} for k in range(5)]
    assert subsample(rows, 0) == rows  # 0 = all
    # random.Random(1).sample(range(5), 3) == [1, 0, 4]: kept in the rows' own order
    assert [r["i"] for r in subsample(rows, 3, seed=1)] == [0, 1, 4]
    assert subsample(rows, 3, seed=1) == subsample(rows, 3, seed=1)
    assert subsample(rows, 3, seed=2) != subsample(rows, 3, seed=1)
    with pytest.raises(ValueError, match="asked for 6 training rows, only 5 exist"):
        subsample(rows, 6)


def test_judge_disagreement_by_hand():
    # four lexical sets judged by "think" and "nothink":
    #   a: same pair (1 > 3)                           -> agree
    #   b: think 0 > 1, nothink 2 > 1 (best differs)    -> disagree, not opposite
    #   c: think 0 > 1, nothink 1 > 0                   -> disagree and opposite
    #   d: nothink's verdict is invalid                 -> not counted
    judgments = pd.DataFrame([
        row("a", "lexical", "think", verdict(lex=(1, 3))), row("a", "lexical", "nothink", verdict(lex=(1, 3))),
        row("b", "lexical", "think", verdict(lex=(0, 1))), row("b", "lexical", "nothink", verdict(lex=(2, 1))),
        row("c", "lexical", "think", verdict(lex=(0, 1))), row("c", "lexical", "nothink", verdict(lex=(1, 0))),
        row("d", "lexical", "think", verdict(lex=(0, 1))),
        row("d", "lexical", "nothink", verdict(lex=(None, None), lex_error="missing")),
    ])
    table = judge_disagreement(judgments)
    assert table.to_dict("records") == [{"judge_a": "nothink", "judge_b": "think", "policy": "lexical", "n": 3,
                                         "disagree": pytest.approx(2 / 3), "opposite": pytest.approx(1 / 3)}]
