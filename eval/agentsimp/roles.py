"""AgentSimp (paper 004) roles: who they are, which prompt file each uses, and how their prompts are rendered.

The paper's nine roles (§3.1) become twelve *role ids*, one per prompt template, because three roles have two
prompts each in our reading of the paper; three more ids are the single-prompt LLM baselines of Table 2 (Appendix B,
templates 1-3), run beside the agents on the same backbone (eval.agentsimp.baselines):

=====================================  =====  ===========  ======  =============================================
role id                                abbr.  step (§3.2)  output  template (configs/prompts/agentsimp_<id>.yaml)
=====================================  =====  ===========  ======  =============================================
project_director                       PD     plan         text    Fig. 9
article_logic_analyst                  ALA    plan         json    Fig. 10
content_simplifier                     CS     initial      json    Fig. 11
simplify_supervisor                    SS     initial      json    Fig. 12
content_simplifier_revise              CS     initial      json    Fig. 11 + our revision blocks
metaphorical_analyst                   MA     refined      json    Fig. 13
terminology_interpreter                TI     refined      json    Fig. 16 (output spec repaired)
content_integrator                     CI     refined      text    Fig. 14 (synchronous strategy only)
article_architect_direct               AA     reconstruct  text    the authors' code (the paper prints none)
article_architect_iterative            AA     reconstruct  text    Fig. 15
article_architect_iterative_guided     AA     reconstruct  text    Fig. 15 + a guideline block
proofreader                            PF     revise       json    the authors' code (the paper prints none)
baseline_template_1 / _2 / _3          LLM    baseline     text    Figs. 6-8 (Table 2's single-prompt baselines)
=====================================  =====  ===========  ======  =============================================

Each template's ``description`` says what we changed and why. A job may point any role at another template file
(``load_role_book(overrides=...)``) as long as it declares the same variables.

Texts handed between roles: paragraphs are joined with one blank line (Fig. 15: "two paragraphs should be separated
by two line breaks") and split again on blank lines; the outline is shown to the architect as the JSON the logic
analyst wrote. The generic guideline is the one the authors' code gives the paragraph agents instead of the
project director's (plan knob ``paragraph_guideline: generic``).

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eval.prompts import PromptTemplate, load_template, prompt_path

STEPS = ("plan", "initial", "refined", "reconstruct", "revise", "baseline")

# the authors' code gives CS/MA/TI/CI this instead of the project director's guideline (notes §1.7, paraphrased)
GENERIC_GUIDELINE = (
    "1. Complete the requirements as carefully as possible to serve the subsequent simplified tasks.\n"
    "2. The generated content should be as easy as possible for elementary school students or people with low "
    "educational levels to understand."
)

_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


@dataclass(frozen=True)
class RoleSpec:
    """One role id: its paper abbreviation, process step, output kind ("json" or "text") and template name."""

    id: str
    abbr: str
    step: str
    output: str

    @property
    def template(self) -> str:
        return f"agentsimp_{self.id}"


ROLE_SPECS = (
    RoleSpec("project_director", "PD", "plan", "text"),
    RoleSpec("article_logic_analyst", "ALA", "plan", "json"),
    RoleSpec("content_simplifier", "CS", "initial", "json"),
    RoleSpec("simplify_supervisor", "SS", "initial", "json"),
    RoleSpec("content_simplifier_revise", "CS", "initial", "json"),
    RoleSpec("metaphorical_analyst", "MA", "refined", "json"),
    RoleSpec("terminology_interpreter", "TI", "refined", "json"),
    RoleSpec("content_integrator", "CI", "refined", "text"),
    RoleSpec("article_architect_direct", "AA", "reconstruct", "text"),
    RoleSpec("article_architect_iterative", "AA", "reconstruct", "text"),
    RoleSpec("article_architect_iterative_guided", "AA", "reconstruct", "text"),
    RoleSpec("proofreader", "PF", "revise", "json"),
    RoleSpec("baseline_template_1", "LLM", "baseline", "text"),
    RoleSpec("baseline_template_2", "LLM", "baseline", "text"),
    RoleSpec("baseline_template_3", "LLM", "baseline", "text"),
)
ROLE_IDS = tuple(spec.id for spec in ROLE_SPECS)


def role_spec(role: str) -> RoleSpec:
    """The spec of role id `role`; ValueError naming the known ids otherwise."""
    for spec in ROLE_SPECS:
        if spec.id == role:
            return spec
    raise ValueError(f"unknown AgentSimp role {role!r}; one of {', '.join(ROLE_IDS)}")


@dataclass(frozen=True)
class RoleBook:
    """The loaded prompt template of every role id; renders a role's messages from its named inputs."""

    templates: tuple[tuple[str, PromptTemplate], ...]

    def template(self, role: str) -> PromptTemplate:
        for name, template in self.templates:
            if name == role:
                return template
        raise ValueError(f"no template loaded for AgentSimp role {role!r}")

    def messages(self, role: str, inputs: Mapping[str, str] | Sequence[tuple[str, str]]) -> list[dict]:
        """Chat messages of one call: the role's template rendered with `inputs` (name -> text).

        Raises:
            PromptError: an input is missing or undeclared (a plan/template mismatch, named in the message).
        """
        return self.template(role).render(**dict(inputs))


def load_role_book(overrides: Mapping[str, str] | None = None) -> RoleBook:
    """Load every role's template; `overrides` maps a role id to another template name or path.

    Raises:
        ValueError: an override names an unknown role, or its template declares other variables than the
            default one (the plan supplies exactly the default's inputs).
        PromptError: a template file is missing or malformed.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(ROLE_IDS))
    if unknown:
        raise ValueError(f"template override for unknown AgentSimp role {unknown[0]!r}; one of {', '.join(ROLE_IDS)}")
    loaded = []
    for spec in ROLE_SPECS:
        template = load_template(prompt_path(spec.template))
        if spec.id in overrides:
            custom = load_template(prompt_path(overrides[spec.id]))
            if set(custom.variables) != set(template.variables):
                raise ValueError(f"template {custom.name!r} for role {spec.id!r} declares {list(custom.variables)}; "
                                 f"the role supplies {list(template.variables)}")
            template = custom
        loaded.append((spec.id, template))
    return RoleBook(tuple(loaded))


# ----------------------------------------------------------------------------- texts passed between roles


def join_paragraphs(paragraphs: Sequence[str]) -> str:
    """Paragraphs as one text, separated by one blank line (each paragraph stripped).

    >>> join_paragraphs(["A b.", " C. "])
    'A b.\\n\\nC.'
    """
    return "\n\n".join(p.strip() for p in paragraphs)


def split_paragraphs(text: str) -> list[str]:
    """Non-empty paragraphs of `text`, split on blank lines (lines inside a paragraph are kept).

    >>> split_paragraphs("# T\\n\\nA b.\\nC.\\n \\n\\nD.")
    ['# T', 'A b.\\nC.', 'D.']
    """
    return [p.strip() for p in _BLANK_LINES.split(text.strip()) if p.strip()]


def render_outline(title: str, subheadings: Sequence[str]) -> str:
    """The outline as the architect sees it: the logic analyst's JSON, on one line.

    >>> render_outline("Bus fares", ["New prices", "Who pays less"])
    '{"title": "Bus fares", "subheadings": ["New prices", "Who pays less"]}'
    """
    return json.dumps({"title": title, "subheadings": list(subheadings)}, ensure_ascii=False)
