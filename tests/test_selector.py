"""Best/worst from a scalar scorer (paper 000's LENS-SALSA-style baseline), shaped like the jury's verdicts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from actors.selector import ScoreWorker, SelectorConfig, scorer_verdicts
from eval.metrics.lens import MetricUnavailable
from train.preference.pairs import build_pairs

SOURCE = ("Notwithstanding the considerable reservations expressed by several committee members, the municipal "
          "authorities ultimately ratified the controversial proposal.")


def candidate_set(texts: list[str], errors: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"id": "s1", "policy": "lexical", "source": SOURCE, "model": [f"m{i}" for i in range(len(texts))],
                         "candidate": texts, "generation_error": errors or [""] * len(texts)})


def test_verdicts_pick_highest_and_lowest_with_ties_to_the_lower_index():
    group = candidate_set(["a", "b", "c", "d"]).assign(selector_score=[0.2, 0.9, 0.9, 0.1])
    row = scorer_verdicts(group, "scorer:x").iloc[0]
    verdict = json.loads(row["verdict_json"])
    assert verdict["Lexical"] == verdict["Overall"] == {"best": 1, "worst": 3, "error": ""}
    assert row["parse_error"] == "" and row["judge"] == "scorer:x"
    # the rows feed build_pairs exactly like jury rows
    pairs, status = build_pairs(pd.DataFrame([row]), {"lexical": "simplify_lexical_zeroshot"}, dev_fraction=0.0)
    assert (pairs.loc[0, "chosen"], pairs.loc[0, "rejected"]) == ("b", "d")
    assert status.loc[0, "status"] == "ok"


def test_no_spread_gives_no_verdict_and_is_counted():
    group = candidate_set(["a", "b", "c"], ["", "engine: x", ""]).assign(selector_score=[0.5, float("nan"), 0.5])
    row = scorer_verdicts(group, "scorer:x").iloc[0]
    assert row["parse_error"] == "fewer than two distinct candidate scores"
    pairs, status = build_pairs(pd.DataFrame([row]), {"lexical": "simplify_lexical_zeroshot"})
    assert pairs.empty and status.loc[0, "status"] == "no_valid_verdict" and status.loc[0, "n_invalid"] == 1


def test_meaning_simplicity_prefers_a_plain_paraphrase_and_rejects_nonsense():
    texts = [SOURCE, "Some committee members had doubts, but the city leaders finally approved the plan.",
             "Yes yes yes.", ""]
    scored = ScoreWorker("meaning_simplicity", SelectorConfig().fkgl_weight, "")(candidate_set(texts, ["", "", "", "engine: boom"]))
    scores = scored["selector_score"].tolist()
    assert pd.isna(scores[3])  # a failed generation is not scored
    assert scores[1] > scores[0] > scores[2]


def test_lens_salsa_without_a_checkpoint_says_what_to_set(monkeypatch):
    monkeypatch.delenv("QUORUM_LENS_SALSA_PATH", raising=False)
    with pytest.raises(MetricUnavailable, match="QUORUM_LENS_SALSA_PATH"):
        ScoreWorker("lens_salsa", 0.05, "")


def test_selector_config_names_bad_fields():
    with pytest.raises(ValueError, match="selector.kind"):
        SelectorConfig(kind="vote").validate("selector")
    with pytest.raises(ValueError, match="selector.scorer"):
        SelectorConfig(kind="scorer", scorer="bleu").validate("selector")
