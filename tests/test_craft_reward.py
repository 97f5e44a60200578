"""CRAFT's reward under App. D.3 as the paper weighs it (issue 53): BARTScore's own token limit, R_g over three
terms, one layout for every system, and when a revision beats the copy.

The scorer runs the real bundled SmolLM2 (the declared CPU stand-in for GPT-2 Large and bart-large-cnn); the
arithmetic is hand-worked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.text_quality import QualityScorer, build_quality
from core.config import load_config
from eval.craft import quality as craft_quality
from eval.craft.quality import Anchors, QualityConfig, d3_quality

# the CPU stand-in's models; every other knob at QualityConfig's default (bart_max_length 1024, rg_terms three)
MODELS = {"ppl_model": "smollm2-135m", "bart_model": "smollm2-135m", "bart_kind": "causal", "device": "cpu"}
SENTENCES = [
    "The city council approved a new budget for the public library on Monday evening.",
    "The decision came after several months of long and sometimes heated debate among the members.",
    "Supporters of the plan argued that the library had been underfunded for many years.",
    "Opponents said that the money would be better spent on repairing the roads and the old bridges.",
    "In the end the budget passed by a narrow margin of five votes to four.",
    "The new funding will start next year and will pay for books, computers and longer opening hours.",
]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scorer() -> QualityScorer:
    built = build_quality(QualityConfig(**MODELS))
    assert isinstance(built, QualityScorer)
    return built


def variant(scorer: QualityScorer, **knobs) -> QualityScorer:
    """A scorer with other knobs on the same loaded model (one SmolLM2 load per module)."""
    other = QualityScorer(QualityConfig(**MODELS, **knobs))
    other._models = scorer._models
    return other


# -- item 2: BARTScore reads 1024 tokens (neulab's BARTScorer), not the perplexity's 512 -------------------------

def test_bartscore_sees_a_change_past_token_512(scorer):
    long_text = " ".join(SENTENCES * 7)  # about 750 SmolLM2 tokens
    tok, _ = scorer._load("smollm2-135m", "causal")
    assert 600 < len(tok(long_text, add_special_tokens=False).input_ids) < 1024
    # the same text with its last sentence changed: every difference lies past token 512
    changed = long_text[: long_text.rindex("The new funding")] + "Nobody knows when any of the money will arrive."
    assert len(tok(long_text[: long_text.rindex("The new funding")], add_special_tokens=False).input_ids) > 512
    copy, revision = (scorer.bartscore(long_text, t) for t in (long_text, changed))
    assert revision != pytest.approx(copy, abs=1e-6)  # with a 512-token cut both would read alike
    assert revision < copy
    assert not scorer._bartscore(long_text, changed)[1]  # nothing cut at 1024


def test_the_two_limits_are_separate_and_the_cluster_config_uses_the_authors_values():
    cfg = QualityConfig()
    assert (cfg.ppl_max_length, cfg.bart_max_length) == (512, 1024)  # GPT-2 pieces (the authors' code); neulab
    from jobs.craft.revise import Config

    cluster = load_config(Config, REPO / "configs" / "craft_cluster.yaml", [])
    assert (cluster.quality.ppl_max_length, cluster.quality.bart_max_length) == (512, 1024)
    demo = load_config(Config, REPO / "configs" / "craft_demo.yaml", [])
    assert demo.quality.bart_max_length == 2048  # the stand-in's own limit, above CORD's longest text (1,947)


def test_a_cut_is_recorded_not_silent(scorer):
    text = " ".join(SENTENCES)
    assert variant(scorer, bart_max_length=64)._bartscore(text, text)[1] is True
    assert scorer._bartscore(text, text)[1] is False


# -- item 3: the paper's weighting, R_g over three terms ---------------------------------------------------------

def test_the_papers_weighting_gives_the_copy_a_third_of_its_terms(scorer):
    text = " ".join(SENTENCES)
    copy, = scorer(text, [text])
    assert copy.value == pytest.approx((0 + 100 + 0) / 3)  # SOME not built: its term fixed at some_value 0
    assert variant(scorer, some_value=0.89)(text, [text])[0].value == pytest.approx((0 + 100 + 89) / 3)  # 63
    assert craft_quality.copy_quality(QualityConfig(some_value=0.89)) == pytest.approx(63.0)
    assert variant(scorer, rg_terms="available")(text, [text])[0].value == pytest.approx(50.0)  # (0 + 100) / 2


def test_each_ppl_point_moves_r_by_a_third_as_in_the_paper():
    anchors = Anchors(ppl_init=40.0, bart_max=-0.4)
    base, better = (d3_quality(p, -0.4, anchors, QualityConfig(**MODELS)).value for p in (40.0, 28.0))
    assert better - base == pytest.approx(30.0 / 3)  # PPL_nom 30: R_g +10 (the mean of two: +15)
    base2, better2 = (d3_quality(p, -0.4, anchors, QualityConfig(**MODELS, rg_terms="available")).value
                      for p in (40.0, 28.0))
    assert better2 - base2 == pytest.approx(30.0 / 2)
    # a fixed SOME term moves no comparison between two texts of one input
    some = QualityConfig(**MODELS, some_value=0.5)
    assert d3_quality(28.0, -0.4, anchors, some).value - d3_quality(40.0, -0.4, anchors, some).value == \
        pytest.approx(better - base)


# -- item 4: one layout for every system --------------------------------------------------------------------------

def test_the_same_words_score_the_same_in_every_systems_layout(scorer):
    original = "\n".join(SENTENCES)  # CORD texts keep line breaks (275 of 500)
    revised = [s.replace("Monday", "Tuesday") for s in SENTENCES]
    direct_layout = "\n".join(revised)  # Direct / Iter answers keep the reviser's line breaks
    agent_layout = " ".join(revised)  # agent and search revisions are joined with spaces
    by_line, joined = scorer(original, [direct_layout, agent_layout])
    assert by_line.value == pytest.approx(joined.value)
    assert by_line.parts["ppl"] == pytest.approx(joined.parts["ppl"])
    # the input in either layout is the copy: PPL_nom 0, BART_nom 100
    copy_lines, copy_joined = scorer(original, [original, " ".join(SENTENCES)])
    assert copy_lines.value == pytest.approx(100 / 3) and copy_joined.value == pytest.approx(100 / 3)
    # the knob that scores texts as given: the layouts differ again
    a, b = variant(scorer, layout="as_is")(original, [direct_layout, agent_layout])
    assert a.parts["ppl"] != pytest.approx(b.parts["ppl"])


# -- item 7: when a revision beats the copy -------------------------------------------------------------------------

def test_a_revision_beats_the_copy_only_when_r_g_clears_the_copy_minus_its_accuracy_gain():
    rg_copy = craft_quality.copy_quality(QualityConfig())  # 33.3
    # meets all 3 constraints where the copy meets 2: the bar is 33.3 - 33.3 = 0
    assert craft_quality.beats_copy(5.0, 1.0, rg_copy, 2 / 3)
    assert not craft_quality.beats_copy(-5.0, 1.0, rg_copy, 2 / 3)
    # the same accuracy as the copy: it must read better than the copy (R_g > 33.3)
    assert not craft_quality.beats_copy(30.0, 0.5, rg_copy, 0.5) and craft_quality.beats_copy(40.0, 0.5, rg_copy, 0.5)
    # fewer constraints than the copy: a fluent revision can still win (the reward trades accuracy for fluency)
    assert craft_quality.beats_copy(70.0, 0.5, rg_copy, 0.75)  # 70 > 33.3 + 25
    # the R comparison and the condition agree
    for rg, acc in ((5.0, 1.0), (-5.0, 1.0), (70.0, 0.5), (30.0, 0.5)):
        assert craft_quality.beats_copy(rg, acc, rg_copy, 2 / 3) == (rg + 100 * acc > rg_copy + 100 * 2 / 3)


def test_the_same_constraints_met_by_a_disfluent_text_lose_to_the_copy(scorer):
    # keeps sentence 1 and "council" twice (as the input has it) and is under 50 words, like the hand-written
    # revision of tests/test_craft_quality.py that beats the copy; its second sentence is word salad
    from tests.test_craft_quality import GOLD, ORIGINAL

    salad = (ORIGINAL.split(". ")[0] + ". Council evening bridges margin the of narrow roads public votes for "
             "northern budget residents.")
    from eval.craft.tools import constraint_accuracy

    acc_copy, acc_salad = (constraint_accuracy(GOLD, ORIGINAL, t)[0] for t in (ORIGINAL, salad))
    assert (acc_copy, acc_salad) == (pytest.approx(2 / 3), 1.0)
    copy, bad = scorer(ORIGINAL, [ORIGINAL, salad])
    assert bad.value < 0.0  # the bar: R_g > 33.3 - 100 x (1 - 2/3) = 0
    assert bad.value + 100 * acc_salad < copy.value + 100 * acc_copy
    assert not craft_quality.beats_copy(bad.value, acc_salad, copy.value, acc_copy)
