"""The generative reward model service's judge prompts: the two templates (pointwise, pairwise), which request field
fills which template variable, and MENLO's context variables (`dimension` / `question` / `criteria` from the
rubrics file, `locale` from the request). Pure: no ray, no torch. Split from `serve.protocol`.

The optional listwise template (`prompts.listwise`, scheme ``listwise`` of `/reward/group`) ranks or grades a whole
group in one call; it declares the fixed variables `LISTWISE_VARS` (besides the MENLO context): the prompt, the
numbered responses (`render_responses`), the group size and the output-format lines of `prompts.listwise_mode`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from eval.judging.listwise import MODES as LISTWISE_MODES
from eval.judging.menlo_data import MenloDataError, load_rubrics, render_criteria
from eval.prompts import PromptError, PromptTemplate, load_template, prompt_path
from serve.protocol import RequestError

POINTWISE_FORMATS = ("answer", "menlo")
# MENLO's context variables: the rubric's (from the request's dimension key) and the request's locale
RUBRIC_VARS = ("dimension", "question", "criteria")
CONTEXT_VARS = (*RUBRIC_VARS, "locale")
LISTWISE_VARS = ("prompt", "responses", "n", "output_format")


@dataclass(frozen=True)
class JudgePrompts:
    """The two judge templates, which request field fills which template variable, and the MENLO context."""

    pointwise: PromptTemplate
    pointwise_vars: dict
    pairwise: PromptTemplate
    pairwise_vars: dict
    # "answer" (paper 001, parse_score) or "menlo" (<final_grade> block, parse_menlo_grade)
    pointwise_format: str = "answer"
    # dimension key -> rubric (eval.judging.menlo_data.load_rubrics); empty when no template declares rubric variables
    rubrics: dict = dataclasses.field(default_factory=dict)
    with_rubric: bool = True
    # one call ranks ("rank") or grades ("grade") a whole group; None = this server has no listwise scheme
    listwise: PromptTemplate | None = None
    listwise_mode: str = "rank"

    @property
    def accepts_reference(self) -> bool:
        return "reference" in self.pointwise_vars

    def score_messages(self, prompt: str, response: str, reference: str | None = None,
                       dimension: str | None = None, locale: str | None = None) -> list[dict]:
        if reference is not None and not self.accepts_reference:
            raise RequestError("reference", f"the pointwise template {self.pointwise.name!r} has no reference slot "
                                            "(prompts.pointwise_vars maps no 'reference')")
        if reference is None and self.accepts_reference:
            raise RequestError("reference", f"the pointwise template {self.pointwise.name!r} needs a reference")
        fields = {"prompt": prompt, "response": response, "reference": reference}
        values = {var: fields[name] for name, var in self.pointwise_vars.items()}
        return self.pointwise.render(**values, **self.context(self.pointwise, dimension, locale))

    def compare_messages(self, prompt: str, response_a: str, response_b: str,
                         dimension: str | None = None, locale: str | None = None) -> list[dict]:
        fields = {"prompt": prompt, "response_a": response_a, "response_b": response_b}
        values = {var: fields[name] for name, var in self.pairwise_vars.items()}
        return self.pairwise.render(**values, **self.context(self.pairwise, dimension, locale))

    def listwise_messages(self, prompt: str, responses: list[str], dimension: str | None = None,
                          locale: str | None = None) -> list[dict]:
        if self.listwise is None:
            raise RequestError("scheme", "this server has no listwise template (serve config prompts.listwise)")
        values = {"prompt": prompt, "responses": render_responses(responses), "n": str(len(responses)),
                  "output_format": output_format(len(responses), self.listwise_mode)}
        return self.listwise.render(**values, **self.context(self.listwise, dimension, locale))

    def context(self, template: PromptTemplate, dimension: str | None, locale: str | None) -> dict:
        """The MENLO context variables `template` declares, from the request's `dimension` and `locale`.

        Raises:
            RequestError: a needed field is missing, unknown, or given to a template without its slot.
        """
        declared = set(template.variables)
        values = {}
        if declared & set(RUBRIC_VARS):
            if dimension is None:
                raise RequestError("dimension", f"the template {template.name!r} needs a dimension "
                                                f"(one of {sorted(self.rubrics)})")
            rubric = self.rubrics.get(dimension)
            if rubric is None:
                raise RequestError("dimension", f"unknown dimension {dimension!r} (known: {sorted(self.rubrics)})")
            rubric_values = {"dimension": rubric["name"], "question": rubric["question"],
                             "criteria": render_criteria(rubric, self.with_rubric)}
            values.update({k: v for k, v in rubric_values.items() if k in declared})
        elif dimension is not None:
            raise RequestError("dimension", f"the template {template.name!r} has no dimension slot")
        if "locale" in declared:
            if locale is None:
                raise RequestError("locale", f"the template {template.name!r} needs a locale (e.g. en_US)")
            values["locale"] = locale
        elif locale is not None:
            raise RequestError("locale", f"the template {template.name!r} has no locale slot")
        return values


def render_responses(responses: list[str]) -> str:
    """The group as the listwise template shows it, numbered from 1.

    >>> print(render_responses(["Hi.", "Hello."]))
    [Response 1]
    Hi.
    <BLANKLINE>
    [Response 2]
    Hello.
    """
    return "\n\n".join(f"[Response {k}]\n{text}" for k, text in enumerate(responses, 1))


def output_format(n: int, mode: str) -> str:
    """The verdict lines the listwise template asks for (the grammar of `eval.judging.listwise` admits exactly these).

    >>> print(output_format(3, "rank"))
    RANKING: a > b > c  (the numbers 1 to 3, each exactly once, best response first)
    >>> print(output_format(2, "grade"))
    GRADES:
    [1]: k
    [2]: k
    (one line per response, in order, where k is its grade from 1 to 5)
    """
    if mode == "rank":
        letters = " > ".join("abcdefghi"[:n])
        return f"RANKING: {letters}  (the numbers 1 to {n}, each exactly once, best response first)"
    if mode == "grade":
        lines = "\n".join(f"[{k}]: k" for k in range(1, n + 1))
        return f"GRADES:\n{lines}\n(one line per response, in order, where k is its grade from 1 to 5)"
    raise ValueError(f"listwise mode {mode!r} is not one of {LISTWISE_MODES}")


def load_judge_prompts(pointwise: str, pointwise_vars: dict, pairwise: str, pairwise_vars: dict,
                       pointwise_format: str = "answer", rubrics: str = "", with_rubric: bool = True,
                       listwise: str = "", listwise_mode: str = "rank") -> JudgePrompts:
    """Load both templates (and the rubrics when a template needs them) and check the maps cover each template.

    Raises:
        ValueError: naming the `prompts.*` key at fault.
    """
    if pointwise_format not in POINTWISE_FORMATS:
        raise ValueError(f"prompts.pointwise_format: {pointwise_format!r} is not one of {POINTWISE_FORMATS}")
    templates = {}
    for key, name in (("pointwise", pointwise), ("pairwise", pairwise)):
        try:
            templates[key] = load_template(prompt_path(name))
        except PromptError as exc:
            raise ValueError(f"prompts.{key}: {exc}") from exc
    _check_vars("prompts.pointwise_vars", templates["pointwise"], pointwise_vars,
                required={"prompt", "response"}, optional={"reference"})
    _check_vars("prompts.pairwise_vars", templates["pairwise"], pairwise_vars,
                required={"prompt", "response_a", "response_b"}, optional=set())
    if listwise_mode not in LISTWISE_MODES:
        raise ValueError(f"prompts.listwise_mode: {listwise_mode!r} is not one of {LISTWISE_MODES}")
    if listwise:
        try:
            templates["listwise"] = load_template(prompt_path(listwise))
        except PromptError as exc:
            raise ValueError(f"prompts.listwise: {exc}") from exc
        declared = set(templates["listwise"].variables) - set(CONTEXT_VARS)
        if declared != set(LISTWISE_VARS):
            raise ValueError(f"prompts.listwise: template {templates['listwise'].name!r} declares {sorted(declared)} "
                             f"besides the MENLO context; a listwise template declares {list(LISTWISE_VARS)}")
    needs_rubrics = any(set(t.variables) & set(RUBRIC_VARS) for t in templates.values())
    loaded = _load_rubrics(rubrics) if rubrics else {}
    if needs_rubrics and not rubrics:
        raise ValueError("prompts.rubrics: the templates declare dimension/question/criteria; give the rubrics "
                         "file (e.g. configs/data/menlo_rubrics.yaml)")
    return JudgePrompts(templates["pointwise"], dict(pointwise_vars), templates["pairwise"], dict(pairwise_vars),
                        pointwise_format, loaded, with_rubric, templates.get("listwise"), listwise_mode)


def _load_rubrics(path: str) -> dict:
    try:
        return load_rubrics(path)
    except (OSError, MenloDataError) as exc:
        raise ValueError(f"prompts.rubrics: {exc}") from exc


def _check_vars(where: str, template: PromptTemplate, var_map: dict, required: set, optional: set) -> None:
    unknown = sorted(set(var_map) - required - optional)
    if unknown:
        raise ValueError(f"{where}: unknown request field {unknown[0]!r} (known: {sorted(required | optional)})")
    missing = sorted(required - set(var_map))
    if missing:
        raise ValueError(f"{where}: request field {missing[0]!r} is not mapped to a template variable")
    mapped, declared = set(var_map.values()), set(template.variables) - set(CONTEXT_VARS)
    if mapped != declared:
        extra = sorted(mapped - declared) or sorted(declared - mapped)
        raise ValueError(f"{where}: template {template.name!r} declares {sorted(declared)} besides the MENLO "
                         f"context {list(CONTEXT_VARS)}, the map fills {sorted(mapped)} (first mismatch: "
                         f"{extra[0]!r})")
