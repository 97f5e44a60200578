"""Judge features (paper 000 step 1b): word alignments with the bundled MiniLM, parse bookkeeping."""

from __future__ import annotations

import json

import pandas as pd

from actors.features import AlignWorker, distinct_sentences, finish_parses, join_parses
from eval.judging.blocks import tokenize_for_alignment

SOURCE = "The committee postponed the decision indefinitely."


def candidates() -> pd.DataFrame:
    return pd.DataFrame({
        "id": ["s1"] * 3, "policy": ["lexical"] * 3, "model": ["a", "b", "c"], "source": [SOURCE] * 3,
        "candidate": ["The committee delayed the decision forever.", "", SOURCE],
        "generation_error": ["", "engine: boom", ""],
    })


def test_alignments_are_word_index_pairs_and_failed_candidates_are_kept():
    out = AlignWorker("", tau=0.88, threshold=0.40)(candidates())
    assert len(out) == 3
    delayed = json.loads(out["alignment_json"][0])
    src, tgt = tokenize_for_alignment(SOURCE), tokenize_for_alignment(out["candidate"][0])
    pairs = {(src[i], tgt[j]) for i, j in delayed}
    assert ("committee", "committee") in pairs and ("decision", "decision") in pairs
    assert out["alignment_json"][1] == "" and out["feature_error"][1] == "no candidate to align"
    # a copy of the source aligns every word to itself
    identity = json.loads(out["alignment_json"][2])
    assert [tuple(p) for p in identity] == [(i, i) for i in range(len(src))]


def test_distinct_sentences_skip_failed_candidates_and_parses_join_back():
    frame = candidates()
    texts = distinct_sentences(frame)
    assert sorted(texts["text"]) == sorted({SOURCE, "The committee delayed the decision forever."})
    answers = {SOURCE: "Sure: (S (NP (DT The) (NN committee)) (VP (VBD postponed)))",
               "The committee delayed the decision forever.": "(S (NP"}
    completions = pd.DataFrame({"text": list(answers), "completion": list(answers.values()), "engine_error": ""})
    parses = finish_parses(completions).set_index("text")
    assert parses.loc[SOURCE, "parse"] == "(S (NP (DT The) (NN committee)) (VP (VBD postponed)))"
    assert parses.loc["The committee delayed the decision forever.", "parse_error"] == "no parse in the output"
    joined = join_parses(frame.assign(feature_error=""), parses.reset_index()).set_index("model")
    assert (joined["source_parse"] == parses.loc[SOURCE, "parse"]).all()
    assert joined.loc["c", "parse"] == parses.loc[SOURCE, "parse"]  # the candidate that copies the source
    for model in ("a", "b"):  # an unclosed tree and a failed generation: no parse, noted, row kept
        assert joined.loc[model, "parse"] == "" and "parse missing" in joined.loc[model, "feature_error"]
