"""AgentSimp role prompts (configs/prompts/agentsimp_*.yaml) and the role registry (eval.agentsimp.roles).

Every role's template loads and renders with `eval.prompts.load_template`; the eight prompts the paper prints are
compared line by line with the paper's text (../shared/papers, skipped where absent), allowing only the documented
edits: our placeholders, the JSON braces the extraction lost, Fig. 16's repaired output spec and the PDF's
one-space indents.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eval.agentsimp.roles import ROLE_IDS, ROLE_SPECS, load_role_book, role_spec
from eval.prompts import PromptError, find_placeholders, load_template, prompt_path

PAPER = Path(__file__).resolve().parents[1].parent / "shared" / "papers" / \
    "004-agentsimp-document-simplification.paper.txt"
VARIABLES = {
    "project_director": ("article",),
    "article_logic_analyst": ("article",),
    "content_simplifier": ("guidelines", "paragraph"),
    "content_simplifier_revise": ("guidelines", "paragraph", "simplified", "suggestions"),
    "simplify_supervisor": ("guidelines", "simplified_paragraph"),
    "metaphorical_analyst": ("guidelines", "paragraph"),
    "terminology_interpreter": ("guidelines", "paragraph"),
    "content_integrator": ("guidelines", "original_paragraph", "basic_simplification_paragraph",
                           "metaphorical_simplification_paragraph", "terminology_simplification_paragraph"),
    "article_architect_direct": ("guidelines", "outline", "paragraphs"),
    "article_architect_iterative": ("paragraphs",),
    "article_architect_iterative_guided": ("guidelines", "paragraphs"),
    "proofreader": ("article",),
    "baseline_template_1": ("raw_text",),
    "baseline_template_2": ("raw_text",),
    "baseline_template_3": ("example", "raw_text"),
}
# role -> (first words of the figure, its caption, the paper's placeholder for each of our variables)
FIGURES = {
    "project_director": ("Please act as a project director", "Figure 9:", {"article": "$[article]$"}),
    "article_logic_analyst": ("Please act as a article logic analyst", "Figure 10:", {"article": "[articles]"}),
    "content_simplifier": ("Please act as a content simplifier", "Figure 11:",
                           {"guidelines": "[guidelines]", "paragraph": "[paragraph]"}),
    "simplify_supervisor": ("Please act as a simplify supervisor", "Figure 12:",
                            {"guidelines": "[guidelines]", "simplified_paragraph": "[simplified_paragraph]"}),
    "metaphorical_analyst": ("Please act as a metaphorical sentiment analyst", "Figure 13:",
                             {"guidelines": "[guidelines]", "paragraph": "[paragraph]"}),
    "content_integrator": ("Please act as an expert in simplification feature fusion", "Figure 14:",
                           {v: f"[{v}]" for v in VARIABLES["content_integrator"]}),
    "article_architect_iterative": ("Please act as an 'Article Architect'", "Figure 15:",
                                    {"paragraphs": "[*paragraphs*]"}),
    "terminology_interpreter": ("Please act as a 'Terminology Interpreter'", "Figure 16:",
                                {"guidelines": "[*guidelines*]", "paragraph": "[*paragraph*]"}),
    "baseline_template_1": ("You are a professional simplified text writer", "Figure 6:", {"raw_text": "[Raw text]"}),
    "baseline_template_2": ("As a text simplification writer", "Figure 7:", {"raw_text": "[Raw text]"}),
    "baseline_template_3": ("(A complex document - simple document example)", "Figure 8:",
                            {"example": "(A complex document - simple document example)", "raw_text": "[Raw text]"}),
}
TI_PAPER_SPEC = ('"terminology": [{"terminology1", "terminology2", "terminology3"...}, "parsed result": ')
TI_OUR_SPEC = '{"terminology": ["terminology1", "terminology2", "terminology3", ...], "parsed result": '


@pytest.mark.parametrize("role", ROLE_IDS)
def test_each_role_template_loads_and_renders(role):
    template = load_template(prompt_path(role_spec(role).template))
    assert template.variables == VARIABLES[role]
    assert template.source.startswith("paper 004 (AgentSimp)")
    assert [m["role"] for m in template.messages] == ["user"]  # one user turn, as the authors' code sends
    messages = template.render(**{v: f"<<{v}>>" for v in template.variables})
    text = messages[0]["content"]
    assert all(f"<<{v}>>" in text for v in template.variables) and find_placeholders(text) == []


def paper_figure(start: str, caption: str) -> list[str]:
    text = PAPER.read_text(encoding="utf-8")
    begin = text.index(start)
    lines = text[begin: text.index(caption, begin)].split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def expected_from_paper(role: str) -> str:
    start, caption, placeholders = FIGURES[role]
    out = []
    for line in paper_figure(start, caption):
        # the PDF extraction indents some lines by one space; only Fig. 9's " - " sub-items are indented on purpose
        line = line if line.startswith(" - ") else line.lstrip(" ")
        for variable, mark in placeholders.items():
            line = line.replace(mark, "{" + variable + "}")
        if role == "terminology_interpreter":
            assert TI_PAPER_SPEC in line or "terminology1" not in line
            line = line.replace(TI_PAPER_SPEC, TI_OUR_SPEC).replace("possible).\".", "possible).\"}.")
        elif "must be in JSON format: \"" in line:  # the outer braces the extraction lost
            line = line.replace('JSON format: "', 'JSON format: {"')
            assert line.endswith(".")
            line = line[:-1] + "}."
        out.append(line)
    return "\n".join(out)


@pytest.mark.skipif(not PAPER.is_file(), reason=f"paper text not found at {PAPER}")
@pytest.mark.parametrize("role", list(FIGURES))
def test_paper_prompts_are_verbatim_but_for_documented_edits(role):
    template = load_template(prompt_path(role_spec(role).template))
    assert template.messages[0]["content"] == expected_from_paper(role)


def test_derived_prompts_keep_the_papers_text():
    simplifier = load_template(prompt_path("agentsimp_content_simplifier")).messages[0]["content"]
    revise = load_template(prompt_path("agentsimp_content_simplifier_revise")).messages[0]["content"]
    head, closing = simplifier.rsplit("\n\n", 1)
    assert revise.startswith(head + "\n\nYour previous simplified result:\n{simplified}")
    assert revise.endswith("\n\n" + closing)
    iterative = load_template(prompt_path("agentsimp_article_architect_iterative")).messages[0]["content"]
    guided = load_template(prompt_path("agentsimp_article_architect_iterative_guided")).messages[0]["content"]
    assert guided == iterative.replace("The paragraphs need to be optimized:",
                                       "The guidelines:\n{guidelines}\n\nThe paragraphs need to be optimized:")
    direct = load_template(prompt_path("agentsimp_article_architect_direct")).messages[0]["content"]
    assert "Warning: Only minor coherence adjustments need to be made based on existing paragraphs, and existing " \
           "content cannot be changed." in direct
    proofreader = load_template(prompt_path("agentsimp_proofreader")).messages[0]["content"]
    assert re.search(r'\{"mistakes": .*"corrected article": .*\}\.', proofreader)


def test_direct_architect_and_proofreader_are_the_authors_prompts():
    # the authors' code (FDzhaozi/AgentSimp, Agents/Article_architect.py gen_aa_response, Agents/Proofreader.py
    # gen_pf_response); the paper prints neither
    direct = load_template(prompt_path("agentsimp_article_architect_direct")).messages[0]["content"]
    assert direct.startswith("Please act as an ‘Article Architect’ for the task of simplifying articles. You are given "
                             "the simplified versions of each paragraph of the original article, including a "
                             "guidelines document used for simplification, and an article structure.")
    assert "3. Ensure that the requirements in the guideline are met and that all titles in the article structure " \
           "are inserted." in direct
    # repaired: the paragraphs fill the authors' empty "[]" slot, the answer starts after the last line
    assert "The paragraphs has been simplified:\n[{paragraphs}]\n\n" in direct
    assert direct.endswith("The combined well-structured article:")
    proofreader = load_template(prompt_path("agentsimp_proofreader")).messages[0]["content"]
    assert proofreader.startswith("Please act as a proofreader for the task of simplifying articles. Your role is to "
                                  "check an article for logical errors, content mistakes, grammatical errors, etc.")
    assert ('"corrected article": "if \'mistakes\' is \'None\', here is \'None\', Otherwise, the corrected complete '
            'article needs to be provided here"}.') in proofreader
    assert "The simplified article:\n[{article}]\n\n" in proofreader


def test_role_book_renders_and_takes_overrides(tmp_path):
    book = load_role_book()
    assert [name for name, _ in book.templates] == list(ROLE_IDS) == [s.id for s in ROLE_SPECS]
    messages = book.messages("content_simplifier", (("guidelines", "G"), ("paragraph", "P")))
    assert messages[0]["content"].endswith("The guidelines:\nG\n\nThe paragraph need to be simplified:\nP\n\n"
                                           "Please provide the results according to my requirements and output "
                                           "format, without any additional explanations:")
    with pytest.raises(PromptError, match="missing variable 'paragraph'"):
        book.messages("content_simplifier", {"guidelines": "G"})
    custom = tmp_path / "cs.yaml"
    custom.write_text('description: d\nsource: s\nvariables: [guidelines, paragraph]\nmessages:\n'
                      '  - {role: user, content: "Simplify {paragraph} ({guidelines})"}\n', encoding="utf-8")
    book = load_role_book({"content_simplifier": str(custom)})
    assert book.messages("content_simplifier", {"guidelines": "G", "paragraph": "P"}) == [
        {"role": "user", "content": "Simplify P (G)"}]
    with pytest.raises(ValueError, match="unknown AgentSimp role 'editor'"):
        load_role_book({"editor": str(custom)})
    with pytest.raises(ValueError, match=r"declares \['guidelines', 'paragraph'\]; the role supplies \['article'\]"):
        load_role_book({"proofreader": str(custom)})
    with pytest.raises(ValueError, match="unknown AgentSimp role 'judge'"):
        role_spec("judge")
