"""Tests for eval.prompts and the template files in configs/prompts (pure, no model)."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eval import prompts
from eval.judging import blocks as judge_blocks
from eval.judging.blocks import (
    ALIGNMENTS_ABSENT,
    PARSES_ABSENT,
    flatten_parse,
    render_alignment_block,
    render_alignments_section,
    render_candidates_block,
    render_parses_section,
    tokenize_for_alignment,
)
from eval.judging.menlo_parse import MENLO_LABELS, parse_menlo_grades
from eval.judging.parse import parse_best_worst, parse_score
from eval.prompts import (
    PROMPTS_DIR,
    PromptError,
    find_placeholders,
    load_template,
    prompt_path,
)

TEMPLATE_FILES = sorted(PROMPTS_DIR.glob("*.yaml"))
EXPECTED_TEMPLATES = {
    "simplify_lexical", "simplify_overall", "simplify_lexical_zeroshot", "simplify_overall_zeroshot",
    "judge_policy", "parse_ptb", "jury_score", "synth_complex", "synth_simplify", "jury_pairwise",
    "judge_policy_brief", "jury_pairwise_brief", "menlo_pairwise", "menlo_pointwise", "menlo_pointwise_fewshot",
    "menlo_grpo_grm", "menlo_pairwise_fewshot", "menlo_listwise", "jury_score_1shot", "jury_score_norationale",
    "craft_planner", "craft_planner_brief", "craft_reviser", "craft_feedback_fluency",
    "craft_feedback_grammaticality", "craft_feedback_coherence", "craft_direct", "craft_iter",
    # paper 004 (AgentSimp): one template per role id (eval.agentsimp.roles)
    "agentsimp_project_director", "agentsimp_article_logic_analyst", "agentsimp_content_simplifier",
    "agentsimp_content_simplifier_revise", "agentsimp_simplify_supervisor", "agentsimp_metaphorical_analyst",
    "agentsimp_terminology_interpreter", "agentsimp_content_integrator", "agentsimp_article_architect_direct",
    "agentsimp_article_architect_iterative", "agentsimp_article_architect_iterative_guided", "agentsimp_proofreader",
    # and Table 2's single-prompt LLM baselines (Appendix B, templates 1-3)
    "agentsimp_baseline_template_1", "agentsimp_baseline_template_2", "agentsimp_baseline_template_3",
    # its document-level jury (issue 12; actors.jury score format)
    "agentsimp_jury_coherence", "agentsimp_jury_simplicity", "agentsimp_jury_faithfulness",
}


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """\
description: d
source: s
variables: [input]
messages:
  - role: system
    content: 'Answer as JSON like {"k": 1}; keep {Lexical / Overall} and {{input}} literal.'
  - role: user
    content: "{input}"
"""


def test_doctests_pass():
    assert doctest.testmod(prompts).failed == 0
    assert doctest.testmod(judge_blocks).failed == 0  # the judge input blocks, split from eval.prompts


# -----------------------------------------------------------------------------
# Every template file


def test_all_expected_templates_exist():
    assert {p.stem for p in TEMPLATE_FILES} == EXPECTED_TEMPLATES


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.stem)
def test_every_template_loads_and_renders(path):
    template = load_template(path)
    values = {v: f"<<{v.upper()}>>" for v in template.variables}
    messages = template.render(**values)
    assert len(messages) == len(template.messages)
    assert {m["role"] for m in messages} <= {"system", "user", "assistant"}
    assert messages[-1]["role"] == "user"
    text = "\n".join(m["content"] for m in messages)
    for v in template.variables:
        assert f"<<{v.upper()}>>" in text
        assert "{" + v + "}" not in text
    # after rendering, no identifier placeholder is left anywhere
    assert find_placeholders(text) == []


def test_zeroshot_prompts_are_the_fewshot_system_instruction():
    for policy in ("lexical", "overall"):
        few = load_template(prompt_path(f"simplify_{policy}"))
        zero = load_template(prompt_path(f"simplify_{policy}_zeroshot"))
        assert zero.messages[0] == few.messages[0]
        assert zero.render(input="X.") == [few.messages[0], {"role": "user", "content": "X."}]


def test_judge_policy_keeps_guideline_braces():
    template = load_template(prompt_path("judge_policy"))
    messages = template.render(source="s", candidates="c", alignments="a", parses="p")
    line = "Aspect: {Lexical / Structural / Overall}, Best: {0, 1, 2 or 3}, Worst: {0, 1, 2 or 3}"
    assert line in messages[0]["content"]
    assert messages[-1]["content"] == "Source sentence: s\nc\na\np"


def test_jury_score_shots_parse_to_paper_scores():
    template = load_template(prompt_path("jury_score"))
    shots = [m["content"] for m in template.messages if m["role"] == "assistant"]
    assert [parse_score(s).value for s in shots] == [3, 4, 1, 3, 4]
    # the paper's "\n" + line break is ONE newline; other printed wraps are spaces
    assert template.messages[-1]["content"] == "Base Sentence: {base_sentence}\nNew Sentence: {new_sentence}"
    assert template.messages[0]["content"].count("\n") == 5


def test_judge_policy_shots_parse_to_paper_decisions():
    shots = [m["content"] for m in load_template(prompt_path("judge_policy")).messages if m["role"] == "assistant"]
    got = [{a: (r["best"], r["worst"]) for a, r in parse_best_worst(s, 4).items()} for s in shots]
    assert got == [
        {"Lexical": (1, 0), "Structural": (3, 2), "Overall": (1, 0)},  # Fig. 8
        {"Lexical": (3, 2), "Structural": (2, 0), "Overall": (1, 2)},  # Fig. 9
        {"Lexical": (3, 2), "Structural": (1, 2), "Overall": (1, 2)},  # Fig. 10
    ]


def test_jury_pairwise_instructed_format_is_what_the_parser_accepts():
    system = load_template(prompt_path("jury_pairwise")).messages[0]["content"]
    start = system.index("<think> Your analysis")
    instructed = system[start:]
    assert instructed.count("FINAL GRADE: k - LABEL") == 2
    for k, label in MENLO_LABELS.items():
        grades = parse_menlo_grades(instructed.replace("k - LABEL", f"{k} - {label}"))
        assert (grades.grade_a, grades.grade_b, grades.format_ok, grades.error) == (k, k, True, "")
        assert f"{k} - {label}" in system  # the rubric names every label the parser expects


def _parse_shot_input(text: str) -> dict:
    """Pull source, candidates, alignment pairs and parses back out of a judge_policy shot."""
    lines = text.split("\n")
    source = lines[0].removeprefix("Source sentence: ")
    candidates = [lines[1 + k].split(": ", 1)[1] for k in range(4)]
    pairs = []
    for k in range(4):
        head = lines.index(f"{k} alignment:")
        pair_line = lines[head + 3].strip()
        pairs.append([(int(s), int(t)) for s, t in re.findall(r"(\d+)_\S+?-(\d+)_\S+", pair_line)])
    parse_head = lines.index("Source parse:")
    parses = [lines[parse_head + 1 + 2 * i].strip() for i in range(5)]
    return {"source": source, "candidates": candidates, "pairs": pairs, "parses": parses}


def test_judge_policy_shots_match_live_rendering():
    # The live input is built by the render_* helpers; each worked example must look exactly like
    # what those helpers would produce for its own materials, or the judge sees two formats.
    template = load_template(prompt_path("judge_policy"))
    shots = [m["content"] for m in template.messages[1:-1] if m["role"] == "user"]
    assert len(shots) == 3
    for shot in shots:
        x = _parse_shot_input(shot)
        rendered = template.render(
            source=x["source"],
            candidates=render_candidates_block(x["candidates"]),
            alignments=render_alignments_section(x["source"], x["candidates"], x["pairs"]),
            parses=render_parses_section(x["parses"][0], x["parses"][1:]),
        )[-1]["content"]
        assert rendered == shot


def test_judge_policy_shot_parses_are_balanced():
    template = load_template(prompt_path("judge_policy"))
    for shot in (m["content"] for m in template.messages[1:-1] if m["role"] == "user"):
        for tree in _parse_shot_input(shot)["parses"]:
            depth = 0
            for i, ch in enumerate(tree):
                depth += (ch == "(") - (ch == ")")
                assert depth > 0 or i == len(tree) - 1, tree
            assert depth == 0, tree


# -----------------------------------------------------------------------------
# Rendering rules


def test_render_substitutes_only_declared_placeholders(tmp_path):
    template = load_template(write(tmp_path, GOOD))
    messages = template.render(input="x {input} {{y}}")
    assert messages[0]["content"] == 'Answer as JSON like {"k": 1}; keep {Lexical / Overall} and {input} literal.'
    # values are inserted verbatim, never re-scanned for placeholders or escapes
    assert messages[1]["content"] == "x {input} {{y}}"
    assert template.messages[1]["content"] == "{input}"  # template unchanged


def test_render_errors_name_template_and_variable(tmp_path):
    template = load_template(write(tmp_path, GOOD, "mine.yaml"))
    with pytest.raises(PromptError, match=r"'mine'.*missing variable 'input'"):
        template.render()
    with pytest.raises(PromptError, match=r"'mine'.*undeclared variable 'other'"):
        template.render(input="a", other="b")
    with pytest.raises(PromptError, match=r"'mine'.*'input' must be str"):
        template.render(input=3)


@pytest.mark.parametrize(
    "text, match",
    [
        ("source: s\nvariables: []\nmessages: [{role: user, content: hi}]\n", "missing key 'description'"),
        (GOOD + "extra: 1\n", "unknown key 'extra'"),
        (GOOD.replace("role: system", "role: tool"), r"messages\[0\]: role 'tool'"),
        (GOOD.replace('content: "{input}"', 'content: "{inp}"'), r"messages\[1\]: placeholder \{inp\} is not"),
        (GOOD.replace("[input]", "[input, extra]"), "variable 'extra' is declared but no message uses it"),
        (GOOD.replace("[input]", "[input, input]"), "duplicate entries"),
        (GOOD.replace("[input]", "[in put]"), "not an identifier"),
        ("description: d\nsource: s\nvariables: []\nmessages: []\n", "non-empty list"),
        (GOOD.replace("  - role: user\n", "  - role: user\n    name: x\n"), r"messages\[1\]: must be a mapping"),
        ("description: d\nsource: s\nvariables: [\n", "invalid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
        (GOOD.replace("description: d", "description: ''"), "'description' must be a non-empty string"),
    ],
)
def test_load_template_rejects_bad_files(tmp_path, text, match):
    path = write(tmp_path, text, "bad.yaml")
    with pytest.raises(PromptError, match=match) as info:
        load_template(path)
    assert str(path) in str(info.value)


def test_load_template_missing_file(tmp_path):
    with pytest.raises(PromptError, match="not found"):
        load_template(tmp_path / "nope.yaml")


def test_prompt_path_resolves_names_and_passes_paths():
    assert prompt_path("jury_score") == PROMPTS_DIR / "jury_score.yaml"
    assert PROMPTS_DIR == Path(prompts.__file__).resolve().parents[1] / "configs" / "prompts"
    assert prompt_path("elsewhere/x.yaml") == Path("elsewhere/x.yaml")
    assert prompt_path("x.yaml") == Path("x.yaml")
    assert prompt_path(Path("y")) == Path("y")


# -----------------------------------------------------------------------------
# Judge input blocks


def test_render_candidates_block():
    assert render_candidates_block(["First one.", "Second."]) == "0: First one.\n1: Second."


def test_render_alignment_block_reproduces_paper_example():
    # Paper 000 Fig. 8, candidate 1; pairs given out of order and must come back sorted.
    pairs = [(7, 7), (0, 1), (0, 0), (1, 2), (2, 3), (4, 4), (5, 5), (6, 6)]
    block = render_alignment_block(
        1, "We'll slip you through with our cloaking device.", "We will hide you using our cloaking device.", pairs
    )
    assert block == (
        "1 alignment:\n"
        "    0_we'll 1_slip 2_you 3_through 4_with 5_our 6_cloaking 7_device.\n"
        "    0_we 1_will 2_hide 3_you 4_using 5_our 6_cloaking 7_device.\n"
        "    0_we'll-0_we 0_we'll-1_will 1_slip-2_hide 2_you-3_you 4_with-4_using 5_our-5_our "
        "6_cloaking-6_cloaking 7_device.-7_device."
    )


def test_render_alignment_block_edge_cases():
    assert tokenize_for_alignment("  China's ACTIONS,\tgrew. ") == ["china's", "actions,", "grew."]
    assert render_alignment_block(0, "a b", "c", []) == "0 alignment:\n    0_a 1_b\n    0_c\n    "
    assert render_alignment_block(2, "a", "b", None) == "2 alignment:\n    (not available)"
    with pytest.raises(ValueError, match="out of range"):
        render_alignment_block(0, "a b", "c", [(2, 0)])
    with pytest.raises(ValueError, match="out of range"):
        render_alignment_block(0, "a b", "c", [(0, 1)])


def test_absent_features_render_explicit_lines():
    assert render_alignments_section("s", ["a", "b"], None) == ALIGNMENTS_ABSENT
    assert render_parses_section("(S)", None) == PARSES_ABSENT
    with pytest.raises(ValueError):
        render_alignments_section("s", ["a", "b"], [[(0, 0)]])
    section = render_alignments_section("x y", ["x", "z"], [[(0, 0)], None])
    assert section == "0 alignment:\n    0_x 1_y\n    0_x\n    0_x-0_x\n1 alignment:\n    (not available)"


def test_flatten_parse_escapes_newlines():
    pretty = "(S\n  (NP (PRP We))\n  (VP (VB go)))\n"
    assert flatten_parse(pretty) == r"(S\n (NP (PRP We))\n (VP (VB go)))"
    assert flatten_parse(r"(S \n (NP x))") == r"(S \n (NP x))"  # already escaped: unchanged
    assert render_parses_section(None, ["(X)"]) == "Source parse:\n    (not available)\n0 parse:\n    (X)"


def test_modules_stay_pure():
    code = (
        "import sys, eval.prompts, eval.judging.parse, eval.judging.aggregate\n"
        "bad = [m for m in ('ray', 'torch', 'vllm', 'deepspeed') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
