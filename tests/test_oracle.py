"""The reference oracle (paper 000 positive control) and the judge-signal figure, on hand-worked cases."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval.judging.oracle import (
    ORACLE_JUDGE,
    candidate_sari,
    judge_signal,
    oracle_distribution,
    oracle_verdict_rows,
    signal_rows,
)
from train.preference.pairs import build_pairs, panel_choices

SOURCE = "About 95 species are currently accepted."
REFS = ["About 95 species are currently known.", "About 95 species are now accepted.", "95 species are now accepted."]
# sentence SARI against REFS (EASSE's sentence_sari; the first value is EASSE's own docstring example)
CANDS = {"m0": ("About 95 you now get in.", 26.95360195360195),
         "m1": ("About 95 species are now accepted.", 78.29135035656775),
         "m2": (SOURCE, 21.873217526575058),
         "m3": ("95 species are now accepted.", 65.34722222222221)}


def generations(rows: dict[str, str], sid: str = "s1", policy: str = "lexical", failed: tuple = ()) -> pd.DataFrame:
    return pd.DataFrame([{"id": sid, "policy": policy, "model": m, "source": SOURCE, "candidate": text,
                          "generation_error": "boom" if m in failed else ""} for m, text in rows.items()])


def test_candidate_sari_matches_easse_and_skips_failed_candidates():
    texts = [CANDS[m][0] for m in ("m0", "m1")] + ["", None]
    scores = candidate_sari(SOURCE, texts, REFS)
    assert scores[:2] == [pytest.approx(CANDS["m0"][1]), pytest.approx(CANDS["m1"][1])]
    assert scores[2:] == [None, None]


def test_oracle_picks_highest_and_lowest_sari_and_its_pairs_are_marked_oracle():
    rows = oracle_verdict_rows(generations({m: t for m, (t, _) in CANDS.items()}), {("s1", "lexical"): REFS})
    assert len(rows) == 1 and rows["judge"].iloc[0] == ORACLE_JUDGE and rows["parse_error"].iloc[0] == ""
    verdict = json.loads(rows["verdict_json"].iloc[0])
    # model order m0..m3: best m1 (78.29), worst m2 (21.87, the copy of the source), for every aspect
    assert {a: (v["best"], v["worst"]) for a, v in verdict.items()} == {
        "Lexical": (1, 2), "Structural": (1, 2), "Overall": (1, 2)}
    pairs, status = build_pairs(rows, {"lexical": "simplify_lexical_zeroshot"}, dev_fraction=0.0)
    assert pairs["chosen"].tolist() == [CANDS["m1"][0]] and pairs["rejected"].tolist() == [SOURCE]
    assert pairs["oracle"].tolist() == [True] and status["status"].tolist() == ["ok"]


def test_oracle_gives_no_verdict_without_two_scored_candidates_or_a_spread():
    one = oracle_verdict_rows(generations({"m0": CANDS["m0"][0], "m1": CANDS["m1"][0]}, failed=("m1",)),
                              {("s1", "lexical"): REFS})
    assert one["parse_error"].tolist() == ["fewer than two scored candidates"]
    same = oracle_verdict_rows(generations({"m0": SOURCE, "m1": SOURCE}), {("s1", "lexical"): REFS})
    assert same["parse_error"].tolist() == ["no score spread"]


def oracle_frame(scores_by_source: dict[str, list[float | None]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": sid, "policy": "lexical", "models_json": json.dumps([f"m{i}" for i in range(len(s))]),
                          "scores_json": json.dumps(s)} for sid, s in scores_by_source.items()])


def test_signal_counts_ties_for_the_jury_and_raises_chance_by_the_same_rule():
    oracle = oracle_frame({"a": [10.0, 30.0, 20.0, 5.0],   # best m1, worst m3: chance 1/4 each
                           "b": [30.0, 30.0, 10.0, 10.0],  # best m0|m1, worst m2|m3: chance 2/4 each
                           "c": [10.0, None, 20.0, 30.0],  # m1 failed: 3 shown, best m3, worst m0: chance 1/3
                           "d": [10.0, 20.0, 30.0, 40.0]})
    panel = pd.DataFrame({"id": ["a", "b", "c", "d"], "policy": "lexical",
                          "best_model": ["m1", "m1", "m2", None], "worst_model": ["m0", "m3", "m0", None]})
    rows = signal_rows(panel, oracle).set_index("id")
    assert rows.loc["a", ["best_hit", "worst_hit"]].tolist() == [1.0, 0.0]
    assert rows.loc["b", ["best_hit", "worst_hit", "chance_best", "chance_worst"]].tolist() == [1.0, 1.0, 0.5, 0.5]
    assert rows.loc["c", ["best_hit", "worst_hit"]].tolist() == [0.0, 1.0]
    assert rows.loc["c", "chance_best"] == pytest.approx(1 / 3)
    assert not rows.loc["d", "judged"] and np.isnan(rows.loc["d", "best_hit"])

    table = judge_signal(rows.reset_index(), n_boot=200, seed=0).iloc[0]
    assert table["sources"] == 4 and table["judged_and_ranked"] == 3 and table["coverage"] == pytest.approx(0.75)
    assert table["best_agreement"] == pytest.approx(2 / 3) and table["worst_agreement"] == pytest.approx(2 / 3)
    # chance over the three judged sources: (1/4 + 2/4 + 1/3) / 3
    assert table["best_chance"] == pytest.approx((0.25 + 0.5 + 1 / 3) / 3)
    assert table["best_lo"] <= table["best_agreement"] <= table["best_hi"]

    dist = oracle_distribution(rows.reset_index()).set_index("model")
    # oracle Best over the 4 ranked sources (ties to the first model): m1 (a), m0 (b), m3 (c, d)
    assert dist.loc["m3", "oracle_preferred_pct"] == pytest.approx(50.0)
    assert dist.loc["m0", "oracle_preferred_pct"] == pytest.approx(25.0)


def test_panel_choices_use_the_pairs_vote_and_map_models():
    verdict = {"Lexical": {"best": 2, "worst": 0, "error": ""}}
    bad = {"Lexical": {"best": None, "worst": None, "error": "missing"}}
    jury = pd.DataFrame([
        {"id": "a", "policy": "lexical", "judge": "j1", "models_json": json.dumps(["x", "y", "z"]),
         "candidates_json": json.dumps(["1", "2", "3"]), "verdict_json": json.dumps(verdict), "parse_error": ""},
        {"id": "b", "policy": "lexical", "judge": "j1", "models_json": json.dumps(["x", "y", "z"]),
         "candidates_json": json.dumps(["1", "2", "3"]), "verdict_json": json.dumps(bad), "parse_error": "missing"},
        {"id": "c", "policy": "lexical", "judge": "j1", "models_json": json.dumps(["x", "y"]),
         "candidates_json": json.dumps(["1", "2"]), "verdict_json": "",
         "parse_error": "too_few_candidates: 1 usable of 4 needed"}])
    choices = panel_choices(jury).set_index("id")
    assert choices.loc["a", ["best_model", "worst_model", "status"]].tolist() == ["z", "x", "ok"]
    assert choices.loc["b", "status"] == "no_valid_verdict" and pd.isna(choices.loc["b", "best_model"])
    assert choices.loc["c", "status"] == "too_few_candidates"
