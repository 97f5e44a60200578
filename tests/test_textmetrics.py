"""Text metrics, the batch API, BERTScore and the LENS adapters."""

from __future__ import annotations

import importlib.util
import random

import pandas as pd
import pytest

from eval.metrics import lens
from eval.metrics.text import (
    compression_ratio,
    corpus_bleu,
    corpus_fkgl,
    count_syllables,
    is_split,
    levenshtein_distance,
    levenshtein_similarity,
    score_corpus,
    score_sentences,
    score_table,
    sentence_bleu,
    sentence_fkgl,
)
from eval.metrics.textnorm import split_sentences


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


# ----------------------------------------------------------------------------- BLEU


def test_bleu_reference_values(shared_data):
    # BLEU columns of shared/data/*/reference-values.md (EASSE corpus_bleu: 13a, case-sensitive).
    turk = shared_data / "turkcorpus"
    orig = read_lines(turk / "tune.8turkers.tok.norm")
    refs = [read_lines(turk / f"tune.8turkers.tok.turk.{i}") for i in range(8)]
    assert round(corpus_bleu(orig, refs), 4) == 99.2797
    assert round(corpus_bleu(refs[0], refs[1:]), 4) == 77.4939
    assert round(corpus_bleu(refs[7], refs[:7]), 4) == 77.2243
    asset = shared_data / "asset"
    a_orig = read_lines(asset / "asset.valid.orig")
    a_refs = [read_lines(asset / f"asset.valid.simp.{i}") for i in range(10)]
    assert round(corpus_bleu(a_orig, a_refs), 4) == 94.1766
    assert round(corpus_bleu(a_refs[0], a_refs[1:]), 4) == 78.6834
    # ASSET is cased: lowercasing (what `easse evaluate` does) changes BLEU, so the setting matters.
    head = [stream[:200] for stream in a_refs]
    assert corpus_bleu(a_orig[:200], head, lowercase=True) != corpus_bleu(a_orig[:200], head)


def test_sentence_bleu_follows_easse_settings():
    # Identical output and reference: every n-gram precision is 1, no brevity penalty -> 100.
    assert sentence_bleu("The cat sat on the mat.", ["The cat sat on the mat."]) == pytest.approx(100.0)
    # Effective order: a 2-token output with a matching reference still scores 100 (orders 3-4 ignored).
    assert sentence_bleu("Hello world", ["hello world"], lowercase=True) == pytest.approx(100.0)
    assert sentence_bleu("Hello world", ["hello world"]) < 100.0  # case-sensitive by default


# ----------------------------------------------------------------------------- FKGL


@pytest.mark.parametrize("word, syllables", [
    ("the", 1),         # special-word table
    ("cat", 1),         # one vowel run
    ("happy", 2),       # runs "a", "y"
    ("animal", 3),      # runs "a", "i", "a"
    ("table", 2),       # "tabl" after stripping e: run "a" + 1 for a vowel followed by "bl" at the end
    ("simple", 1),      # "simpl": run "i"; "mpl" matches no rule (EASSE's counter gives 1)
    ("ion", 1),         # run "io" = 1, +1 "io", -1 "ion"
    ("beautiful", 4),   # runs "eau", "i", "u" = 3, +1 three vowels in a row
    ("mcdonald", 3),    # runs "o", "a" = 2, +1 leading "mc"
    ("free", 0),        # all trailing e's stripped: "fr" has no vowel
    (".", 0),
])
def test_count_syllables_follows_easse_rules(word, syllables):
    assert count_syllables(word) == syllables


def test_fkgl_hand_worked():
    # "the happy animal sat on the table ." + "the cat ran ." after lowercasing and 13a:
    # 2 sentences, 8 + 4 = 12 words (the "." tokens count, as in EASSE),
    # syllables 1+2+3+1+1+1+2+0 + 1+1+1+0 = 14.
    # FKGL = 0.39·12/2 + 11.8·14/12 - 15.59 = 2.34 + 13.7667 - 15.59 = 0.51667
    text = "The happy animal sat on the table. The cat ran."
    assert sentence_fkgl(text) == pytest.approx(0.39 * 6 + 11.8 * 14 / 12 - 15.59)
    # Corpus FKGL pools counts; the same two sentences on two lines give the same value.
    assert corpus_fkgl(["The happy animal sat on the table.", "The cat ran."]) == pytest.approx(sentence_fkgl(text))
    # Short simple text: the formula goes negative and is clipped to 0, as in EASSE.
    assert sentence_fkgl("The cat sat.") == 0.0
    assert corpus_fkgl([]) == 0.0


# ----------------------------------------------------------------------------- surface metrics


def _indel_distance(a: str, b: str) -> int:
    # Independent check: dynamic programme where a substitution costs 2 (= delete + insert).
    table = [[i + j if i == 0 or j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1,
                              table[i - 1][j - 1] + (0 if a[i - 1] == b[j - 1] else 2))
    return table[-1][-1]


def test_levenshtein_hand_worked_and_against_a_dynamic_programme():
    assert levenshtein_distance("kitten", "sitting") == 3  # k->s, e->i, +g
    assert levenshtein_distance("", "abc") == 3
    # ratio = 1 - indel/(6 + 7); indel("kitten", "sitting") = 5 (2 substitutions cost 4, +g 1).
    assert levenshtein_similarity("kitten", "sitting") == pytest.approx(1 - 5 / 13)
    assert levenshtein_similarity("", "") == 1.0
    assert levenshtein_similarity("abc", "xyz") == 0.0
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("abcd ") for _ in range(rng.randint(0, 70)))
        b = "".join(rng.choice("abcd ") for _ in range(rng.randint(0, 70)))
        expected = 1.0 if not a and not b else 1 - _indel_distance(a, b) / (len(a) + len(b))
        assert levenshtein_similarity(a, b) == pytest.approx(expected)


def test_compression_split_and_sentence_splitting():
    assert compression_ratio("abcd", "ab") == 0.5
    assert compression_ratio("", "ab") == 0.0
    assert split_sentences("Mr. Smith arrived at 5 p.m. and left. Then it rained!") == [
        "Mr. Smith arrived at 5 p.m. and left.", "Then it rained!"]
    assert split_sentences("the cat sat . it ran .\n\nNew paragraph") == ["the cat sat .", "it ran .", "New paragraph"]
    assert split_sentences("He waited... Then he left.") == ["He waited...", "Then he left."]
    assert split_sentences("") == []
    assert is_split("He came and he saw.", "He came. He saw.")
    assert not is_split("He came. He saw.", "He came and saw.")


# ----------------------------------------------------------------------------- batch API

ORIG = ["The cat perched on the mat.", "He came and he saw the town.", "It is big."]
SYS = ["The cat sat on the mat.", "He came. He saw the town.", "It is big."]
REFS = [["The cat sat on the mat.", "He came. He saw the city.", "It is large."],
        ["A cat is on the mat.", "He came and saw the town.", "It is big."]]


def test_score_corpus_matches_the_single_metric_functions():
    from eval.metrics.sari import corpus_sari

    scores = score_corpus(["sari", "bleu", "fkgl", "exact_copy", "split_rate", "compression_ratio", "levenshtein"],
                          ORIG, SYS, REFS)
    sari = corpus_sari(ORIG, SYS, REFS, return_components=True)
    assert (scores["sari"], scores["sari_add"], scores["sari_keep"], scores["sari_del"]) == tuple(sari)
    assert scores["bleu"] == corpus_bleu(SYS, REFS)
    assert scores["fkgl"] == corpus_fkgl(SYS)
    assert scores["exact_copy"] == pytest.approx(1 / 3)   # only "It is big." is copied
    assert scores["split_rate"] == pytest.approx(1 / 3)   # only the second output is split
    # normalised: "it is big ." (11 chars) both sides -> 1.0; the others computed directly
    ratios = [len(s.lower().replace(".", " .")) / len(o.lower().replace(".", " .")) for o, s in zip(ORIG, SYS)]
    assert scores["compression_ratio"] == pytest.approx(sum(ratios) / 3)


def test_score_sentences_gives_one_dict_per_sentence():
    rows = score_sentences(["sari", "exact_copy", "fkgl"], ORIG, SYS, REFS)
    assert len(rows) == 3
    assert set(rows[0]) == {"sari", "sari_add", "sari_keep", "sari_del", "exact_copy", "fkgl"}
    assert [r["exact_copy"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[1]["fkgl"] == sentence_fkgl(SYS[1])


def test_score_corpus_rejects_bad_requests():
    with pytest.raises(ValueError, match="unknown metric"):
        score_corpus(["sari", "meteor"], ORIG, SYS, REFS)
    with pytest.raises(ValueError, match="need references"):
        score_corpus(["sari"], ORIG, SYS, None)
    with pytest.raises(ValueError, match="3 source sentences but 2 system outputs"):
        score_corpus(["fkgl"], ORIG, SYS[:2], None)
    assert score_corpus(["fkgl", "split_rate"], ORIG, SYS, None)["split_rate"] == pytest.approx(1 / 3)


def test_empty_corpus_scores_zero():
    names = ["sari", "bleu", "fkgl", "dsari", "compression_ratio", "exact_copy", "levenshtein", "split_rate"]
    scores = score_corpus(names, [], [], [[]])
    assert set(scores.values()) == {0.0} and len(scores) == 11
    assert score_sentences(names, [], [], [[]]) == []


def test_score_table_reads_dataframes_and_parquet_with_ragged_references(tmp_path):
    df = pd.DataFrame({"source": ORIG, "output": SYS,
                       "references": [[REFS[0][0], REFS[1][0]], [REFS[0][1]], [REFS[0][2], REFS[1][2]]]})
    corpus, sentences = score_table(df, ["sari", "bleu"])
    # The None-padded streams score exactly like giving the references sentence by sentence.
    assert corpus["sari"] == pytest.approx(score_corpus(["sari"], ORIG, SYS, [
        [REFS[0][0], REFS[0][1], REFS[0][2]], [REFS[1][0], None, REFS[1][2]]])["sari"])
    assert list(sentences.columns) == ["sari", "sari_add", "sari_keep", "sari_del", "bleu"]
    path = tmp_path / "outputs.parquet"
    df.to_parquet(path)
    corpus_from_file, _ = score_table(path, ["sari", "bleu"])
    assert corpus_from_file == pytest.approx(corpus)


def test_score_table_errors_name_the_row_and_column(tmp_path):
    df = pd.DataFrame({"source": ORIG, "output": [SYS[0], None, SYS[2]], "references": [[r] for r in REFS[0]]})
    with pytest.raises(ValueError, match=r"row 1, column 'output': expected text"):
        score_table(df, ["sari"])
    df = pd.DataFrame({"source": ORIG, "output": SYS, "references": ["a", ["b"], ["c"]]})
    with pytest.raises(ValueError, match=r"row 0, column 'references': expected a list"):
        score_table(df, ["sari"])
    with pytest.raises(ValueError, match="no column 'refs'"):
        score_table(df, ["sari"], refs_col="refs")


# ----------------------------------------------------------------------------- model metrics


def test_bertscore_with_the_bundled_minilm():
    from eval.metrics.bertscore import corpus_bertscore, sentence_bertscore

    scores = sentence_bertscore(
        ["The cat sat on the mat.", "A cat was sitting on the mat.", "Stock prices fell sharply today.", ""],
        [["The cat sat on the mat."], ["The cat sat on the mat."], ["The cat sat on the mat."], ["Anything."]],
    )
    assert scores[0] == pytest.approx((1.0, 1.0, 1.0), abs=1e-5)   # identical texts match token for token
    assert scores[2].f1 < scores[1].f1 < scores[0].f1               # paraphrase above unrelated text
    assert scores[3] == (0.0, 0.0, 0.0)                             # no token to match
    # Several references: the best one (by F1) is kept.
    best = sentence_bertscore(["The cat sat on the mat."], [["Stocks fell.", "The cat sat on the mat."]])[0]
    assert best.f1 == pytest.approx(1.0, abs=1e-5)
    mean = corpus_bertscore(["The cat sat on the mat.", ""], [["The cat sat on the mat."], ["x"]])
    assert mean.f1 == pytest.approx(0.5, abs=1e-5)


def test_lens_not_configured_says_what_to_set(monkeypatch):
    monkeypatch.delenv("QUORUM_LENS_PATH", raising=False)
    expected = "LENS is not configured: pass model_path= or set QUORUM_LENS_PATH"
    with pytest.raises(lens.MetricUnavailable, match=expected):
        lens.score_lens(["a"], ["b"], [["c"]])
    monkeypatch.delenv("QUORUM_LENS_SALSA_PATH", raising=False)
    with pytest.raises(lens.MetricUnavailable, match="LENS-SALSA is not configured.*QUORUM_LENS_SALSA_PATH"):
        lens.score_lens_salsa(["a"], ["b"])


def test_lens_missing_checkpoint_and_missing_package(monkeypatch, tmp_path):
    monkeypatch.setenv("QUORUM_LENS_PATH", str(tmp_path / "nope.ckpt"))
    with pytest.raises(lens.MetricUnavailable, match=r"nope.ckpt \(from QUORUM_LENS_PATH\) does not exist"):
        lens.load_metric("lens")
    if importlib.util.find_spec("lens") is not None:
        pytest.skip("lens-metric is installed here; the missing-package message cannot be exercised")
    checkpoint = tmp_path / "lens.ckpt"
    checkpoint.write_bytes(b"")
    with pytest.raises(lens.MetricUnavailable, match="'lens-metric' package is not installed"):
        lens.load_metric("lens", model_path=checkpoint)
