"""Jury meta-evaluation statistics and report pieces on small hand-worked tables (pure: no Ray, no models)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pandas as pd
import pytest

from core.errors import CorpusError
from eval.judging import jury_meta as meta
from eval.judging.synth_bench import (
    asset_pairs,
    finalize_complex,
    read_word_list,
    render_requests,
    sample_prompt_pairs,
    simpeval_pairs,
)
from eval.report_html import Figure, Section, build_report, fmt, pivot_cells, render_html

NO_BOOT = meta.Bootstrap(n_boot=0)


def scores_frame(set_name: str, ids, models, **columns) -> pd.DataFrame:
    df = pd.DataFrame({"set": set_name, "id": ids, "model": models, "generation_error": "", **columns})
    return df


# ---------------------------------------------------------------------------------------------------------------
# Scores table


def test_wide_scores_pivots_judges_means_usable_scores_and_counts_unparsed():
    pairs = pd.DataFrame({"set": "synthetic", "id": ["s1", "s1", "s2"], "model": ["a", "b", "a"],
                          "source": "src", "candidate": ["x", "y", ""],
                          "generation_error": ["", "", "empty_after_cleaning"]})
    judgments = pd.DataFrame({
        "id": ["s1", "s1", "s1", "s1"], "policy": "synthetic", "model": ["a", "a", "b", "b"],
        "judge": ["j1", "j2", "j1", "j2"], "score": [4.0, 2.0, 5.0, None], "format": "score",
        "parse_error": ["", "", "", "no_score"]})
    wide = meta.wide_scores(pairs, judgments, ["j1", "j2", "j3"])
    row = wide.set_index(["id", "model"])
    assert row.loc[("s1", "a"), "judge:j1"] == 4.0 and row.loc[("s1", "a"), "judge:j2"] == 2.0
    assert row.loc[("s1", "a"), "jury"] == 3.0  # mean of 4 and 2
    assert row.loc[("s1", "b"), "jury"] == 5.0  # the unparsed judgment is excluded ...
    assert row.loc[("s1", "b"), "n_unparsed"] == 1 and row.loc[("s1", "b"), "n_judges"] == 1  # ... and counted
    assert math.isnan(row.loc[("s2", "a"), "jury"]) and row.loc[("s2", "a"), "n_judges"] == 0  # failed generation
    assert wide["judge:j3"].isna().all()  # a judge with no rows still gets its column
    empty = judgments.iloc[:0]  # no usable pair at all: every pair kept, nothing scored
    none = meta.wide_scores(pairs, empty, ["j1"])
    assert len(none) == 3 and none["jury"].isna().all() and none["judge:j1"].isna().all()
    assert (none["n_judges"] == 0).all()


def test_parse_health_counts_failures_per_judge():
    judgments = pd.DataFrame({"judge": ["j1", "j1", "j2"], "score": [3.0, None, None],
                              "parse_error": ["", "no_score", "empty"], "engine_error": ["", "", "timeout"],
                              "attempts": [1, 3, 1]})
    health = meta.parse_health(judgments, ["j1", "j2"]).set_index("judge")
    assert health.loc["j1", ["judgments", "scored", "parse_failures", "retried"]].tolist() == [2, 1, 1, 1]
    assert health.loc["j2", "engine_errors"] == 1 and math.isnan(health.loc["j2", "mean_score"])


# ---------------------------------------------------------------------------------------------------------------
# Statistics


def test_inter_judge_icc_hand_worked_and_incomplete_rows_counted():
    # judges j1, j2 on 3 complete pairs: grand mean 3, MSR = 2*(2.25+0+2.25)/2 = 4.5, MSC = 0,
    # residuals ±0.5 on rows 1 and 3 -> MSE = 1/2 = 0.5; ICC = (4.5-0.5)/(4.5+0.5+2*(0-0.5)/3) = 4/(14/3) = 6/7.
    # A 4th pair where j2 failed is excluded from the ANOVA and counted.
    df = scores_frame("synthetic", ["a", "b", "c", "d"], "m", **{"judge:j1": [1, 3, 5, 4],
                                                                  "judge:j2": [2, 3, 4, np.nan]})
    (row,) = meta.inter_judge_agreement(df, ["j1", "j2"], NO_BOOT)
    assert row["value"] == pytest.approx(6 / 7)
    assert (row["n_used"], row["n_excluded"]) == (3, 1)
    (single,) = meta.inter_judge_agreement(df, ["j1"], NO_BOOT)
    assert math.isnan(single["value"]) and single["note"] == "needs >= 2 judges"


def test_human_vs_jury_spearman_raw_and_icc_zscored_exclude_missing():
    # complete pairs: human (10, 20, 30) vs jury (1, 3, 2): ranks d = (0, -1, 1) -> rho = 1 - 6*2/(3*8) = 0.5.
    # z-scores over those pairs: human (-a, 0, a), jury (-a, a, 0), a = sqrt(1.5): MSR = 2.25, MSC = 0,
    # MSE = 0.75 -> ICC(2,1) = 1.5 / (3 - 0.5) = 0.6. The pair with no jury score is excluded and counted.
    df = scores_frame("simpeval", ["a", "b", "c", "d"], "m", human=[10.0, 20, 30, 40], jury=[1.0, 3, 2, np.nan])
    rows = {r["statistic"]: r for r in meta.human_vs_jury(df, NO_BOOT)}
    assert rows["spearman"]["value"] == pytest.approx(0.5)
    assert rows["ICC(2,1)"]["value"] == pytest.approx(0.6)
    assert all((r["n_used"], r["n_excluded"]) == (3, 1) for r in rows.values())


def test_expected_trend_spearman_with_tied_sizes_and_monotone_flag():
    # sizes (1,3,8,1,3,8) rank (1.5,3.5,5.5,...); jury (2,3,4,1,3,5) ranks (2,3.5,5,1,3.5,6).
    # Centered: x = (-2,0,2,-2,0,2), y = (-1.5,0,1.5,-2.5,0,2.5): rho = 16 / sqrt(16*17) = 4/sqrt(17).
    df = scores_frame("synthetic", ["s1"] * 3 + ["s2"] * 3, ["m1", "m3", "m8"] * 2,
                      size_b=[1.0, 3, 8] * 2, jury=[2.0, 3, 4, 1, 3, 5], fkgl=[9.0, 8, 7, 9, 8, 7])
    rows = {(r["a"], r["statistic"]): r for r in meta.expected_trend(df, ["jury", "fkgl"], NO_BOOT)}
    assert rows[("jury", "spearman")]["value"] == pytest.approx(4 / math.sqrt(17))
    assert rows[("fkgl", "spearman")]["value"] == pytest.approx(-1.0)
    assert rows[("jury", "monotone_means")]["value"] == 1.0  # means 1.5 < 3 < 4.5
    falling = df.assign(jury=[4.0, 3, 2, 5, 3, 1])
    flag = [r for r in meta.expected_trend(falling, ["jury"], NO_BOOT) if r["statistic"] == "monotone_means"]
    assert flag[0]["value"] == 0.0
    one_missing = df.assign(jury=[2.0, 3, 4, 1, 3, np.nan])
    (jury_rho,) = [r for r in meta.expected_trend(one_missing, ["jury"], NO_BOOT) if r["statistic"] == "spearman"]
    assert (jury_rho["n_used"], jury_rho["n_excluded"]) == (5, 1)


def test_metric_meta_table_per_set_and_human_column():
    simp = scores_frame("simpeval", ["a", "b", "c", "d"], "m", human=[20.0, 60, 40, 80],
                        fkgl=[12.0, 8, 10, 6], lev=[1.0, 2, 3, 4], jury=np.nan)
    asset = scores_frame("asset", ["e", "f", "g"], "m", human=[1.0, 2, 3], human_fluency=[3.0, 2, 1],
                         fkgl=[1.0, 2, 3], lev=[1.0, 1, 1], jury=np.nan)
    stats = pd.DataFrame(meta.metric_meta(pd.concat([simp, asset], ignore_index=True), ["fkgl", "lev", "jury"],
                                          NO_BOOT))
    cell = stats.set_index(["set", "a", "b"])["value"]
    assert cell[("simpeval", "fkgl", "human")] == pytest.approx(-1.0)  # fkgl falls as humans rate higher
    # lev ranks (1,2,3,4) vs human ranks (1,3,2,4): sum d^2 = 2 -> rho = 1 - 12/60 = 0.8
    assert cell[("simpeval", "lev", "human")] == pytest.approx(0.8)
    assert cell[("asset", "fkgl", "human_fluency")] == pytest.approx(-1.0)
    assert math.isnan(cell[("asset", "lev", "human")])  # a constant metric has no rank correlation
    jury = stats[(stats["a"] == "jury") & (stats["set"] == "simpeval")].iloc[0]
    assert math.isnan(jury["value"]) and (jury["n_used"], jury["n_excluded"]) == (0, 4)
    grid = pivot_cells(stats)
    assert list(grid.columns) == ["a", "simpeval/human", "asset/human", "asset/human_fluency"]
    assert grid.set_index("a").loc["fkgl", "simpeval/human"] == "-1.000 n/a n=4"


def test_bootstrap_resamples_source_sentences_not_rows():
    # six outputs of ONE source sentence: every resample draws that cluster, so the CI collapses on the estimate
    one = scores_frame("simpeval", ["s"] * 6, list("abcdef"), human=[1.0, 2, 3, 4, 5, 6], jury=[1.0, 3, 2, 5, 4, 6])
    rows = {r["statistic"]: r for r in meta.human_vs_jury(one, meta.Bootstrap(200, 0))}
    rho = rows["spearman"]
    assert rho["ci_lo"] == pytest.approx(rho["value"]) and rho["ci_hi"] == pytest.approx(rho["value"])
    many = one.assign(id=list("abcdef"))  # six sources: resampling them moves the estimate
    rho = {r["statistic"]: r for r in meta.human_vs_jury(many, meta.Bootstrap(200, 0))}["spearman"]
    assert rho["ci_lo"] < rho["value"] < rho["ci_hi"]


def test_system_means_and_spearman_matrix():
    df = scores_frame("synthetic", ["s1", "s2", "s1", "s2"], ["big", "big", "small", "small"],
                      size_b=[8.0, 8, 1, 1], jury=[4.0, 5, np.nan, np.nan], human=np.nan,
                      **{"judge:j1": [4.0, 5, np.nan, np.nan], "judge:j2": [np.nan] * 4})
    systems = meta.system_means(df, NO_BOOT).set_index("model")
    assert list(systems.index) == ["small", "big"]  # size order
    assert systems.loc["big", "jury_mean"] == 4.5 and systems.loc["big", "scored"] == 2
    assert math.isnan(systems.loc["small", "jury_mean"]) and systems.loc["small", "scored"] == 0
    matrix = meta.spearman_matrix(df, ["judge:j1", "judge:j2", "jury"])
    assert list(matrix.columns) == ["j1", "j2", "jury"]
    assert matrix.loc["j1", "jury"] == pytest.approx(1.0)  # pairwise complete: the 2 scored pairs
    assert math.isnan(matrix.loc["j2", "j2"]) and math.isnan(matrix.loc["j1", "j2"])  # a judge with no scores


# ---------------------------------------------------------------------------------------------------------------
# Metrics, benchmark inputs and human sets


def test_pair_metrics_skip_failed_generations_and_sari_needs_references():
    pairs = pd.DataFrame({"set": ["simpeval", "simpeval", "synthetic"], "id": ["a", "b", "c"], "model": "m",
                          "source": ["the big cat sat on the mat", "dogs bark at night", "x y z"],
                          "candidate": ["the cat sat", "dogs bark at night", ""],
                          "generation_error": ["", "", "empty_after_cleaning"],
                          "references": [["the cat sat on the mat", "a cat sat"], [], []]})
    out = meta.pair_metrics(pairs, ["compression_ratio", "levenshtein", "sari"])
    assert out["compression_ratio"].iloc[0] == pytest.approx(11 / 26)
    assert out["levenshtein"].iloc[1] == 1.0  # identical texts
    assert out[["compression_ratio", "levenshtein", "sari"]].iloc[2].isna().all()  # failed generation
    assert 0 < out["sari"].iloc[0] <= 100 and math.isnan(out["sari"].iloc[1])  # no references -> n/a
    assert meta.metric_columns(["fkgl", "bertscore"]) == ["fkgl", "bertscore_src"]
    with pytest.raises(ValueError, match="unknown metric"):
        meta.pair_metrics(pairs, ["sle"])


def test_simpeval_pairs_human_mean_references_and_zscores():
    frame = pd.DataFrame({"original_id": [1, 1, 1], "original": "Complex one.",
                          "generation": ["Sys out.", "Human A.", "Human B."],
                          "system": ["T5-3B", "Human 1 Writing", "Human 2 Writing"], "sentence_type": "Paraphrases",
                          "rating_1": [60.0, 90, 80], "rating_2": [np.nan, 70, 80], "rating_3": [30.0, 80, 80],
                          "rating_1_zscore": [0.5, 1, 1], "rating_2_zscore": [np.nan, 1, 1],
                          "rating_3_zscore": [-0.5, 1, 1]})
    out = simpeval_pairs(frame)
    assert list(out["id"]) == ["simpeval-1"] * 3
    assert out["human"].iloc[0] == 45.0 and out["n_human_missing"].iloc[0] == 1  # NaN excluded and counted
    assert out["references"].iloc[0] == ["Human A.", "Human B."] and out["references"].iloc[1] == []
    assert simpeval_pairs(frame, rating="zscore")["human"].iloc[0] == 0.0
    assert len(simpeval_pairs(frame, limit=2)) == 2
    with pytest.raises(CorpusError, match="rated twice"):
        simpeval_pairs(pd.concat([frame, frame.iloc[:1]], ignore_index=True))


def test_asset_pairs_average_workers_per_aspect_then_aspects():
    rows = []
    for worker, (flu, mea, sim) in enumerate([(60, 80, 20), (40, np.nan, 40)]):
        for aspect, rating in (("fluency", flu), ("meaning", mea), ("simplicity", sim)):
            rows.append({"original": "Orig.", "simplification": "Simp.", "original_sentence_id": 7,
                         "aspect": aspect, "worker_id": worker, "rating": float(rating)})
    out = asset_pairs(pd.DataFrame(rows))
    (pair,) = out.to_dict("records")
    assert (pair["human_fluency"], pair["human_meaning"], pair["human_simplicity"]) == (50.0, 80.0, 30.0)
    assert pair["human"] == pytest.approx(160 / 3) and pair["n_human_missing"] == 1
    assert (pair["id"], pair["model"]) == ("asset-7", "asset-system-1")


def test_prompt_pairs_are_seeded_distinct_and_spread_over_domains():
    domains, nouns = [f"d{i}" for i in range(4)], [f"n{i}" for i in range(30)]
    first = sample_prompt_pairs(domains, nouns, 10, seed=3)
    assert first.equals(sample_prompt_pairs(domains, nouns, 10, seed=3))
    assert not first.equals(sample_prompt_pairs(domains, nouns, 10, seed=4))
    counts = first["domain"].value_counts()
    assert counts.max() - counts.min() <= 1 and set(counts.index) == set(domains)
    assert not first.duplicated(["domain", "seed_noun"]).any()
    uniform = sample_prompt_pairs(domains, nouns, 120, seed=0, strategy="uniform")  # the whole grid
    assert not uniform.duplicated(["domain", "seed_noun"]).any()
    with pytest.raises(ValueError, match="exceeds"):
        sample_prompt_pairs(domains, nouns, 121, seed=0)


def test_word_lists_shipped_and_duplicates_named(tmp_path):
    assert len(read_word_list("configs/data/synth_domains.txt")) == 20
    nouns = read_word_list("configs/data/synth_nouns.txt")
    assert len(nouns) == 739 and "job" in nouns and nouns[0] == "people"
    bad = tmp_path / "w.txt"
    bad.write_text("# header\nalpha\nbeta\n\nalpha\n")
    with pytest.raises(CorpusError, match=r"line 5: duplicate entry 'alpha' \(first on line 2\)"):
        read_word_list(bad)


def test_writer_requests_render_domain_and_noun_and_answers_are_cleaned():
    rows = pd.DataFrame({"id": ["synth-0000", "synth-0001"], "domain": ["nursing", "art"],
                         "seed_noun": ["ladder", "soup"]})
    out = render_requests(rows, "synth_complex", {"subject": "domain", "seed_noun": "seed_noun"}, "w", "{}")
    assert "about nursing." in out["messages_json"].iloc[0] and "'ladder'" in out["messages_json"].iloc[0]
    answers = ['"Nurses must log ladder use."\nSecond line.', "   "]
    done = finalize_complex(out.assign(completion=answers, engine_error=""))
    assert done["source"].tolist() == ["Nurses must log ladder use.", ""]
    assert done["generation_error"].tolist() == ["", "empty_after_cleaning"]


# ---------------------------------------------------------------------------------------------------------------
# Report


def test_report_renders_nan_as_na_and_embeds_png_images():
    assert fmt(float("nan")) == "n/a" and fmt(0.12345) == "0.123" and fmt(3) == "3"
    png = b"\x89PNG-bytes"
    page = render_html("T", ["a <note>"], [Section("S", pd.DataFrame({"x": [1.0, np.nan]}))], [Figure("F", png)])
    assert "<td>n/a</td>" in page and "a &lt;note&gt;" in page
    encoded = base64.b64encode(png).decode()
    assert f'src="data:image/png;base64,{encoded}"' in page


def test_build_report_with_nothing_scored_still_has_tables_and_three_plots():
    scores = scores_frame("simpeval", ["a", "b"], ["m", "m"], human=[10.0, 20], jury=np.nan, n_unparsed=[2, 2],
                          **{"judge:j1": np.nan, "judge:j2": np.nan})
    stats = meta.meta_evaluate(scores, ["j1", "j2"], [], NO_BOOT)
    markdown, page, figures = build_report(
        "R", [], meta.overview(scores), pd.DataFrame({"judge": ["j1"]}), meta.system_means(scores, NO_BOOT),
        stats, meta.spearman_matrix(scores, ["judge:j1", "judge:j2", "jury"]), scores)
    assert len(figures) == 3 and all(f.png.startswith(b"\x89PNG") for f in figures)
    assert page.count('src="data:image/png;base64,') == 3
    assert "n/a" in markdown and "## Human vs jury (instance level)" in markdown
    assert "| simpeval | human | jury | spearman    | n/a" in markdown


def test_full_matrix_orients_fkgl_and_covers_ablations_on_the_synthetic_set_only():
    scores = pd.DataFrame({
        "set": ["synthetic"] * 4 + ["simpeval"],
        "size_b": [1.0, 3.0, 8.0, 70.0, float("nan")],
        "judge:j": [1.0, 2.0, 3.0, 4.0, 5.0], "judge:abl": [4.0, 3.0, 2.0, 1.0, 1.0],
        "jury": [1.0, 2.0, 3.0, 4.0, 5.0],
        "fkgl": [5.0, 6.0, 7.0, 8.0, 0.0],  # grade level rises with size: worse, as the paper says of FKGL
    })
    full = meta.full_matrix(scores, ["j"], ["abl"], ["fkgl", "bleu"])  # bleu: absent, left out
    assert list(full.columns) == ["j", "abl", "jury", "-fkgl", "size_b"]
    assert full.loc["-fkgl", "size_b"] == pytest.approx(-1.0)  # oriented: higher = simpler
    assert full.loc["abl", "size_b"] == pytest.approx(-1.0) and full.loc["j", "size_b"] == pytest.approx(1.0)
    assert meta.full_matrix(scores[scores["set"] != "synthetic"], ["j"], [], ["fkgl"]).empty
