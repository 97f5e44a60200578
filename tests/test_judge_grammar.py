"""Judge grammars (eval.judging.grammar) against llguidance and our parsers.

Hand-written verdicts in the papers' formats are accepted and malformed ones rejected; random walks through each
grammar with the real SmolLM2 tokenizer (any allowed token, including free text cut at its token budget) always
give text the format's parser reads, within max_tokens.
"""

from __future__ import annotations

import random

import llguidance
import llguidance.hf
import pytest
import torch
from transformers import AutoTokenizer

from actors.engines.hf.constrained import GrammarCompiler, mask_logits, unpack_bitmask
from actors.models import resolve_model_dir
from eval.judging.grammar import (
    best_worst_grammar,
    free_budget,
    judge_grammar,
    lark_string,
    menlo_grammar,
    reserve_tokens,
    score_grammar,
)
from eval.judging.menlo_parse import parse_menlo_grade, parse_menlo_grades
from eval.judging.parse import parse_best_worst, parse_score
from tests.grammar_check import accepts, random_walk


def test_budget_arithmetic_by_hand():
    # "Answer: [5]" is 11 characters: ceil(11 / 2) + 8 = 14 reserved tokens
    assert reserve_tokens("Answer: [5]") == 14
    assert free_budget(64, "Answer: [5]") == 50
    assert free_budget(64, "Answer: [5]", blocks=2) == 25
    # 21 tokens left is fewer than... no: 21 >= MIN_FREE_TOKENS (8) stays; 7 left is dropped to 0
    assert free_budget(35, "Answer: [5]") == 21
    assert free_budget(21, "Answer: [5]") == 0
    assert lark_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'


def test_paper_000_verdicts(compiler):
    grammar = best_worst_grammar(4, 512)
    paper = ("Aspect: Lexical, Best: 1, Worst: 0\nAnalysis:\n0: reverses the meaning.\n1: simpler.\n"
             "Aspect: Structural, Best: 3, Worst: 2\n0: nested PPs.\n"
             "Aspect: Overall, Best: 1, Worst: 0")
    assert accepts(compiler, grammar, paper)
    assert accepts(compiler, grammar, "Aspect: Lexical, Best: 0, Worst: 3\nAspect: Structural, Best: 2, Worst: 1\n"
                                      "Aspect: Overall, Best: 0, Worst: 1")
    # best == worst, an index past the candidates, a missing aspect: rejected
    for bad in ("Aspect: Lexical, Best: 1, Worst: 1", "Aspect: Lexical, Best: 4, Worst: 0",
                "Aspect: Lexical, Best: 0, Worst: 1\nAspect: Overall, Best: 0, Worst: 1"):
        assert not accepts(compiler, grammar, bad)
    # no room for analysis in 64 tokens: the bare verdict only
    assert "analysis" not in best_worst_grammar(4, 64)
    assert not accepts(compiler, best_worst_grammar(4, 64), paper)


def test_score_and_menlo_verdicts(compiler):
    assert accepts(compiler, score_grammar(64), "Fluent, but loses the date. Answer: [3]")
    assert not accepts(compiler, score_grammar(64), "Answer: [6]")
    assert not accepts(compiler, score_grammar(64), "It is [good] overall. Answer: [4]")
    pair = ("<think> A drops the date. </think>\n<final_grade_A> FINAL GRADE: 2 - MINOR FAILURE </final_grade_A>\n"
            "<final_grade_B> FINAL GRADE: 4 - GOOD </final_grade_B>")
    assert accepts(compiler, menlo_grammar("pairwise", 256), pair)
    # a grade with the wrong label is not MENLO's format
    assert not accepts(compiler, menlo_grammar("pairwise", 256), pair.replace("4 - GOOD", "4 - PASS"))
    assert accepts(compiler, menlo_grammar("pointwise", 256),
                   "<think> ok </think>\n<final_grade> FINAL GRADE: 5 - EXCELLENT </final_grade>")
    # a thinking judge reasons first, then gives the constrained verdict
    assert accepts(compiler, score_grammar(256, thinking=True), "<think>hmm</think>\nClear. Answer: [5]")
    with pytest.raises(ValueError, match="no grammar"):
        judge_grammar("stars", 64)


PARSERS = {
    "best_worst": lambda text: all(not v["error"] for v in parse_best_worst(text, 4).values()),
    "score": lambda text: parse_score(text).ok,
    "pairwise": lambda text: not parse_menlo_grades(text).error and parse_menlo_grades(text).format_ok,
    "pointwise": lambda text: not parse_menlo_grade(text).error,
}


@pytest.mark.parametrize("fmt,max_tokens,thinking", [
    ("best_worst", 64, False), ("best_worst", 200, False), ("best_worst", 200, True), ("score", 48, False),
    ("score", 96, True), ("pairwise", 96, False), ("pairwise", 160, False), ("pointwise", 96, False)])
def test_random_walks_always_parse_within_max_tokens(compiler, fmt, max_tokens, thinking):
    """Any token the mask allows, chosen at random (a worst-case model), ends in a parseable verdict in budget."""
    grammar = judge_grammar(fmt, max_tokens, thinking=thinking)
    rng = random.Random(0)
    for walk in range(12):
        matcher, text = random_walk(compiler, grammar, max_tokens, rng)
        assert matcher.is_stopped(), f"walk {walk}: not finished in {max_tokens} tokens: {text!r}"
        assert PARSERS[fmt](text), f"walk {walk}: {text!r}"


def test_mask_helpers_by_hand():
    # word 0b101 allows tokens 0 and 2; the second row (matcher None) is left alone
    assert unpack_bitmask(torch.tensor([[0b101]], dtype=torch.int32), 3).tolist() == [[True, False, True]]
    assert unpack_bitmask(torch.tensor([[-1, 1]], dtype=torch.int32), 33).tolist() == [[True] * 33]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    lt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=49152)
    matcher = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark('start: "yes" | "no"\n'))
    logits = torch.zeros(2, 49152)
    mask_logits(logits, [matcher, None])
    allowed = set(torch.nonzero(logits[0] == 0).flatten().tolist())
    assert allowed and len(allowed) < 10
    assert tokenizer.decode([min(allowed)]) in ("yes", "no", "y", "n", "ye")
    assert bool((logits[1] == 0).all())
    with pytest.raises(ValueError, match="sampling.grammar"):
        GrammarCompiler(tokenizer, 49152).matcher("start: undefined_rule\n")
