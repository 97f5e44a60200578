"""Judge request rendering: the `constrained` knob puts the format's grammar into each row's sampling, or leaves
the sampling exactly as configured (the papers' free decoding)."""

import json

import pandas as pd

from actors.engines.base import SamplingParams
from actors.jury import render_judge_requests
from actors.menlo import attach_judge


def _best_worst_batch(n_candidates: int) -> pd.DataFrame:
    cands = [f"Candidate {k}." for k in range(n_candidates)]
    return pd.DataFrame([{"id": "s1", "policy": "lexical", "source": "The source sentence.", "n_candidates": n_candidates,
                          "candidates_json": json.dumps(cands), "alignments_json": "", "parses_json": ""}])


def test_best_worst_grammar_follows_the_shown_candidate_count_and_the_knob_removes_it():
    sampling = json.dumps(SamplingParams(max_tokens=64).as_dict(), sort_keys=True)
    on = render_judge_requests(_best_worst_batch(3), "j", "judge_policy_brief", "best_worst", sampling, seed=0,
                               constrained=True)
    grammar = json.loads(on["sampling_json"].iloc[0])["grammar"]
    assert '"Best: 2, Worst: 0"' in grammar and "Best: 3" not in grammar  # indices < K, Best != Worst
    assert "Best: 1, Worst: 1" not in grammar
    off = render_judge_requests(_best_worst_batch(3), "j", "judge_policy_brief", "best_worst", sampling, seed=0,
                                constrained=False)
    assert off["sampling_json"].iloc[0] == sampling and "grammar" not in json.loads(sampling)
    # the prompt is the same either way: only decoding changes
    assert on["messages_json"].iloc[0] == off["messages_json"].iloc[0]


def test_score_and_menlo_rows_get_their_own_grammar():
    sampling = json.dumps(SamplingParams(max_tokens=48).as_dict(), sort_keys=True)
    batch = pd.DataFrame([{"id": "s1", "source": "A long sentence.", "candidate": "A sentence."}])
    score = render_judge_requests(batch, "j", "jury_score", "score", sampling, seed=0, constrained=True)
    assert '"[" /[1-5]/ "]"' in json.loads(score["sampling_json"].iloc[0])["grammar"]
    menlo = attach_judge(pd.DataFrame({"mode": ["pointwise", "pairwise"], "item_id": ["i1", "i2"]}), "j", sampling, constrained=True)
    point, pair = (json.loads(s)["grammar"] for s in menlo["sampling_json"])
    assert "<final_grade>" in point and "<final_grade_A>" not in point and "<final_grade_B>" in pair
    assert list(attach_judge(pd.DataFrame({"mode": ["pairwise"], "item_id": ["i3"]}), "j", sampling)["sampling_json"]) == [sampling]
