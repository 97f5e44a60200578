"""SARI and D-SARI: EASSE's reference tables, EASSE's documented examples, hand-worked cases."""

from __future__ import annotations

import math

import pytest

from eval.metrics.dsari import compute_length_penalties, corpus_dsari, document_sari
from eval.metrics.sari import corpus_sari, score_xu2016, sentence_sari, sentence_sari_scores, sentence_sari_xu2016


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def read_corpus(folder, orig_name, refs_prefix, n_refs):
    """(source lines, one list of lines per reference file `<refs_prefix><i>`, i < n_refs)."""
    return read_lines(folder / orig_name), [read_lines(folder / f"{refs_prefix}{i}") for i in range(n_refs)]


@pytest.fixture(scope="module")
def turk(shared_data):
    return read_corpus(shared_data / "turkcorpus", "tune.8turkers.tok.norm", "tune.8turkers.tok.turk.", 8)


@pytest.fixture(scope="module")
def asset(shared_data):
    return read_corpus(shared_data / "asset", "asset.valid.orig", "asset.valid.simp.", 10)


def assert_components(score, sari, add, keep, delete):
    assert (round(score.sari, 4), round(score.add, 4), round(score.keep, 4), round(score.delete, 4)) == (
        sari, add, keep, delete)


# ----------------------------------------------------------------------------- reference tables


def test_turkcorpus_reference_values(turk):
    # shared/data/turkcorpus/reference-values.md (EASSE, lowercase=True, tokenizer='13a').
    orig, refs = turk
    assert_components(corpus_sari(orig, orig, refs, return_components=True), 26.9978, 0.0, 80.9935, 0.0)
    assert_components(corpus_sari(orig, refs[0], refs[1:], return_components=True), 40.7804, 7.2685, 73.2010, 41.8718)
    assert_components(corpus_sari(orig, refs[7], refs[:7], return_components=True), 40.6240, 7.2073, 72.8353, 41.8295)


def test_asset_reference_values(asset):
    # shared/data/asset/reference-values.md.
    orig, refs = asset
    assert_components(corpus_sari(orig, orig, refs, return_components=True), 22.5348, 0.0, 67.6043, 0.0)
    assert_components(corpus_sari(orig, refs[0], refs[1:], return_components=True), 44.9386, 9.4103, 65.1878, 60.2179)


def test_corpus_sari_returns_the_mean_of_its_components(turk):
    orig, refs = turk
    streams = [stream[:50] for stream in refs[:3]]
    score = corpus_sari(orig[:50], refs[3][:50], streams, return_components=True)
    assert score.sari == pytest.approx((score.add + score.keep + score.delete) / 3)
    assert corpus_sari(orig[:50], refs[3][:50], streams) == score.sari


# ----------------------------------------------------------------------------- EASSE's examples

EXAMPLE_ORIG = "About 95 species are currently accepted."
EXAMPLE_REFS = [
    "About 95 species are currently known.", "About 95 species are now accepted.", "95 species are now accepted.",
]


def test_easse_readme_sentence_example():
    # EASSE README: sentence_sari(...) -> 26.953601953601954 (also HF evaluate's SARI card value).
    assert sentence_sari(EXAMPLE_ORIG, "About 95 you now get in.", EXAMPLE_REFS) == pytest.approx(26.953601953601954)


def test_easse_readme_corpus_example():
    # EASSE README: corpus_sari on two sentences with three reference streams -> 33.17472563619544.
    score = corpus_sari(
        [EXAMPLE_ORIG, "The cat perched on the mat."],
        ["About 95 you now get in.", "Cat on mat."],
        [[EXAMPLE_REFS[0], "The cat sat on the mat."], [EXAMPLE_REFS[1], "The cat is on the mat."],
         [EXAMPLE_REFS[2], "The cat sat."]],
    )
    assert score == pytest.approx(33.17472563619544)


@pytest.mark.parametrize("sys_sent, expected", [
    ("About 95 you now get in .", 26.82782411698074),
    ("About 95 species are now agreed .", 58.89995423074248),
    ("About 95 species are currently agreed .", 50.71608864657479),
])
def test_xu2016_sentence_values_from_easse_tests(sys_sent, expected):
    # EASSE's tests/test_sari.py (skipped there as "probably broken") pins these figures; they are
    # the values of Xu et al.'s original SARIsent on tokenised text, which sentence_sari_xu2016 is.
    refs = [r.replace(".", " .") for r in EXAMPLE_REFS]
    assert sentence_sari_xu2016(EXAMPLE_ORIG.replace(".", " ."), sys_sent, refs) == pytest.approx(expected)


# ----------------------------------------------------------------------------- hand-worked


def test_output_equal_to_reference_loses_only_the_empty_4gram_keep():
    # orig "a b c d", sys = ref = "a b c e" (one reference, R = 1):
    # orders 1-3: ADD {e..} correct 1/1; KEEP all shared n-grams kept and wanted -> F1 1;
    #             DELETE the n-grams with "d": dropped by both -> F1 1.
    # order 4: ADD "a b c e" correct -> 1; KEEP: nothing kept, nothing to keep -> P = R = 0 -> F1 0;
    #          DELETE "a b c d" -> 1.
    # add = 100, keep = 3/4·100 = 75, delete = 100 -> SARI = 275/3.
    score = corpus_sari(["a b c d"], ["a b c e"], [["a b c e"]], tokenizer="none", return_components=True)
    assert score == pytest.approx((275 / 3, 100.0, 75.0, 100.0))


def test_multiple_references_weight_keep_and_delete_counts():
    # orig "a b", sys "a", refs "a" and "a b" (R = 2): orig and sys counts are doubled, refs summed.
    # unigrams: refs {a: 2, b: 1}.
    #   ADD: nothing added, nothing to add -> 0.
    #   KEEP: a: min(2, 2, 2) = 2 kept correctly; b: sys keeps 0, refs keep min(2, 1) = 1.
    #         P = 2/2, R = 2/3 -> F1 = 0.8.
    #   DELETE: b: sys deletes 2, refs delete 2 - 1 = 1, correct 1 -> P = 1/2, R = 1/1, F1 = 2/3.
    # bigrams: "a b" (orig 2, refs 1): KEEP 0 kept -> 0; DELETE sys 2, refs 1, correct 1 -> P 1/2, F1 2/3.
    # corpus: add 0, keep 0.8/4 = 20, delete (2/3 + 2/3)/4 = 33.33 -> SARI 17.78
    score = corpus_sari(["a b"], ["a"], [["a"], ["a b"]], tokenizer="none", return_components=True)
    assert score == pytest.approx((160 / 9, 0.0, 20.0, 100 / 3))
    # sentence level scores DELETE by precision: (1/2 + 1/2)/4 = 25 -> SARI (0 + 20 + 25)/3 = 15.
    assert sentence_sari("a b", "a", ["a", "a b"], tokenizer="none", return_components=True) == pytest.approx(
        (15.0, 0.0, 20.0, 25.0))


def test_lowercase_and_tokenizer_are_applied_to_every_side():
    # Lowercased and 13a-tokenised, orig "The Cat." becomes "the cat .", the output itself: a copy.
    # Copy: nothing added or deleted; KEEP F1 = 1 on orders 1-3, order 4 empty -> keep 75, SARI 25.
    normalised = corpus_sari(["The Cat."], ["the cat ."], [["the cat ."]], return_components=True)
    assert normalised == pytest.approx((25.0, 0.0, 75.0, 0.0))
    # Raw, "The" and "Cat." are different tokens from "the", "cat", ".": the output now "adds" them.
    raw = corpus_sari(["The Cat."], ["the cat ."], [["the cat ."]], lowercase=False, tokenizer="none",
                      return_components=True)
    assert raw.add > 0


def test_none_references_are_skipped():
    # Sentence 0: orig "a b", sys "a", one ref "a" (the None is skipped, R = 1).
    #   1-grams KEEP (correct, sys, ref) = (1, 1, 1), DELETE "b" = (1, 1, 1); 2-grams DELETE "a b" = (1, 1, 1).
    # Sentence 1: orig "c d", sys "c", refs "c" and "c d" (R = 2), as in the test above:
    #   1-grams KEEP (2, 2, 3), DELETE (1, 2, 1); 2-grams KEEP (0, 0, 1), DELETE (1, 2, 1).
    # Summed: 1-gram KEEP (3, 3, 4) -> P 1, R 3/4, F1 6/7; DELETE (2, 3, 2) -> F1 0.8;
    #         2-gram KEEP F1 0; DELETE (2, 3, 2) -> F1 0.8.
    # keep = (6/7)/4 = 150/7 %, delete = 1.6/4 = 40 %, add 0 -> SARI = (150/7 + 40)/3 = 430/21.
    score = corpus_sari(["a b", "c d"], ["a", "c"], [["a", "c"], [None, "c d"]], tokenizer="none",
                        return_components=True)
    assert score == pytest.approx((430 / 21, 0.0, 150 / 7, 40.0))
    per_sentence = sentence_sari_scores(["a b"], ["a"], [["a"], [None]], tokenizer="none")
    assert per_sentence[0] == sentence_sari("a b", "a", ["a"], tokenizer="none", return_components=True)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="2 source sentences but 1 system outputs"):
        corpus_sari(["a", "b"], ["a"], [["a", "b"]])
    with pytest.raises(TypeError, match=r"refs_sents\[0\] is a string"):
        corpus_sari(["a"], ["a"], ["a"])
    with pytest.raises(ValueError, match="reference stream 1 has 1 sentences but there are 2"):
        corpus_sari(["a", "b"], ["a", "b"], [["a", "b"], ["a"]])
    with pytest.raises(ValueError, match="sentence 0 has no reference"):
        corpus_sari(["a"], ["a"], [[None]])
    with pytest.raises(ValueError, match="unknown tokenizer 'moses'"):
        corpus_sari(["a"], ["a"], [["a"]], tokenizer="moses")


# ----------------------------------------------------------------------------- D-SARI


def test_length_penalties_hand_worked():
    # Short output: L_O = 50 < L_R = 60 -> LP_1 = exp(-10/50); 4 vs 5 sentences -> SLP = exp(-1/5).
    assert compute_length_penalties(100, 50, 60, 4, 5) == pytest.approx((math.exp(-0.2), 1, math.exp(-0.2)))
    # Long output: L_O = 80 > L_R = 60 -> LP_2 = exp((60 - 80) / max(100 - 60, 1)) = exp(-0.5).
    assert compute_length_penalties(100, 80, 60, 5, 5) == pytest.approx((1, math.exp(-0.5), 1))
    # Empty output (the script divides by zero): LP_1 = 0; 0 vs 1 sentence -> SLP = exp(-1).
    assert compute_length_penalties(10, 0, 5, 0, 1) == pytest.approx((0.0, 1, math.exp(-1)))
    assert compute_length_penalties(0, 0, 0, 0, 0) == (1, 1, 1.0)


def test_document_sari_without_penalties_is_xu_sari():
    # orig "the cat sat . it was happy ." -> sys = ref = "the cat sat ." (lengths 4 = 4, 1 = 1
    # sentence: every penalty is 1).
    # 1-grams: KEEP the/cat/sat/. all kept and wanted -> F1 1; DELETE candidates ". it was happy"
    #   (". " once more in orig than in sys): ref keeps one "." -> 3 of 4 good -> 0.75; ADD none -> 0.
    # 2-, 3-, 4-grams: KEEP 1, DELETE all dropped n-grams are absent from the ref -> 1; ADD 0.
    # keep 100, delete (0.75 + 3)/4 = 93.75, add 0 -> (100 + 93.75)/3 = 64.583
    # tokenizer="13a": the hand-worked tokens below are sacrebleu's (the default is the script's split(" "))
    score = document_sari("The cat sat. It was happy.", "The cat sat.", ["The cat sat."], return_components=True,
                          tokenizer="13a")
    assert score == pytest.approx((193.75 / 3, 0.0, 100.0, 93.75))
    plain = score_xu2016(["the", "cat", "sat", ".", "it", "was", "happy", "."], ["the", "cat", "sat", "."],
                         [["the", "cat", "sat", "."]])
    assert plain == pytest.approx(tuple(score))


def test_document_sari_penalises_a_too_long_output():
    # Output with 9 words against a 4-word reference: L_O > L_R, LP_2 = exp((4 - 9)/max(9 - 4, 1)) = e^-1,
    # and 2 sentences against 1: SLP = exp(-1/2).
    orig, out, ref = "The cat sat. It was happy.", "The cat sat. It was happy.", "The cat sat."
    tokens = ["the", "cat", "sat", ".", "it", "was", "happy", "."]
    base = score_xu2016(tokens, list(tokens), [["the", "cat", "sat", "."]])
    score = document_sari(orig, out, [ref], return_components=True, tokenizer="13a")
    assert score.keep == pytest.approx(base.keep * math.exp(-1) * math.exp(-0.5))
    assert score.delete == pytest.approx(base.delete * math.exp(-1))
    assert score.add == pytest.approx(base.add)


def test_corpus_dsari_per_reference_averages_single_reference_scores():
    orig, out = "The cat sat. It was happy.", "The cat sat."
    refs = ["The cat sat.", "A cat sat down. It smiled."]
    per_ref = corpus_dsari([orig], [out], [[refs[0]], [refs[1]]], per_reference=True)
    expected = (document_sari(orig, out, [refs[0]]) + document_sari(orig, out, [refs[1]])) / 2
    assert per_ref == pytest.approx(expected)
    assert corpus_dsari([orig], [out], [[refs[0]], [refs[1]]]) == pytest.approx(document_sari(orig, out, refs))
    with pytest.raises(ValueError, match="1 input documents but 2 output documents"):
        corpus_dsari([orig], [out, out], [[refs[0]]])
