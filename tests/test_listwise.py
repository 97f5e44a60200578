"""Listwise judging's pure part (eval/judging/listwise.py): the grammar admits exactly the permutations (checked by
llguidance over a byte-level tokenizer), parsing refuses what is not one, and the rewards by hand."""

import itertools
import math

import llguidance
import pytest

from eval.judging.listwise import (
    MAX_LISTWISE,
    grade_rewards,
    kendall_tau_b,
    listwise_grammar,
    parse_grades,
    parse_ranking,
    rank_rewards,
)
from tests.byte_grammar import accepts


def test_the_rank_grammar_admits_exactly_the_permutations(byte_tokenizer):
    n = 4
    grammar = listwise_grammar(n, "rank", max_tokens=128)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)) == ""
    accepted = set()
    for seq in itertools.product(range(1, n + 1), repeat=n):  # all 256 sequences of 4 indices
        text = "<think>compare them</think>\nRANKING: " + " > ".join(map(str, seq))
        if accepts(byte_tokenizer, grammar, text):
            accepted.add(seq)
            assert parse_ranking(text, n).order == [k - 1 for k in seq]
    assert accepted == set(itertools.permutations(range(1, n + 1)))  # 24 of 256
    assert not accepts(byte_tokenizer, grammar, "<think>x</think>\nRANKING: 1 > 2 > 3")  # one missing
    assert not accepts(byte_tokenizer, grammar, "<think>x</think>\nRANKING: 1 > 2 > 3 > 5")  # unknown index


def test_the_grade_grammar_admits_n_grades_in_order(byte_tokenizer):
    grammar = listwise_grammar(3, "grade", max_tokens=128)
    good = "<think>ok</think>\nGRADES:\n[1]: 4\n[2]: 1\n[3]: 5"
    assert accepts(byte_tokenizer, grammar, good) and parse_grades(good, 3).grades == [4, 1, 5]
    assert not accepts(byte_tokenizer, grammar, "<think>ok</think>\nGRADES:\n[1]: 4\n[2]: 6\n[3]: 5")  # out of range
    assert not accepts(byte_tokenizer, grammar, "<think>ok</think>\nGRADES:\n[2]: 4\n[1]: 1\n[3]: 5")  # out of order
    assert not accepts(byte_tokenizer, grammar, "<think>ok</think>\nGRADES:\n[1]: 4\n[2]: 1")  # one missing


def test_the_largest_group_compiles(byte_tokenizer):
    grammar = listwise_grammar(MAX_LISTWISE, "rank", max_tokens=512)
    assert len(grammar.splitlines()) == 2 + 2 ** MAX_LISTWISE - 1  # start, 511 subset rules, reasoning
    assert accepts(byte_tokenizer, grammar, "<think></think>\nRANKING: 9 > 8 > 7 > 6 > 5 > 4 > 3 > 2 > 1")
    assert not accepts(byte_tokenizer, grammar, "<think></think>\nRANKING: 9 > 9 > 7 > 6 > 5 > 4 > 3 > 2 > 1")
    with pytest.raises(ValueError, match="2..9"):
        listwise_grammar(MAX_LISTWISE + 1, "rank", 512)
    with pytest.raises(ValueError, match="mode"):
        listwise_grammar(3, "pairs", 512)


def test_parsing_refuses_what_is_not_a_permutation():
    assert parse_ranking("RANKING: 3 > 1 > 2\n", 3).order == [2, 0, 1]
    assert parse_ranking("first RANKING: 1 > 2 > 3, then RANKING: [2] > [3] > [1]", 3).order == [1, 2, 0]
    assert parse_ranking("RANKING: 1 > 1 > 2", 3).error == "ranking is not a permutation of 1..3: [1, 1, 2]"
    assert parse_ranking("RANKING: 1 > 2", 3).error.startswith("ranking is not a permutation")
    assert parse_ranking("RANKING: 1 > two > 3", 3).error.startswith("ranking has a non-number")
    assert parse_ranking("1 > 2 > 3", 3).error == "no RANKING: line"
    assert parse_ranking(None, 3).error == "no RANKING: line"
    assert parse_grades("GRADES:\n[1]: 4\n[2]: 7", 2, 1, 5).error == "grade outside 1..5: [4, 7]"
    assert parse_grades("GRADES:\n[1]: 4", 2).error.startswith("grades must list responses 1..2")
    assert not parse_grades("nothing", 2).ok


def test_rewards_and_agreement_by_hand():
    # order best first: response 3, then 1, 4, 2 -> positions 1, 3, 0, 2 of 0..3 -> (3 - pos) / 3
    assert rank_rewards([2, 0, 3, 1], 4) == pytest.approx([2 / 3, 0.0, 1.0, 1 / 3])
    with pytest.raises(ValueError, match="not a permutation"):
        rank_rewards([0, 0, 1], 3)
    assert grade_rewards([5, 3, 1]) == [1.0, 0.5, 0.0]
    assert kendall_tau_b([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # x = 1,2,3 vs pairwise mean grades y = 1,1,3: pairs (1,2) tie in y; (1,3), (2,3) concordant
    # tau_b = 2 / sqrt((2 + 0 + 0) * (2 + 0 + 1)) = 2 / sqrt(6)
    assert kendall_tau_b([1, 2, 3], [1, 1, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))
