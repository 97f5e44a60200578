"""AgentSimp role outputs (eval.agentsimp.parse, eval.agentsimp.outputs) and their grammars (eval.agentsimp.grammar).

Tolerant extraction, strict schemas, "None" semantics, the retry policy as data, and the grammars checked with
llguidance itself over a byte-level tokenizer (no model needed): answers in the fixed JSON layout are accepted,
anything else is not, and random walks through each grammar always parse.
"""

from __future__ import annotations

import doctest
import json
import random

import llguidance
import llguidance.numpy
import pytest

from eval.agentsimp import grammar as agentsimp_grammar
from eval.agentsimp import outputs as agentsimp_outputs
from eval.agentsimp import parse as agentsimp_parse
from eval.agentsimp import roles as agentsimp_roles
from eval.agentsimp import run as agentsimp_run
from eval.agentsimp.grammar import role_grammar
from eval.agentsimp.outputs import FALL_BACK, Reply, decide, settle
from eval.agentsimp.parse import RoleValue, extract_json_object, parse_output, role_schema
from eval.agentsimp.roles import ROLE_IDS, role_spec
from tests.byte_grammar import accepts, matcher

JSON_ROLES = [r for r in ROLE_IDS if role_spec(r).output == "json"]


def test_doctests_pass():
    for module in (agentsimp_outputs, agentsimp_parse, agentsimp_grammar, agentsimp_roles, agentsimp_run):
        assert doctest.testmod(module).failed == 0


def test_every_json_role_has_a_schema_and_text_roles_none():
    assert sorted(JSON_ROLES) == sorted(["article_logic_analyst", "content_simplifier", "content_simplifier_revise",
                                         "simplify_supervisor", "metaphorical_analyst", "terminology_interpreter",
                                         "proofreader"])
    for role in ROLE_IDS:
        assert (role_schema(role) is None) == (role not in JSON_ROLES)
        assert (role_grammar(role, 256) == "") == (role not in JSON_ROLES)


@pytest.mark.parametrize("text", [
    '{"simplified result": "Cats sleep."}',
    'Here you go:\n```json\n{"simplified result": "Cats sleep."}\n```',
    '<think>maybe {"simplified result": "no"}</think>{"simplified result": "Cats sleep."}',
    'The answer is {"simplified result": "Cats sleep."} as asked.',
    '"simplified result": "Cats sleep."',  # the paper's printed spec, outer braces lost
])
def test_tolerant_extraction(text):
    parsed = parse_output("content_simplifier", text)
    assert parsed.ok and parsed.value == RoleValue("Cats sleep.") and parsed.raw == text


@pytest.mark.parametrize("text,error", [
    ("", "empty"),
    ("I simplified it: Cats sleep.", "no_json"),
    ('<think>{"simplified result": "x"', "unterminated_think"),
    ('{"simplified result": ""}', "schema: simplified result: '' does not match '\\\\S'"),
    ('{"simplified result": 3}', "schema: simplified result: 3 is not of type 'string'"),
    ('{"simplified result": "a", "note": "b"}', "schema: Additional properties are not allowed ('note' was unexpected)"),
    ('{"result": "a"}', "schema: 'simplified result' is a required property"),
])
def test_strict_validation(text, error):
    parsed = parse_output("content_simplifier", text)
    assert (parsed.value, parsed.error) == (None, error)


def test_terminology_interpreter_reads_the_papers_malformed_list():
    # Fig. 16 prints `"terminology": [{"terminology1", "terminology2"...}`; a model imitating it writes a set in a list
    parsed = parse_output("terminology_interpreter",
                          '{"terminology": [{"otolith", "geochemist"}], "parsed result": "ear bones of fish"}')
    assert parsed.value == RoleValue("ear bones of fish", items=("otolith", "geochemist"))
    bad = parse_output("terminology_interpreter", '{"terminology": "otolith", "parsed result": "x"}')
    assert bad.error == "schema: terminology: 'otolith' is not of type 'array'"


def test_each_role_value():
    ala = parse_output("article_logic_analyst", '{"title": " Bus fares ", "subheadings": ["New", "Who"]}').value
    assert (ala.title, ala.items, ala.text) == ("Bus fares", ("New", "Who"),
                                                '{"title": "Bus fares", "subheadings": ["New", "Who"]}')
    ma = parse_output("metaphorical_analyst", '{"analyzed result": "heart of gold: kind", "simplified result": '
                      '"She is kind (she has a heart of gold)."}').value
    assert (ma.text, ma.note) == ("She is kind (she has a heart of gold).", "heart of gold: kind")
    assert parse_output("metaphorical_analyst", '{"analyzed result": null, "simplified result": "None."}').value == \
        RoleValue(None)
    assert parse_output("simplify_supervisor", '{"suggestions": "NONE"}').value == RoleValue(None)
    pf = parse_output("proofreader", '{"mistakes": "None", "corrected article": "None"}').value
    assert pf.text_or("the article") == "the article"
    pf = parse_output("proofreader", '{"mistakes": "teh", "corrected article": "A.\\n\\nB."}').value
    assert (pf.text, pf.note) == ("A.\n\nB.", "teh")
    assert parse_output("project_director", "<think>hm</think>\n1. Executive Summary: ...").value.text == \
        "1. Executive Summary: ..."
    assert parse_output("content_integrator", "Fusion Simplification:\nCats sleep a lot.").value.text == \
        "Cats sleep a lot."
    assert parse_output("article_architect_iterative", "```\nA.\n\nB.\n```").value.text == "A.\n\nB."
    assert parse_output("article_architect_iterative", "A.\n\nB.", expect_paragraphs=3).error == \
        "paragraphs: 2 instead of 3"
    assert parse_output("content_integrator", "Fusion Simplification:  ").error == "empty"


def test_extract_prefers_a_fenced_block_and_skips_non_objects():
    assert extract_json_object('[1, 2] then {"a": "x"}') == ({"a": "x"}, "")
    assert extract_json_object('{"a": "prose"} ```json\n{"a": "fenced"}\n```') == ({"a": "fenced"}, "")
    assert extract_json_object("{broken") == (None, "no_json")


def test_retry_policy_as_data():
    assert decide([], 0) == "retry"  # the first attempt
    assert decide(["no_json"], 0) == FALL_BACK
    assert decide(["no_json", "empty", ""], 2) == "accept"
    assert decide(["no_json", "empty", "no_json"], 2) == FALL_BACK
    with pytest.raises(ValueError):
        decide([], -1)
    engine = Reply("", finish_reason="error", error="timeout", seconds=2.0, prompt_tokens=9)
    good = Reply('{"suggestions": "Use shorter words."}', prompt_tokens=10, completion_tokens=4, seconds=1.0,
                 cached=True)
    assert settle("simplify_supervisor", [engine], RoleValue(None), 1) is None
    outcome = settle("simplify_supervisor", [engine, good], RoleValue(None), 1)
    assert (outcome.value.text, outcome.attempts, outcome.errors, outcome.fell_back) == (
        "Use shorter words.", 2, ("engine: timeout",), False)
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.seconds, outcome.cached) == (19, 4, 3.0, 1)


# ----------------------------------------------------------------------------- grammars, checked by llguidance


EXAMPLES = {
    "article_logic_analyst": {"title": "Bus fares", "subheadings": ["New prices", "Who pays less"]},
    "content_simplifier": {"simplified result": "Bus tickets cost \"less\" now.\nReally."},
    "content_simplifier_revise": {"simplified result": "Tickets cost less."},
    "simplify_supervisor": {"suggestions": "None"},
    "metaphorical_analyst": {"analyzed result": "None", "simplified result": "None"},
    "terminology_interpreter": {"terminology": [], "parsed result": "A fare (the price of a ride) is cheaper."},
    "proofreader": {"mistakes": "teh -> the", "corrected article": "# T\n\nA.\n\nB."},
}


@pytest.mark.parametrize("role", JSON_ROLES)
def test_grammar_accepts_the_dumped_answer_and_it_parses(byte_tokenizer, role):
    grammar = role_grammar(role, 512)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)) == ""
    text = json.dumps(EXAMPLES[role])
    assert accepts(byte_tokenizer, grammar, text)
    assert parse_output(role, text).ok


def test_grammar_rejects_other_layouts(byte_tokenizer):
    grammar = role_grammar("metaphorical_analyst", 512)
    assert not accepts(byte_tokenizer, grammar, '{"simplified result": "None", "analyzed result": "None"}')  # order
    assert not accepts(byte_tokenizer, grammar, '{"analyzed result": "None"}')
    assert not accepts(byte_tokenizer, grammar, '{"analyzed result": "", "simplified result": "x"}')  # empty string
    assert not accepts(byte_tokenizer, grammar, '{"analyzed result": " x", "simplified result": "x"}')  # leading space
    assert not accepts(byte_tokenizer, grammar, '{"analyzed result": "a\nb", "simplified result": "x"}')  # raw newline
    terms = role_grammar("terminology_interpreter", 512)
    assert accepts(byte_tokenizer, terms, '{"terminology": ["a", "b"], "parsed result": "x"}')
    assert not accepts(byte_tokenizer, terms, '{"terminology": ["a", "b"], "parsed result": "x", "more": "y"}')


def test_grammar_bounds_strings_in_tokens(byte_tokenizer):
    grammar = role_grammar("content_simplifier", 64)  # 64 - (25 characters of fixed text + 8) = 31 tokens of text
    assert accepts(byte_tokenizer, grammar, json.dumps({"simplified result": "x" * 31}))
    assert not accepts(byte_tokenizer, grammar, json.dumps({"simplified result": "x" * 32}))
    with pytest.raises(ValueError, match="too small"):
        role_grammar("metaphorical_analyst", 30)


@pytest.mark.parametrize("role", JSON_ROLES)
def test_random_walks_through_the_grammar_parse(byte_tokenizer, role):
    """Any path the grammar allows (over printable ASCII, no backslash: see the module's one known gap) parses."""
    rng = random.Random(7)
    grammar = role_grammar(role, 160)
    lengths = []
    for _ in range(20):
        m = matcher(byte_tokenizer, grammar)
        out = bytearray()
        mask = llguidance.numpy.allocate_token_bitmask(1, byte_tokenizer.vocab_size)
        while not m.is_stopped() and len(out) < 400:
            llguidance.numpy.fill_next_token_bitmask(m, mask, 0)
            allowed = [t for t in range(32, 127) if (mask[0][t // 32] >> (t % 32)) & 1 and t != 92]
            if not allowed:
                break
            if len(allowed) > 10:  # inside a string: close it rarely, so that budgets get used up
                quote = 34 in allowed and rng.random() < 0.01
                token = 34 if quote else rng.choice([t for t in allowed if t != 34] or allowed)
            else:  # between strings (open an item or close the list, ", " ...): any choice
                token = rng.choice(allowed)
            assert m.consume_token(token)
            out.append(token)
        assert m.is_accepting(), out
        assert len(out) <= 160  # one byte per token here: the whole answer fits in max_tokens
        parsed = parse_output(role, out.decode())
        assert parsed.ok, (out.decode(), parsed.error)
        lengths.append(len(out))
    assert max(lengths) > 90  # long walks: strings closed by their token budgets, not only by a quote
