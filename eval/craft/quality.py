"""CRAFT's text-quality score (paper 002, App. D.3): R_g of TG-MCTS, S_r of Eq. 1, the report's quality column.

The paper's R_g / S_r is "the arithmetic mean of the normalized PPL, BARTScore and SOME scores" (§5.2, App. D.4,
D.5), each normalised against the **input** text (D.3):

- ``PPL_nom  = 100 x (PPL_min - PPL) / (PPL_min - PPL_max)`` with ``PPL_min = PPL(init_text)`` and ``PPL_max = 0``,
  i.e. ``100 x (1 - PPL / PPL_init)``: 0 for the unchanged input, positive when the revision reads more fluently,
  negative (no clamp) when it reads worse;
- ``BART_nom = 100 x (BART - BART_min) / (BART_max - BART_min)`` with ``BART_max = BARTScore(init_text, init_text)``
  (neulab/BARTScore issue #11) and ``BART_min = -10``; BARTScore(src = input, tgt = revision) is the mean token
  log-likelihood of the revision given the input;
- ``SOME_nom = 100 x SOME``.

R_g is the mean of the three, ``(PPL_nom + BART_nom + SOME_nom) / 3``, so copying the input earns
``(0 + 100 + SOME_nom) / 3``, never the top score: that is what D.3's input anchor is for.

This module holds the arithmetic (pure, hand-checked in tests) and :class:`QualityConfig`, which names the scorer
models. The models run in ``actors.text_quality`` (GPT-2 Large and ``facebook/bart-large-cnn`` on a cluster; on
CPU a declared stand-in: SmolLM2-135M for the perplexity and a BARTScore-*style* conditional log-likelihood under
the same causal model). **SOME is not built** (its three BERT regressors come from the authors, not a registry):
``some_model`` must stay empty. By default (``rg_terms: three``, the paper's weighting) its term is the fixed
``some_value`` (0 unless set) and R_g stays a mean over three, so each PPL or BART point moves R = R_g + R_c by 1/3,
as in the paper; the copy scores ``(0 + 100 + 100 x some_value) / 3`` (33.3 with some_value 0). A fixed SOME term is
the same for every text of one input, so it moves no comparison between two of them, only the level of R_g.
``rg_terms: available`` is the mean of the terms that are on (PPL_nom and BART_nom: the copy scores 50 and each
point moves R by 1/2, weighting R_g 1.5x against R_c), a declared deviation kept as a knob.

A revision beats the copy in R = R_g + 100 x accuracy exactly when ``R_g(revision) > R_g(copy) - 100 x
(acc(revision) - acc(copy))`` (:func:`beats_copy`): with the default, ``R_g > 33.3 - 100 x delta_acc``.

Every text is scored in one layout (``layout: paragraph``, the default): lines stripped and joined with single
spaces, as the authors' code joins the reviser's output (``convert_to_paragraph``). The perplexity splits on
``". "``, so a text with one sentence per line would otherwise score differently from the same words in one
paragraph; CORD inputs and Direct / Iter answers keep line breaks, agent and search revisions are joined.

The former proxy, 100 x difflib word similarity to the input (:func:`difflib_quality`: 100 for a copy, so a search
that copies wins), stays as ``metric: difflib``, a named non-default option.

Pure: no ray, vllm, deepspeed, torch or transformers.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.config import Section, dotted, fail, one_of, positive

METRICS = ("d3", "difflib")
RG_TERMS = ("three", "available")
LAYOUTS = ("paragraph", "as_is")
BART_KINDS = ("seq2seq", "causal")
PPL_SPLITS = ("sentences", "text")


@dataclass(frozen=True)
class QualityConfig(Section):
    """Which text-quality score R_g / S_r is, and the scorer models of App. D.3.

    Attributes:
        metric: ``d3`` (the paper: mean of normalised PPL, BARTScore and SOME) or ``difflib`` (the old proxy:
            100 x word-level similarity to the input; a copy scores 100, so it is not the default).
        ppl_model: Causal LM for perplexity (paper: GPT-2 Large, ``hf:gpt2-large``; CPU stand-in ``smollm2-135m``).
        bart_model: BARTScore model (paper: ``hf:facebook/bart-large-cnn``; CPU stand-in ``smollm2-135m``).
        bart_kind: ``seq2seq`` (BARTScore: log p(revision | input) under an encoder-decoder) or ``causal`` (the
            stand-in: log p(revision | input + blank line) under a causal LM, the revision's tokens only).
        some_model: SOME's regressors (grammar/fluency/meaning BERTs). Not built: must be "".
        rg_terms: ``three`` (the paper: R_g = (PPL_nom + BART_nom + SOME_nom) / 3, SOME_nom = 100 x
            ``some_value`` while SOME is not built) or ``available`` (the mean of the terms that are on: PPL_nom
            and BART_nom, which weighs R_g 1.5x against R_c).
        some_value: The fixed SOME score in [0, 1] of ``rg_terms: three`` (0: not built). The same for every text, so
            it sets the level of R_g and moves no comparison.
        neg_bart_min: BART_min = -neg_bart_min (paper: BART_min = -10).
        ppl_max: PPL_max of D.3 (paper 0).
        ppl_split: ``sentences`` (the authors' code: the text split on ". ", token losses pooled over the pieces,
            ``exp(sum loss / sum tokens)``) or ``text`` (one piece).
        ppl_max_length: Tokens per perplexity piece at most (the authors' code: 512 for GPT-2); longer pieces are cut.
        bart_max_length: Tokens of the input and of the revision BARTScore reads at most (neulab's BARTScorer, the
            authors' scorer: 1024, bart-large-cnn's positions); longer texts are cut and the cut is recorded
            (``bart_cut`` in the score's parts). The causal stand-in has its own position limit (SmolLM2: 8192, the
            input's last and the revision's first ``bart_max_length`` tokens).
        layout: ``paragraph`` (every text, the input included, scored as one paragraph: lines stripped and joined
            with spaces) or ``as_is``.
        ppl_bos: Put the model's BOS token before each perplexity piece, so its first token is scored too (off: the
            authors' code, GPT-2 with ``labels = input_ids``, where a piece's first token is only read).
        dtype: Scorer weights: float32 (CPU) or bfloat16/float16 on a GPU.
        device: ``cpu``, ``cuda`` or ``auto`` (cuda when available).
    """

    metric: Literal["d3", "difflib"] = "d3"  # d3 (the paper's normalised PPL/BARTScore/SOME mean) or difflib (old proxy)
    ppl_model: str = "hf:gpt2-large"  # causal LM of the perplexity (paper: GPT-2 Large)
    bart_model: str = "hf:facebook/bart-large-cnn"  # BARTScore model (paper: bart-large-cnn)
    # seq2seq (BARTScore) or causal (stand-in: log p(revision given input) under a causal LM)
    bart_kind: Literal["seq2seq", "causal"] = "seq2seq"
    some_model: str = ""  # SOME's regressors: not built, must be ""
    # three (the paper: R_g = (PPL_nom + BART_nom + SOME_nom) / 3, SOME_nom = 100 x some_value) or available (the mean
    # of the terms that are on: weighs R_g 1.5x against R_c)
    rg_terms: Literal["three", "available"] = "three"
    # the fixed SOME score in [0, 1] of rg_terms three (SOME is not built); the same for every text: it sets the level
    # of R_g and moves no comparison
    some_value: float = 0.0
    neg_bart_min: float = 10.0  # BART_min = -neg_bart_min (paper -10)
    ppl_max: float = 0.0  # PPL_max of D.3 (paper 0)
    # sentences (the authors' code: split on ". ", token losses pooled) or text (one piece)
    ppl_split: Literal["sentences", "text"] = "sentences"
    ppl_max_length: int = 512  # tokens per perplexity piece at most (the authors' code: 512 for GPT-2)
    # tokens of the input and of the revision BARTScore reads at most (neulab's BARTScorer, the authors': 1024);
    # longer texts are cut and the cut is recorded (`bart_cut`)
    bart_max_length: int = 1024
    # paragraph (every text, the input too, scored as one paragraph: lines stripped, joined with spaces) or as_is
    layout: Literal["paragraph", "as_is"] = "paragraph"
    # put the model's BOS token before each perplexity piece so its first token is scored too (the authors' code:
    # GPT-2 with labels = input ids, the first token of a piece is only read)
    ppl_bos: bool = False
    dtype: str = "float32"  # scorer weights: float32, bfloat16 or float16
    device: str = "auto"  # cpu, cuda or auto

    def check(self, where: str = "") -> None:
        one_of(self.metric, METRICS, dotted(where, "metric"))
        one_of(self.bart_kind, BART_KINDS, dotted(where, "bart_kind"))
        one_of(self.ppl_split, PPL_SPLITS, dotted(where, "ppl_split"))
        one_of(self.dtype, ("float32", "bfloat16", "float16"), dotted(where, "dtype"))
        one_of(self.device, ("cpu", "cuda", "auto"), dotted(where, "device"))
        one_of(self.rg_terms, RG_TERMS, dotted(where, "rg_terms"))
        one_of(self.layout, LAYOUTS, dotted(where, "layout"))
        positive(self.ppl_max_length, dotted(where, "ppl_max_length"))
        positive(self.bart_max_length, dotted(where, "bart_max_length"))
        if not 0.0 <= self.some_value <= 1.0:
            fail(dotted(where, "some_value"), f"a SOME score is in [0, 1], got {self.some_value}")
        if self.some_model:
            fail(dotted(where, "some_model"), "SOME is not built here (its BERT regressors are not in a registry); "
                 "leave it empty: its term is the fixed some_value (rg_terms: three)")
        if self.metric == "d3" and not (self.ppl_model and self.bart_model):
            fail(dotted(where, "ppl_model, bart_model"), "metric d3 needs both scorer models")


@dataclass(frozen=True)
class Anchors:
    """The input's own scores, D.3's normalisation anchors: PPL_min = PPL(init), BART_max = BARTScore(init, init)."""

    ppl_init: float
    bart_max: float


@dataclass(frozen=True)
class QualityScore:
    """R_g of one revision (0..100 scale, may be negative: PPL_nom has no clamp) and its parts for the logs."""

    value: float
    parts: dict = field(default_factory=dict)


def ppl_nom(ppl: float, ppl_init: float, ppl_max: float = 0.0) -> float:
    """D.3: ``100 x (PPL_min - PPL) / (PPL_min - PPL_max)`` with PPL_min = the input's perplexity.

    >>> ppl_nom(20.0, 20.0), ppl_nom(15.0, 20.0), ppl_nom(30.0, 20.0)
    (0.0, 25.0, -50.0)
    """
    if not math.isfinite(ppl):
        return -100.0  # nothing to score (an empty revision; the guard keeps these out of every system)
    span = ppl_init - ppl_max
    if not span > 0:
        return 0.0
    return 100.0 * (ppl_init - ppl) / span


def bart_nom(bart: float, bart_max: float, bart_min: float = -10.0) -> float:
    """D.3: ``100 x (BART - BART_min) / (BART_max - BART_min)`` with BART_max = BARTScore(input, input).

    A BART_max at or below BART_min (an input the model cannot even copy) leaves no range: 100 at or above it, else 0.

    >>> bart_nom(-0.5, -0.5), bart_nom(-2.0, -0.5), round(bart_nom(-12.0, -0.5), 4)
    (100.0, 84.21052631578948, -21.0526)
    """
    span = bart_max - bart_min
    if not span > 0:
        return 100.0 if bart >= bart_max else 0.0
    return 100.0 * (bart - bart_min) / span


def some_nom(some: float) -> float:
    """D.3: ``100 x SOME`` (SOME in [0, 1]).

    >>> some_nom(0.8)
    80.0
    """
    return 100.0 * some


def d3_quality(ppl: float, bart: float, anchors: Anchors, config: QualityConfig, some: float | None = None) -> QualityScore:
    """R_g: ``(PPL_nom + BART_nom + SOME_nom) / 3`` (``rg_terms: three``; SOME_nom = 100 x ``some`` when given,
    else 100 x ``config.some_value``), or the mean of the terms that are on (``available``).

    >>> cfg = QualityConfig(ppl_model="m", bart_model="m", bart_kind="causal")
    >>> round(d3_quality(20.0, -0.5, Anchors(ppl_init=20.0, bart_max=-0.5), cfg).value, 4)  # the input: (0 + 100 + 0) / 3
    33.3333
    >>> round(d3_quality(15.0, -2.0, Anchors(20.0, -0.5), cfg).value, 4)   # (25 + 84.2105... + 0) / 3
    36.4035
    >>> avail = QualityConfig(ppl_model="m", bart_model="m", bart_kind="causal", rg_terms="available")
    >>> d3_quality(15.0, -2.0, Anchors(20.0, -0.5), avail).value   # (25 + 84.2105...) / 2
    54.60526315789474
    """
    terms = {"ppl_nom": ppl_nom(ppl, anchors.ppl_init, config.ppl_max),
             "bart_nom": bart_nom(bart, anchors.bart_max, -config.neg_bart_min)}
    if some is not None:
        terms["some_nom"] = some_nom(some)
    elif config.rg_terms == "three":
        terms["some_nom"] = some_nom(config.some_value)  # SOME not built: the fixed term
    value = sum(terms.values()) / (3 if config.rg_terms == "three" else len(terms))
    return QualityScore(value, {**terms, "ppl": ppl, "bart": bart, "ppl_init": anchors.ppl_init,
                                "bart_max": anchors.bart_max})


def copy_quality(config: QualityConfig) -> float:
    """R_g of the input returned unchanged (PPL_nom 0, BART_nom 100): the constant every revision is measured by.

    >>> round(copy_quality(QualityConfig()), 4), copy_quality(QualityConfig(rg_terms="available"))
    (33.3333, 50.0)
    >>> round(copy_quality(QualityConfig(some_value=0.89)), 4)   # (0 + 100 + 89) / 3
    63.0
    """
    if config.rg_terms == "three":
        return (0.0 + 100.0 + some_nom(config.some_value)) / 3
    return (0.0 + 100.0) / 2


def beats_copy(quality: float, accuracy: float, copy_quality_value: float, copy_accuracy: float) -> bool:
    """Whether a revision's R = R_g + 100 x accuracy beats the copy's: ``R_g > R_g(copy) - 100 x delta_acc``.

    >>> beats_copy(20.0, 1.0, 100 / 3, 2 / 3)    # 20 > 33.3 - 33.3 = 0
    True
    >>> beats_copy(-5.0, 1.0, 100 / 3, 2 / 3)    # -5 < 0
    False
    """
    return quality > copy_quality_value - 100.0 * (accuracy - copy_accuracy)


def paragraph_layout(text: str) -> str:
    """One layout for every scored text: lines stripped, empty ones dropped, joined with single spaces (the
    authors' ``convert_to_paragraph`` of the reviser's output).

    >>> paragraph_layout("One cat.\\nTwo dogs.\\n\\n  Three.  ")
    'One cat. Two dogs. Three.'
    """
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def difflib_quality(original: str, revision: str) -> float:
    """The old proxy (``metric: difflib``): 100 x word-level similarity ratio (difflib) of revision and original.

    >>> difflib_quality("a b c d", "a b x d")
    75.0
    """
    a, b = original.split(), revision.split()
    if not a and not b:
        return 100.0
    return 100.0 * difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def ppl_pieces(text: str, split: str = "sentences") -> list[str]:
    """The pieces the perplexity pools over: the authors' code splits a paragraph on ``". "`` (each piece keeps
    its text; the period of all but the last is dropped, as ``str.split`` does); ``text`` keeps it whole.

    >>> ppl_pieces("One cat. Two dogs. Three.")
    ['One cat', 'Two dogs', 'Three.']
    >>> ppl_pieces("One cat. Two dogs.", "text")
    ['One cat. Two dogs.']
    """
    if split == "text":
        return [text] if text.strip() else []
    return [p for p in text.split(". ") if p.strip()]


def pooled_ppl(losses: Sequence[tuple[float, int]]) -> float:
    """``exp(sum of token NLL / number of tokens)`` over pieces given as (summed NLL, tokens); inf with no token.

    >>> round(pooled_ppl([(2.0, 2), (4.0, 2)]), 6) == round(math.exp(1.5), 6)
    True
    """
    tokens = sum(n for _, n in losses)
    return math.exp(sum(s for s, _ in losses) / tokens) if tokens else math.inf


# ``score(original, revisions) -> [QualityScore]``: what the systems, the search and Eq. 1 call
QualityFn = Callable[[str, Sequence[str]], list[QualityScore]]


def difflib_scorer(original: str, revisions: Sequence[str]) -> list[QualityScore]:
    """The ``metric: difflib`` scorer as a :data:`QualityFn`."""
    return [QualityScore(difflib_quality(original, r), {"difflib": difflib_quality(original, r)}) for r in revisions]
