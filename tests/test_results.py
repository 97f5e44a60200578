"""The results table of paper 000 runs: corpus SARI with bootstrap CIs, paired gains, win rates."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from eval.judging.parse import extract_ptb_tree
from eval.metrics.sari import corpus_sari
from eval.results import outcome_for, results_table, sari_counts, sari_of_counts, winrate_with_ci

SOURCES = ["the cat perched on the mat .", "he departed prior to dawn .", "the edifice was demolished ."]
REFS = [["the cat sat on the mat .", "a cat sat on the mat ."], ["he left before dawn .", "he went before dawn ."],
        ["the building was knocked down .", "the building was torn down ."]]


def outputs(systems: dict[str, list[str]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": f"s{i}", "system": name, "source": SOURCES[i], "output": text}
                         for name, texts in systems.items() for i, text in enumerate(texts)])


def references() -> dict[str, list[str]]:
    return {f"s{i}": refs for i, refs in enumerate(REFS)}


def test_summed_counts_give_corpus_sari():
    system = ["the cat sat on the mat .", "he departed before dawn .", "the building was demolished ."]
    counts = sari_counts(SOURCES, system, REFS)
    assert counts.shape == (3, 4, 9)
    streams = [[refs[k] for refs in REFS] for k in range(2)]
    assert sari_of_counts(counts) == pytest.approx(corpus_sari(SOURCES, system, streams))


def test_copying_the_source_gains_nothing_over_itself_and_a_reference_copy_gains():
    table = results_table(outputs({"vanilla": SOURCES, "same": SOURCES, "oracle": [r[0] for r in REFS]}),
                          references(), "vanilla", n_boot=200)
    rows = table.set_index("system")
    assert rows.loc["vanilla", "sari_gain"] == 0.0
    # identical outputs: every paired resample differs by exactly zero
    assert rows.loc["same", ["sari_gain", "sari_gain_lo", "sari_gain_hi"]].tolist() == [0.0, 0.0, 0.0]
    assert rows.loc["same", "sari"] == rows.loc["vanilla", "sari"]
    assert rows.loc["oracle", "sari_gain"] > 20
    for name in rows.index:
        assert rows.loc[name, "sari_lo"] <= rows.loc[name, "sari"] <= rows.loc[name, "sari_hi"]
    assert rows.loc["vanilla", "compression_ratio"] == pytest.approx(1.0)
    assert (rows["n"] == 3).all() and (rows["empty_outputs"] == 0).all()


def test_empty_outputs_are_scored_and_counted_not_dropped():
    table = results_table(outputs({"vanilla": SOURCES, "broken": ["", SOURCES[1], ""]}), references(), "vanilla",
                          n_boot=50)
    broken = table.set_index("system").loc["broken"]
    assert broken["n"] == 3 and broken["empty_outputs"] == 2
    streams = [[refs[k] for refs in REFS] for k in range(2)]
    assert broken["sari"] == pytest.approx(corpus_sari(SOURCES, ["", SOURCES[1], ""], streams))


def test_systems_must_cover_the_same_sources():
    frame = outputs({"vanilla": SOURCES, "trained": SOURCES}).iloc[:-1]
    with pytest.raises(ValueError, match="'trained' does not cover the same 3 source ids"):
        results_table(frame, references(), "vanilla")
    with pytest.raises(ValueError, match="baseline system 'base'"):
        results_table(outputs({"vanilla": SOURCES}), references(), "base")
    with pytest.raises(ValueError, match="no references"):
        results_table(outputs({"vanilla": SOURCES}), {"s0": REFS[0]}, "vanilla")


def test_win_rate_counts_ties_half_and_keeps_failures_out_of_the_rate():
    stats = winrate_with_ci(["A", "A", "B", "tie", None], ["s0", "s0", "s1", "s2", "s3"], n_boot=200)
    assert stats["win_rate"] == pytest.approx(0.625)
    assert (stats["wins"], stats["losses"], stats["ties"], stats["n_missing"]) == (2, 1, 1, 1)
    assert 0 <= stats["win_rate_lo"] <= 0.625 <= stats["win_rate_hi"] <= 1
    always = winrate_with_ci(["A"] * 4, ["s0", "s0", "s1", "s1"], n_boot=50)
    assert (always["win_rate"], always["win_rate_lo"], always["win_rate_hi"]) == (1.0, 1.0, 1.0)
    assert math.isnan(winrate_with_ci([None, None], ["s0", "s1"])["win_rate"])


def test_outcome_maps_shown_positions_to_the_system():
    assert outcome_for("A", "trained", "vanilla", "trained") == "A"
    assert outcome_for("A", "vanilla", "trained", "trained") == "B"
    assert outcome_for("B", "vanilla", "trained", "trained") == "A"
    assert outcome_for("tie", "vanilla", "trained", "trained") == "tie"
    assert outcome_for("", "vanilla", "trained", "trained") is None
    with pytest.raises(ValueError):
        outcome_for("A", "vanilla", "other", "trained")


def test_ptb_tree_is_cut_out_of_chatty_output():
    assert extract_ptb_tree("Here you go:\n```\n(S (NP (PRP We))\n  (VP (VBD left)))\n```") == \
        "(S (NP (PRP We))\n  (VP (VBD left)))"
    assert extract_ptb_tree("no tree here") == ""
    assert extract_ptb_tree("(S (NP (PRP We)) (VP") == ""
    assert extract_ptb_tree("(oops)") == ""
