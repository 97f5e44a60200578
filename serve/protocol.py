"""Wire format and pure logic of the generative reward model (GRM) service: no ray, no torch.

Requests are pydantic models (FastAPI answers a malformed body with 422 naming the field); the semantic checks
below raise `RequestError` (-> 400 naming the field). Judge messages are rendered from `configs/prompts` templates
with `eval.prompts`, judge text is read with `eval.judging.parse`: the offline jury and the online reward share both.

Judge templates are filled from request fields through the config's field -> variable maps, plus MENLO's context
variables: `locale` from the request, and `dimension` / `question` / `criteria` from the request's `dimension` key
looked up in the rubrics file (`prompts.rubrics`, as in `jobs/judge/evaluate.py`; `serve.judge_prompts`). `/score` reads either paper 001's
``Answer: [k]`` or MENLO's pointwise ``<final_grade> FINAL GRADE: k - LABEL </final_grade>``
(`prompts.pointwise_format`); `/compare` always reads MENLO's A/B grade blocks.

Group rewards (`/reward/group`) are computed in `serve.rewards`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from actors.engines.base import SEED_MAX, Completion, SamplingParams, split_thinking
from core.config import Section, dotted, fail
from eval.judging.listwise import MAX_LISTWISE
from eval.judging.menlo_parse import MENLO_LABELS, parse_menlo_grade, parse_menlo_grades
from eval.judging.parse import parse_score
from eval.reward_wire import Usage

_RATIONALE_CHARS = 2000
_GRADE_MARK_RE = re.compile(r"<\s*final[\s_.\\-]*grade|answer[\s*_]*:[\s*_]*\[", re.IGNORECASE)


class RequestError(ValueError):
    """A request that is well-formed but unacceptable (HTTP 400); `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class Limits(Section):
    # request bodies above this many bytes get 413
    max_body_bytes: int = 1_000_000
    # longest prompt / response / reference / message text, in characters
    max_text_chars: int = 20_000
    # most responses in one /reward/group request
    max_group_size: int = 16
    # most messages in one chat completion
    max_messages: int = 64
    # largest max_tokens a request may ask for
    max_tokens: int = 1024

    def check(self, where: str = "") -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                fail(dotted(where, f.name), f"must be >= 1, got {getattr(self, f.name)}")


# ---------------------------------------------------------------------------------------------------------------
# Requests
#
# Everything a request could carry that would fail inside the engine is refused here, per request (422 naming
# the field), before the request joins a `@serve.batch`: a seed past 64 bits (torch's generator overflows),
# NaN / infinite floats, lone surrogates ("\ud800" is valid JSON but not encodable as UTF-8, so no tokenizer
# takes it). One bad client must never fail the other requests of its batch.


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text holds a lone surrogate (not encodable as UTF-8)") from None
    return text


# request text: any string that is valid UTF-8
Text = Annotated[str, AfterValidator(_utf8)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
# finite floats only (JSON's NaN / Infinity are refused with 422)
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class SamplingOverride(BaseModel):
    model_config = _STRICT
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: Seed | None = None


class CallerTag(BaseModel):
    """Who sent a request, for the service-side reward monitors (`serve.monitoring`): a run's name and its training
    step (None: the service counts steps itself, every `monitor.step_rollouts` rollouts)."""

    model_config = _STRICT
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/@+-]+$")
    step: int | None = Field(None, ge=0)
    # which value of a pairwise group answer the caller trains on, recorded and monitored as its reward: the body's
    # `rewards` (margin) or its items' `mean_grade` (own_grade); listwise and /score have one value each
    signal: Literal["margin", "own_grade"] = "margin"


class JudgeRequest(BaseModel):
    model_config = _STRICT
    sampling: SamplingOverride | None = None
    # a deadline shorter than the server's (seconds)
    timeout_s: float | None = Field(None, gt=0)
    # MENLO context for templates that declare it: a key of the rubrics file (e.g. "fluency") and a locale
    dimension: Text | None = Field(None, min_length=1)
    locale: Text | None = Field(None, min_length=1)


class ScoreRequest(JudgeRequest):
    prompt: Text = Field(min_length=1)
    response: Text
    reference: Text | None = None
    # the run this request belongs to: its rewards are recorded and monitored per caller (omitted: not recorded)
    caller: CallerTag | None = None


class CompareRequest(JudgeRequest):
    prompt: Text = Field(min_length=1)
    response_a: Text
    response_b: Text


class GroupRewardRequest(JudgeRequest):
    prompt: Text = Field(min_length=1)
    responses: list[Text] = Field(min_length=1)
    reference: Text | None = None
    scheme: Literal["all_pairs", "vs_reference", "listwise"] = "all_pairs"
    both_orders: bool = False
    # as ScoreRequest's: the caller whose monitors record this group
    caller: CallerTag | None = None


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward-model body (openrlhf 0.11.2 `openrlhf/utils/agent.py`,
    `SingleTurnAgentExecutor._fetch_rewards_via_http`): `query` is the decoded prompt + response, special tokens
    kept; `prompts` the prompts as given to the tokenizer; `labels` the dataset's label column. Unknown fields are
    ignored, as OpenRLHF's own RM server does."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    query: list[Text] = Field(min_length=1)
    prompts: list[Text]
    labels: list[Text | None] | None = None


OPENRLHF_SCHEMES = ("score", "vs_reference", "all_pairs", "listwise")
# special-token text a decode with skip_special_tokens=False leaves after a response (ChatML, Llama, Gemma, ...)
_TRAILING_SPECIAL_RE = re.compile(r"(?:\s*(?:<\|[A-Za-z0-9_]+\|>|</s>|<eos>|<end_of_turn>))+\s*$")


def openrlhf_response(query: str, prompt: str, field: str) -> str:
    """The policy's response inside OpenRLHF's `query` (decode(prompt tokens + response tokens), special tokens
    kept): what follows the prompt, without the end-of-sequence tokens after it.

    >>> openrlhf_response("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>",
    ...                   "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n", "query[0]")
    'Hello!'
    """
    if query.startswith(prompt):
        rest = query[len(prompt):]
    else:
        # a tokenizer round trip may not give the prompt back verbatim at the start (a BOS it adds, spacing);
        # the prompt's last occurrence still ends where the response begins
        at = query.rfind(prompt) if prompt else -1
        if at < 0:
            raise RequestError(field, "does not contain its prompt (prompts[i]): cannot tell the response apart")
        rest = query[at + len(prompt):]
    return _TRAILING_SPECIAL_RE.sub("", rest)


def check_openrlhf(req: OpenRLHFRequest, limits: Limits) -> None:
    n = len(req.query)
    if len(req.prompts) != n:
        raise RequestError("prompts", f"{len(req.prompts)} prompts for {n} queries")
    if req.labels is not None and len(req.labels) != n:
        raise RequestError("labels", f"{len(req.labels)} labels for {n} queries")
    check_texts([(f"query[{i}]", q) for i, q in enumerate(req.query)]
                + [(f"prompts[{i}]", p) for i, p in enumerate(req.prompts)], limits)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: Text


class ChatCompletionRequest(BaseModel):
    """The OpenAI fields we honour; unknown fields are ignored (clients send many), `stream`/`n` > 1 are refused."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: Text | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: Seed | None = None
    stop: Text | list[Text] | None = None
    n: int = Field(1, ge=1, le=1)
    stream: Literal[False] = False
    timeout_s: float | None = Field(None, gt=0)


def check_texts(texts: list[tuple[str, str | None]], limits: Limits) -> None:
    for name, text in texts:
        if text is not None and len(text) > limits.max_text_chars:
            raise RequestError(name, f"{len(text)} characters exceeds the limit of {limits.max_text_chars}")


def check_group(req: GroupRewardRequest, limits: Limits) -> None:
    """Raise RequestError for a group the scheme cannot judge or the server will not take."""
    n = len(req.responses)
    if n > limits.max_group_size:
        raise RequestError("responses", f"{n} responses exceeds the limit of {limits.max_group_size}")
    if req.scheme == "all_pairs" and n < 2:
        raise RequestError("responses", f"scheme all_pairs needs at least 2 responses, got {n}")
    if req.scheme == "listwise" and not 2 <= n <= MAX_LISTWISE:
        raise RequestError("responses", f"scheme listwise ranks 2..{MAX_LISTWISE} responses in one call, got {n}")
    if req.scheme == "listwise" and (req.reference is not None or req.both_orders):
        raise RequestError("reference" if req.reference is not None else "both_orders",
                           "scheme listwise ranks the group itself: no reference, one order")
    if req.scheme == "vs_reference" and req.reference is None:
        raise RequestError("reference", "scheme vs_reference needs a reference")
    check_texts([("prompt", req.prompt), ("reference", req.reference)]
                + [(f"responses[{i}]", r) for i, r in enumerate(req.responses)], limits)


def check_chat(req: ChatCompletionRequest, limits: Limits) -> None:
    if len(req.messages) > limits.max_messages:
        raise RequestError("messages", f"{len(req.messages)} messages exceeds the limit of {limits.max_messages}")
    check_texts([(f"messages[{i}].content", m.content) for i, m in enumerate(req.messages)], limits)


def resolve_sampling(default: SamplingParams, limits: Limits, *, temperature: float | None = None,
                     top_p: float | None = None, max_tokens: int | None = None, seed: int | None = None,
                     stop: str | list[str] | None = None, field_prefix: str = "") -> SamplingParams:
    """The server's default sampling with the request's overrides applied and capped."""
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise RequestError(f"{field_prefix}max_tokens", f"{max_tokens} exceeds the limit of {limits.max_tokens}")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not s for s in stops):
        raise RequestError(f"{field_prefix}stop", "stop strings must be non-empty")
    overrides = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed}
    params = {k: v for k, v in overrides.items() if v is not None}
    if stops:
        params["stop"] = stops
    return dataclasses.replace(default, **params)


def judge_sampling(default: SamplingParams, limits: Limits, override: SamplingOverride | None) -> SamplingParams:
    values = override.model_dump() if override else {}
    return resolve_sampling(default, limits, field_prefix="sampling.", **values)


def clean_response(text: str, strip_think: bool) -> str:
    """A policy response as the judge sees it: without its <think> reasoning when `strip_think` (MENLO §5)."""
    return split_thinking(text)[0] if strip_think else text


# ---------------------------------------------------------------------------------------------------------------
# Responses


class ScoreResponse(BaseModel):
    grade: int | None
    label: str | None
    # the strict format check of the template's output format (MENLO: tags once, in order, label matches grade)
    format_ok: bool
    rationale: str
    parse_status: str
    raw: str
    model: str
    cached: bool
    usage: Usage


class CompareResponse(BaseModel):
    grade_a: int | None
    grade_b: int | None
    label_a: str | None
    label_b: str | None
    preference: Literal["A", "B", "tie"] | None
    format_ok: bool
    rationale: str
    parse_status: str
    raw: str
    model: str
    cached: bool
    usage: Usage


def usage_of(completions: list[Completion]) -> Usage:
    prompt = sum(c.prompt_tokens for c in completions)
    completion = sum(c.completion_tokens for c in completions)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def judge_text(completion: Completion) -> str:
    """What the parsers read: the verbatim output (keeps <think> tags for MENLO's format check)."""
    return completion.raw_text or completion.text


def extract_rationale(raw: str) -> str:
    """The judge's reasoning: its <think> block, else the text before the grade markup.

    >>> extract_rationale("Fluent but lossy. Answer: [3]")
    'Fluent but lossy.'
    """
    answer, reasoning = split_thinking(raw or "")
    if not reasoning:
        mark = _GRADE_MARK_RE.search(answer)
        reasoning = answer[: mark.start()] if mark else answer
    return reasoning.strip()[:_RATIONALE_CHARS]


def status_of(completion: Completion, parse_error: str) -> str:
    if completion.finish_reason == "error":
        return f"engine_error: {completion.error}"
    return parse_error or "ok"


def score_response(completion: Completion, model: str, cached: bool, fmt: str = "answer") -> ScoreResponse:
    """`fmt` "answer": paper 001's ``Answer: [k]``; "menlo": MENLO's pointwise block, format checked strictly."""
    raw = judge_text(completion)
    if fmt == "menlo":
        grades = parse_menlo_grade(raw)
        grade, error, format_ok = grades.grade_a, grades.error, grades.format_ok
    else:
        parsed = parse_score(raw)
        grade, error, format_ok = parsed.value, parsed.error, not parsed.error
    return ScoreResponse(
        grade=grade, label=MENLO_LABELS.get(grade), format_ok=format_ok, rationale=extract_rationale(raw),
        parse_status=status_of(completion, error), raw=raw, model=model, cached=cached,
        usage=usage_of([completion]),
    )


def compare_response(completion: Completion, model: str, cached: bool) -> CompareResponse:
    raw = judge_text(completion)
    grades = parse_menlo_grades(raw)
    preference = None
    if not grades.error:
        preference = "tie" if grades.grade_a == grades.grade_b else "A" if grades.grade_a > grades.grade_b else "B"
    return CompareResponse(
        grade_a=grades.grade_a, grade_b=grades.grade_b, label_a=MENLO_LABELS.get(grades.grade_a),
        label_b=MENLO_LABELS.get(grades.grade_b), preference=preference, format_ok=grades.format_ok,
        rationale=extract_rationale(raw), parse_status=status_of(completion, grades.error), raw=raw, model=model,
        cached=cached, usage=usage_of([completion]),
    )
