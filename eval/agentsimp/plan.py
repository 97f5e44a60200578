"""AgentSimp (paper 004) orchestration as pure data: the exact role calls of one document under one configuration.

`plan_document(article, paragraphs, config)` is a generator: it yields a batch of independent `RoleCall`s, is sent
back their `RoleOutcome`s (a mapping key -> outcome), and finally returns a `DocumentRun` with every stage's text.
It never calls a model: `eval.agentsimp.run` drives it with a completion function (a Ray engine pool in the job, a
deterministic fake in the tests). Four configurations, communication x reconstruction (§3.3, §3.2.4)::

    plan:        PD(article) -> G          ALA(article) -> O        (ALA only for direct reconstruction)
    pipeline:    CS(P_i, g) -> [SS(cs, g) -> CS'(P_i, cs, suggestions, g)] x rounds -> MA(cs, g) -> TI(ma, g)
    sync:        CS(P_i, g) | MA(P_i, g) | TI(P_i, g) ; [SS -> CS'] x rounds on cs ; CI(g, P_i, cs, ma, ti)
    direct:      AA(G, O, P'_1..P'_M)                                    one call
    iterative:   AA(carry + P'_{i..i+C-1}) per window, keep all but the last paragraph, carry the last one
    revise:      PF(article): "None" keeps it

Batches follow that order; calls in one batch are independent, across paragraphs and, in sync, across agents.

Where the paper is silent or wrong (each a `PlanConfig` knob; docs/papers/004-agentsimp.md, Deviations):

- **Supervisor** (§3.2.2 describes it, Algorithms 1-2 and the authors' code leave it out, nobody consumes its
  suggestions): `supervisor="revise"` (default, the process the paper describes) runs SS on the simplifier's
  paragraph and has the simplifier revise it with the suggestions, `supervisor_rounds` times. A "None" review
  would end that paragraph's rounds early, but Fig. 12's prompt offers the supervisor no "None" answer, so with
  the paper's prompt every paragraph gets exactly `supervisor_rounds` revisions. `supervisor="off"` is
  Algorithms 1-2.
- **Guideline of the paragraph agents**: the project director's G (Algorithms 1-2, default) or the authors' code's
  generic one (`paragraph_guideline="generic"`).
- **Metaphorical analyst "None"**: the paragraph passes unchanged: the simplifier's output in pipeline, the original
  in sync (the authors' code).
- **Iterative window** (Algorithm 2 is wrong as printed): every paragraph reaches the architect, the first window
  has C paragraphs and later ones the carried paragraph plus C more, so ceil(M/C) calls; the carried paragraph is
  not emitted twice; a document with M <= C gets one window. G goes to the first window (Algorithm 2 line 11) in its
  own prompt block (`window_guideline`: first | all | none). `window_keep_count=True` rejects an answer with
  another paragraph count (retried, then the window falls back to its input); by default any count is kept. An
  answer is split into paragraphs on blank lines; one without a blank line but with several lines is split on its
  lines (`split_answer`), so an architect that separates paragraphs by single newlines does not carry its whole
  answer into the next window.
- **Proofreader** (in §3.2.4, missing from both algorithms): on by default (`proofreader`).
- **Cut or collapsed rewrites**: an answer cut at the token limit falls back to the stage's input (every role); an
  architect's or proofreader's answer with fewer than `collapse_ratio` (0.5) x its input's words, or one sentence
  where the input had three or more, falls back too (`eval.agentsimp.outputs.guard_error`; 0 turns the collapse
  check off). Both are counted per configuration in the run rows and the report.
- **Fallbacks** (a call whose answers all fail): PD -> generic guideline, ALA -> empty outline, CS/CS'/MA/TI -> the
  paragraph they were given, SS -> no suggestions, CI -> the basic (CS) version, AA -> its paragraphs unchanged,
  PF -> the article unchanged. The outcome records `fell_back`.

A call's `key` hashes its role, inputs and check, nothing else: identical calls of different configurations (PD,
ALA, the whole CS/SS stage, the pipeline paragraph stage shared by PL and PL†, the sync one by SYNC and SYNC†)
have one key, so one run of all four configurations makes each once (and the request cache sees one prompt).

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from core.config import Section, dotted, fail, one_of
from eval.agentsimp.outputs import RoleOutcome
from eval.agentsimp.parse import RoleValue
from eval.agentsimp.roles import GENERIC_GUIDELINE, join_paragraphs, render_outline, role_spec, split_paragraphs

COMMUNICATIONS = ("pipeline", "sync")
RECONSTRUCTIONS = ("direct", "iterative")
# configuration id -> (communication, reconstruction, the paper's label in Tables 2-5)
CONFIGURATIONS = {
    "pl_direct": ("pipeline", "direct", "PL"),
    "pl_iterative": ("pipeline", "iterative", "PL†"),
    "sync_direct": ("sync", "direct", "SYNC"),
    "sync_iterative": ("sync", "iterative", "SYNC†"),
}


@dataclass(frozen=True)
class PlanConfig(Section):
    """One AgentSimp configuration; defaults are the paper's where it says (C = 2), else documented choices."""

    # pipeline (PL: CS -> MA -> TI per paragraph) | sync (SYNC: CS, MA, TI in parallel, then CI)
    communication: str = "pipeline"
    # direct (one architect call over all paragraphs, with the outline) | iterative (windows of chunk_size)
    reconstruction: str = "direct"
    chunk_size: int = 2  # C, paragraphs per iterative window (paper 2); later windows add the carried paragraph; >= 1
    # revise = SS reviews each paragraph and CS revises it with the suggestions (§3.2.2); off = Algorithms 1-2
    supervisor: str = "revise"
    supervisor_rounds: int = 1  # supervisor review + revision rounds per paragraph (>= 1)
    # guideline the paragraph agents get: pd (the project director's G, Algorithms 1-2) | generic (the authors' code)
    paragraph_guideline: str = "pd"
    # which iterative windows get G in their own prompt block: first (Algorithm 2) | all | none
    window_guideline: str = "first"
    # true = an iterative answer with another paragraph count is retried, then falls back; false = any count is kept
    window_keep_count: bool = False
    # run the proofreader (PF, §3.2.4; the authors' prompt) on the final article; false = Algorithms 1-2
    proofreader: bool = True
    # an architect or proofreader answer with fewer than this x its input's words falls back to the input; 0 = off; [0,
    # 1)
    collapse_ratio: float = 0.5
    # the generic guideline: paragraph_guideline generic uses it, and it is the fallback of a failed PD call
    generic_guideline: str = GENERIC_GUIDELINE

    @property
    def name(self) -> str:
        return f"{'pl' if self.communication == 'pipeline' else 'sync'}_{self.reconstruction}"

    @property
    def label(self) -> str:
        return CONFIGURATIONS[self.name][2]

    def check(self, where: str = "") -> None:
        """Raise ConfigError naming `<where>.<field>` for a value no plan can run with."""
        choices = (("communication", COMMUNICATIONS), ("reconstruction", RECONSTRUCTIONS),
                   ("supervisor", ("off", "revise")), ("paragraph_guideline", ("pd", "generic")),
                   ("window_guideline", ("first", "all", "none")))
        for name, allowed in choices:
            one_of(getattr(self, name), allowed, dotted(where, name))
        for name in ("chunk_size", "supervisor_rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                fail(dotted(where, name), f"must be an integer >= 1, got {value!r}")
        if not isinstance(self.collapse_ratio, int | float) or not 0 <= self.collapse_ratio < 1:
            fail(dotted(where, "collapse_ratio"), f"must be in [0, 1), got {self.collapse_ratio!r}")
        if not self.generic_guideline.strip():
            fail(dotted(where, "generic_guideline"), "must not be empty")


def configurations(base: PlanConfig | None = None) -> dict[str, PlanConfig]:
    """The four configurations (pl_direct, pl_iterative, sync_direct, sync_iterative) sharing `base`'s other knobs."""
    base = base or PlanConfig()
    return {name: replace(base, communication=comm, reconstruction=rec)
            for name, (comm, rec, _) in CONFIGURATIONS.items()}


@dataclass(frozen=True)
class RoleCall:
    """One model call a plan needs.

    Attributes:
        role: Role id (eval.agentsimp.roles); names the prompt template.
        inputs: (variable, text) pairs, exactly the template's variables.
        fallback: The value used when every attempt fails (the stage's input).
        unit: What it works on, for records: "doc", "p<i>" (0-based paragraph) or "w<k>" (window).
        expect_paragraphs: Paragraph count the answer must have (iterative architect with window_keep_count).
        min_ratio: The collapse guard's word ratio (architect, proofreader; 0 = no check).
    """

    role: str
    inputs: tuple[tuple[str, str], ...]
    fallback: RoleValue = field(compare=False)
    unit: str = field(default="doc", compare=False)
    expect_paragraphs: int = 0
    min_ratio: float = 0.0

    @cached_property
    def key(self) -> str:
        """Stable content key: same role, inputs and checks => same key, whatever the configuration or unit."""
        checks = [self.expect_paragraphs] + ([self.min_ratio] if self.min_ratio else [])
        blob = json.dumps([self.role, sorted(self.inputs), *checks], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    @property
    def step(self) -> str:
        return role_spec(self.role).step

    def input(self, name: str) -> str:
        return dict(self.inputs)[name]


@dataclass(frozen=True)
class ParagraphRun:
    """One paragraph through the paragraph stage: its versions (stage, text) in order, notes, and the result."""

    index: int
    original: str
    stages: tuple[tuple[str, str], ...]
    notes: tuple[tuple[str, str | None], ...]
    final: str


@dataclass(frozen=True)
class WindowRun:
    """One iterative-architect window: what went in, what came out, what was kept and carried on."""

    index: int
    carried: str | None
    paragraphs: tuple[str, ...]
    guided: bool
    output: tuple[str, ...]
    emitted: tuple[str, ...]
    carry: str | None


@dataclass(frozen=True)
class DocumentRun:
    """Everything one configuration produced for one document.

    `stages` are document-level texts in process order (paragraph stages joined with blank lines): cs_draft (with
    the supervisor), cs, ma, ti, ci (sync), aa, pf (with the proofreader); `final` is the last of them.
    `calls` lists every call of this configuration with its outcome, in order.
    """

    config: PlanConfig
    guideline: str | None
    outline: RoleValue | None
    paragraphs: tuple[ParagraphRun, ...]
    windows: tuple[WindowRun, ...]
    stages: tuple[tuple[str, str], ...]
    calls: tuple[tuple[RoleCall, RoleOutcome], ...]

    @property
    def final(self) -> str:
        return self.stages[-1][1]

    def stage(self, name: str) -> str:
        for stage, text in self.stages:
            if stage == name:
                return text
        raise KeyError(f"{self.config.name} has no stage {name!r}; it has {[s for s, _ in self.stages]}")


Schedule = Generator[tuple[RoleCall, ...], Mapping[str, RoleOutcome], DocumentRun]


def _call(role: str, fallback: str | None, unit: str = "doc", expect: int = 0, min_ratio: float = 0.0,
          **inputs: str) -> RoleCall:
    return RoleCall(role, tuple(inputs.items()), RoleValue(fallback), unit, expect, min_ratio)


def _ask(calls: Sequence[RoleCall], log: list) -> Generator[tuple[RoleCall, ...], Mapping[str, RoleOutcome], list]:
    """Yield one batch and return its outcomes in call order (an empty batch is not yielded)."""
    if not calls:
        return []
    answers = yield tuple(calls)
    missing = [c for c in calls if c.key not in answers]
    if missing:
        raise KeyError(f"no outcome sent for {missing[0].role} call {missing[0].unit} ({missing[0].key})")
    outcomes = [answers[c.key] for c in calls]
    log.extend(zip(calls, outcomes))
    return outcomes


def plan_document(article: str, paragraphs: Sequence[str], config: PlanConfig) -> Schedule:
    """The schedule of one document under `config` (a generator: see the module docstring).

    Args:
        article: The whole document as the planners see it (headings included).
        paragraphs: The paragraphs to simplify, in order (at least one).
        config: The configuration.

    Returns (as the generator's return value):
        The DocumentRun.
    """
    config.validate("agentsimp")
    if not paragraphs or any(not p.strip() for p in paragraphs):
        raise ValueError("plan_document needs at least one paragraph, and no empty one")
    log: list = []
    direct = config.reconstruction == "direct"
    wants_g = direct or config.paragraph_guideline == "pd" or config.window_guideline != "none"
    planning = ([_call("project_director", config.generic_guideline, article=article)] if wants_g else []) + (
        [RoleCall("article_logic_analyst", (("article", article),), RoleValue(render_outline("", ())))]
        if direct else [])
    outcomes = yield from _ask(planning, log)
    guideline = outcomes[0].value.text if wants_g else None
    outline = outcomes[-1].value if direct else None
    g = guideline if config.paragraph_guideline == "pd" else config.generic_guideline
    stage = _pipeline if config.communication == "pipeline" else _sync
    runs = yield from stage(list(paragraphs), g, config, log)
    chunks = [run.final for run in runs]
    names = [name for name, _ in runs[0].stages]
    stages = [(name, join_paragraphs([dict(run.stages)[name] for run in runs])) for name in names]
    windows: list[WindowRun] = []
    if direct:
        aa = _call("article_architect_direct", join_paragraphs(chunks), min_ratio=config.collapse_ratio,
                   guidelines=guideline, outline=outline.text, paragraphs=join_paragraphs(chunks))
        (out,) = yield from _ask([aa], log)
        stages.append(("aa", out.value.text))
    else:
        text = yield from _iterative(chunks, guideline, config, windows, log)
        stages.append(("aa", text))
    if config.proofreader:
        (out,) = yield from _ask([_call("proofreader", stages[-1][1], min_ratio=config.collapse_ratio,
                                        article=stages[-1][1])], log)
        stages.append(("pf", out.value.text_or(stages[-1][1])))
    return DocumentRun(config, guideline, outline, tuple(runs), tuple(windows), tuple(stages), tuple(log))


def _supervise(originals: list[str], drafts: list[str], g: str, config: PlanConfig, log: list):
    """Supervisor rounds on the simplifier's drafts: (revised paragraphs, suggestions per paragraph and round)."""
    current, notes = list(drafts), [[] for _ in drafts]
    active = list(range(len(drafts)))
    for _ in range(config.supervisor_rounds):
        reviews = yield from _ask([_call("simplify_supervisor", None, f"p{i}", guidelines=g,
                                         simplified_paragraph=current[i]) for i in active], log)
        for i, review in zip(active, reviews):
            notes[i].append(review.value.text)
        active = [i for i, review in zip(active, reviews) if review.value.text is not None]
        revised = yield from _ask([_call("content_simplifier_revise", current[i], f"p{i}", guidelines=g,
                                         paragraph=originals[i], simplified=current[i],
                                         suggestions=notes[i][-1]) for i in active], log)
        for i, out in zip(active, revised):
            current[i] = out.value.text
    return current, notes


def _initial(originals: list[str], g: str, config: PlanConfig, log: list, with_batch: Sequence[RoleCall] = ()):
    """CS on every paragraph (batched with `with_batch`), then the supervisor: (drafts, cs, notes, extra outcomes)."""
    calls = [_call("content_simplifier", p, f"p{i}", guidelines=g, paragraph=p) for i, p in enumerate(originals)]
    outcomes = yield from _ask([*calls, *with_batch], log)
    drafts = [o.value.text for o in outcomes[: len(calls)]]
    current, notes = drafts, [[] for _ in drafts]
    if config.supervisor == "revise":
        current, notes = yield from _supervise(originals, drafts, g, config, log)
    return drafts, current, notes, outcomes[len(calls):]


def _cs_stages(drafts, current, config, i) -> list[tuple[str, str]]:
    return ([("cs_draft", drafts[i])] if config.supervisor == "revise" else []) + [("cs", current[i])]


def _pipeline(originals: list[str], g: str, config: PlanConfig, log: list):
    drafts, cs, notes, _ = yield from _initial(originals, g, config, log)
    ma_out = yield from _ask([_call("metaphorical_analyst", t, f"p{i}", guidelines=g, paragraph=t)
                              for i, t in enumerate(cs)], log)
    ma = [o.value.text_or(cs[i]) for i, o in enumerate(ma_out)]
    ti_out = yield from _ask([_call("terminology_interpreter", t, f"p{i}", guidelines=g, paragraph=t)
                              for i, t in enumerate(ma)], log)
    return [ParagraphRun(i, p, tuple(_cs_stages(drafts, cs, config, i) + [("ma", ma[i]), ("ti", ti_out[i].value.text)]),
                         _notes(notes[i], ma_out[i], ti_out[i]), ti_out[i].value.text)
            for i, p in enumerate(originals)]


def _sync(originals: list[str], g: str, config: PlanConfig, log: list):
    parallel = [_call(role, p, f"p{i}", guidelines=g, paragraph=p)
                for role in ("metaphorical_analyst", "terminology_interpreter") for i, p in enumerate(originals)]
    drafts, cs, notes, outs = yield from _initial(originals, g, config, log, parallel)
    m = len(originals)
    ma_out, ti_out = outs[:m], outs[m:]
    ma = [o.value.text_or(originals[i]) for i, o in enumerate(ma_out)]
    ti = [o.value.text for o in ti_out]
    ci_out = yield from _ask([_call("content_integrator", cs[i], f"p{i}", guidelines=g, original_paragraph=p,
                                    basic_simplification_paragraph=cs[i],
                                    metaphorical_simplification_paragraph=ma[i],
                                    terminology_simplification_paragraph=ti[i])
                              for i, p in enumerate(originals)], log)
    return [ParagraphRun(i, p, tuple(_cs_stages(drafts, cs, config, i) + [("ma", ma[i]), ("ti", ti[i]),
                                                                          ("ci", ci_out[i].value.text)]),
                         _notes(notes[i], ma_out[i], ti_out[i]), ci_out[i].value.text)
            for i, p in enumerate(originals)]


def _notes(suggestions: list, ma: RoleOutcome, ti: RoleOutcome) -> tuple[tuple[str, str | None], ...]:
    rounds = tuple((f"suggestions_{r + 1}", s) for r, s in enumerate(suggestions))
    return (*rounds, ("metaphors", ma.value.note), ("terms", "; ".join(ti.value.items)))


def split_answer(text: str) -> list[str]:
    """An architect's answer as paragraphs: blank-line separated, or line by line when it has no blank line.

    >>> split_answer("A b.\\nC d.\\n\\nE.")
    ['A b.\\nC d.', 'E.']
    >>> split_answer("A b.\\nC d.\\nE.")
    ['A b.', 'C d.', 'E.']
    """
    paragraphs = split_paragraphs(text)
    if len(paragraphs) == 1 and "\n" in paragraphs[0]:
        return [line.strip() for line in paragraphs[0].split("\n") if line.strip()]
    return paragraphs


def _iterative(chunks: list[str], guideline: str | None, config: PlanConfig, windows: list, log: list):
    """The corrected Algorithm 2: windows of C new paragraphs after the carried one; returns the joined article."""
    out: list[str] = []
    carry, start = None, 0
    while start < len(chunks):
        new = chunks[start: start + config.chunk_size]
        start += config.chunk_size
        window = ([carry] if carry is not None else []) + new
        text = join_paragraphs(window)
        k = len(windows)
        guided = config.window_guideline == "all" or (config.window_guideline == "first" and k == 0)
        expect = len(split_paragraphs(text)) if config.window_keep_count else 0
        ratio = config.collapse_ratio
        call = (_call("article_architect_iterative_guided", text, f"w{k}", expect, ratio, guidelines=guideline,
                      paragraphs=text) if guided else
                _call("article_architect_iterative", text, f"w{k}", expect, ratio, paragraphs=text))
        (result,) = yield from _ask([call], log)
        answer = split_answer(result.value.text)
        more = start < len(chunks)
        emitted, next_carry = (answer[:-1], answer[-1]) if more else (answer, None)
        windows.append(WindowRun(k, carry, tuple(new), guided, tuple(answer), tuple(emitted), next_carry))
        out.extend(emitted)
        carry = next_carry
    return join_paragraphs(out)
