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

So copying the input earns ``(0 + 100 + SOME_nom) / 3``, never the top score: that is what D.3's input anchor is for.

This module holds the arithmetic (pure, hand-checked in tests) and :class:`QualityConfig`, which names the scorer
models. The models run in ``actors.text_quality`` (GPT-2 Large and ``facebook/bart-large-cnn`` on a cluster; on
CPU a declared stand-in: SmolLM2-135M for the perplexity and a BARTScore-*style* conditional log-likelihood under
the same causal model). **SOME is not built** (its three BERT regressors come from the authors, not a registry):
``some_model`` must stay empty and R_g is the mean of the terms that are on (PPL_nom and BART_nom), a declared
deviation. The former proxy, 100 x difflib word similarity to the input (:func:`difflib_quality`: 100 for a copy,
so a search that copies wins), stays as ``metric: difflib``, a named non-default option.

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
        some_model: SOME's regressors (grammar/fluency/meaning BERTs). Not built: must be "" (SOME off; R_g is the
            mean of the terms that are on).
        neg_bart_min: BART_min = -neg_bart_min (paper: BART_min = -10).
        ppl_max: PPL_max of D.3 (paper 0).
        ppl_split: ``sentences`` (the authors' code: the text split on ". ", token losses pooled over the pieces,
            ``exp(sum loss / sum tokens)``) or ``text`` (one piece).
        max_length: Tokens per scored piece at most (the authors' code: 512 for GPT-2); longer pieces are cut.
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
    some_model: str = ""  # SOME's regressors: not built, must be "" (SOME off)
    neg_bart_min: float = 10.0  # BART_min = -neg_bart_min (paper -10)
    ppl_max: float = 0.0  # PPL_max of D.3 (paper 0)
    # sentences (the authors' code: split on ". ", token losses pooled) or text (one piece)
    ppl_split: Literal["sentences", "text"] = "sentences"
    max_length: int = 512  # tokens per scored piece at most (the authors' code: 512)
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
        positive(self.max_length, dotted(where, "max_length"))
        if self.some_model:
            fail(dotted(where, "some_model"), "SOME is not built here (its BERT regressors are not in a registry); "
                 "leave it empty: R_g is then the mean of PPL_nom and BART_nom (a declared deviation)")
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
    """R_g = the arithmetic mean of the D.3 terms that are on (PPL_nom, BART_nom, and SOME_nom when given).

    >>> cfg = QualityConfig(ppl_model="m", bart_model="m", bart_kind="causal")
    >>> d3_quality(20.0, -0.5, Anchors(ppl_init=20.0, bart_max=-0.5), cfg).value   # the input itself: (0 + 100) / 2
    50.0
    >>> d3_quality(15.0, -2.0, Anchors(20.0, -0.5), cfg).value   # (25 + 84.2105...) / 2
    54.60526315789474
    """
    terms = {"ppl_nom": ppl_nom(ppl, anchors.ppl_init, config.ppl_max),
             "bart_nom": bart_nom(bart, anchors.bart_max, -config.neg_bart_min)}
    if some is not None:
        terms["some_nom"] = some_nom(some)
    value = sum(terms.values()) / len(terms)
    return QualityScore(value, {**terms, "ppl": ppl, "bart": bart, "ppl_init": anchors.ppl_init,
                                "bart_max": anchors.bart_max})


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
