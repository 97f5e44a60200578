"""The four CRAFT systems of the CORD comparison (paper 002, §6.1) as pure loops around a chat model.

- **Direct** (§6.1 (a)): one call, ``craft_direct`` (instruction + text).
- **Iter** (§6.1 (d)): Direct, then ``iter_rounds - 1`` rounds of ``craft_iter`` (instruction, original, previous
  revision); no tool feedback. Paper: 5 rounds.
- **Agent** (§5.1-5.2): planner -> tool calls + per-sentence plan (``eval.craft.react``) -> reviser (E.7) ->
  tools check the planner's calls (``eval.craft.tools``) -> observation (``eval.craft.render``) fed back, at most
  ``max_steps`` (paper 5). The paper's stop (D.2, D.5): when revision quality stops improving: the step reward
  (the search's, R_g + 100 x accuracy on the planner's first tool list) has not risen for ``patience`` steps.
  ``stop_when_all_met`` also stops once every call of that list holds (off: a planner that misreads a constraint
  satisfies its own wrong check at once).

**One guard rule for every system** (``eval.craft.guard``): a revision the guard flags is replaced by the text it
revised (Direct: the input; an Iter round or an agent step: the previous text; a TG-MCTS child is never chosen, so
the answer is a usable node or the input) and counted by reason in ``guard_flags``.
- **TG-MCTS** (§5.3): ``eval.craft.mcts.run_search`` with :func:`expander` (the agent's step, K samples per node) and
  :func:`scorer`.

Models sit behind ``llm(batch) -> replies``: ``batch`` is a list of ``(messages, sampling)`` pairs (``sampling`` =
keyword arguments of ``actors.engines.base.SamplingParams``), each reply has ``.text`` and ``.finish_reason``. The Ray
actor (``actors.craft_worker``) backs it with a cached engine; tests back it with a scripted fake. Nothing here
raises on model output: parse errors and guard flags are counted in the result.

Text quality (R_g of the search, the agent's step reward, the ``text_eval()`` score; ``eval.craft.quality``): a
:data:`eval.craft.quality.QualityFn` given to :class:`Systems` (``quality=``), ``score(original, revisions)``,
anchored at the task's input as App. D.3 defines it. The job builds it from ``QualityConfig`` (``metric: d3``, the
default: normalised perplexity and BARTScore, ``actors.text_quality``); tests and ``metric: difflib`` use the old
word-similarity proxy (100 for a copy), which is also what a ``Systems`` built without ``quality`` gets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from core.config import Section, dotted, fail, one_of, positive
from eval.craft.grammar import planner_grammar
from eval.craft.guard import GuardConfig, degenerate_reason
from eval.craft.quality import QualityFn, difflib_quality, difflib_scorer
from eval.craft.react import (
    PlanLine,
    PlannerStep,
    join_revision,
    parse_planner_output,
    parse_suggestions,
    splice_revision,
)
from eval.craft.render import build_observation, render_history, render_plan_input
from eval.craft.text import sentence_pieces
from eval.craft.tools import CallError, constraint_accuracy
from eval.craft.tree import ExpandRequest, Proposal, RewardTerms
from eval.prompts import TemplateName, load_template, prompt_path

LLM = Callable[[list[tuple[list[dict], dict]]], list[Any]]
FEEDBACK_ASPECTS = ("fluency", "grammaticality", "coherence")


@dataclass(frozen=True)
class AgentConfig(Section):
    """Prompts, decoding and loop knobs shared by the four systems.

    Attributes:
        planner_prompt / reviser_prompt / direct_prompt / iter_prompt: prompt files under configs/prompts/.
        max_steps: Agent planner -> reviser steps at most (paper 5).
        iter_rounds: Iter's revision rounds, the Direct one included (paper 5).
        planner_max_tokens / reviser_max_tokens: Token caps of one planner / reviser answer. ``reviser_max_tokens``
            is every system's budget (Direct, Iter, the agent's and the search's reviser, E.8 feedback): one number
            for all, and the CORD job refuses one below :func:`rewrite_budget` of its longest input.
        tokens_per_word: New tokens one input word needs when rewritten (:func:`rewrite_budget`; 2.5 covers every
            CORD text under SmolLM2's tokenizer: 1.07-2.33, median 1.22).
        planner_temperature: Sampling temperature of the planner (the agent's first sample and MCTS' K samples;
            D.6 and the authors' code: 0.7).
        reviser_temperature: Sampling temperature of the reviser, the Direct and Iter answers and the E.8
            feedback (D.6: GPT-4o at 0.7; 0 = greedy). Every sampled request carries a seed.
        history_window: Planner steps kept in its chat (None = all, the paper; a small model's context cannot).
        quality_feedback: Ask the reviser model for E.8 fluency / grammaticality / coherence feedback each step
            (3 more calls per step; the paper does; off keeps a CPU demo affordable).
        tool_feedback: Show the tools' feedback (constraint checks, the text_eval() score, E.8 suggestions) in the
            observation; off = the revised text alone (the paper's "w/o Feedback" ablation, Tables 6-7).
        planner_grammar: Decode the planner under ``eval.craft.grammar.planner_grammar`` (Table 17 layout, the
            E.2 tools with typed arguments, plan lines that quote the current text's sentences verbatim), so every
            finished answer parses. Not the paper's (a trained 8B planner needs none); on in the CPU demo.
        unplanned_sentences: ``drop`` (the paper: the reviser sees only the plan, E.7, and its output is the
            revision) or ``keep`` (sentences the plan does not quote stay in place:
            ``eval.craft.react.splice_revision``; for planners that quote only a few sentences).
        patience: Agent steps without a rise of the step reward before it stops (0 = run ``max_steps``).
        stop_when_all_met: Also stop the agent once every call of its first tool list holds (off: not the paper's).
        guard: The degenerate-revision guard, one rule for Direct, Iter and the agent (see the module docstring).
    """

    planner_prompt: TemplateName = "craft_planner"  # prompt file of the planner under configs/prompts/ (or a path)
    reviser_prompt: TemplateName = "craft_reviser"  # prompt file of the reviser under configs/prompts/ (or a path)
    direct_prompt: TemplateName = "craft_direct"  # prompt file of the Direct system under configs/prompts/ (or a path)
    iter_prompt: TemplateName = "craft_iter"  # prompt file of the Iter system under configs/prompts/ (or a path)
    max_steps: int = 5  # agent planner -> reviser steps at most (paper 5)
    iter_rounds: int = 5  # Iter's revision rounds, the Direct one included (paper 5)
    planner_max_tokens: int = 1024  # token cap of one planner answer
    reviser_max_tokens: int = 1024  # token cap of one reviser answer (every system's; see rewrite_budget)
    # new tokens one input word needs when rewritten (the CORD job refuses a reviser_max_tokens below the longest
    # input's need; 2.5 covers every CORD text under SmolLM2's tokenizer: 1.07-2.33 tokens per word)
    tokens_per_word: float = 2.5
    # sampling temperature of the planner (the agent's first sample and MCTS' K samples; D.6 and the authors' code:
    # 0.7)
    planner_temperature: float = 0.7
    # sampling temperature of the reviser, the Direct and Iter answers and the E.8 feedback (D.6: GPT-4o at 0.7; 0 =
    # greedy). Every sampled request carries a seed
    reviser_temperature: float = 0.7
    # planner steps kept in its chat (None = all, the paper; a small model's context cannot)
    history_window: int | None = None
    # ask the reviser model for E.8 fluency / grammaticality / coherence feedback each step (3 more calls per step; the
    # paper does; off keeps a CPU demo affordable)
    quality_feedback: bool = True
    # show the tools' feedback (constraint checks, the text_eval() score, E.8 suggestions) in the observation; off =
    # the revised text alone (the paper's "w/o Feedback" ablation, Tables 6-7)
    tool_feedback: bool = True
    # decode the planner under `eval.craft.grammar.planner_grammar` (Table 17 layout, the E.2 tools with typed
    # arguments, plan lines that quote the current text's sentences verbatim), so every finished answer parses. Not the
    # paper's (a trained 8B planner needs none); on in the CPU demo
    planner_grammar: bool = False
    # `drop` (the paper: the reviser sees only the plan, E.7, and its output is the revision) or `keep` (sentences the
    # plan does not quote stay in place: `eval.craft.react.splice_revision`; for planners that quote only a few
    # sentences)
    unplanned_sentences: Literal["drop", "keep"] = "drop"
    patience: int = 2  # agent steps without a rise of the step reward before it stops (0 = run `max_steps`)
    # also stop the agent once every call of its first tool list holds (off: not the paper's)
    stop_when_all_met: bool = False
    # the degenerate-revision guard, one rule for Direct, Iter and the agent (see the module docstring)
    guard: GuardConfig = field(default_factory=GuardConfig)

    def check(self, where: str = "") -> None:
        for name in ("max_steps", "iter_rounds", "planner_max_tokens", "reviser_max_tokens", "tokens_per_word"):
            positive(getattr(self, name), dotted(where, name))
        one_of(self.unplanned_sentences, ("drop", "keep"), dotted(where, "unplanned_sentences"))
        if self.planner_grammar:
            try:
                planner_grammar(self.planner_max_tokens)
            except ValueError as exc:
                fail(dotted(where, "planner_max_tokens"), f"too small for planner_grammar: {exc}")


REWRITE_MARGIN = 32  # tokens for an answer's opening and closing words around the rewritten text


def rewrite_budget(text: str, tokens_per_word: float) -> int:
    """New tokens a whole rewrite of ``text`` needs: ``ceil(tokens_per_word x words) + REWRITE_MARGIN``.

    >>> rewrite_budget("one two three four", 2.5)
    42
    """
    return math.ceil(tokens_per_word * len(text.split())) + REWRITE_MARGIN


@dataclass
class SystemRun:
    """One system's answer for one row. ``steps`` holds per-step records (JSON-able) for the report and W&B."""

    revision: str
    steps: list[dict] = field(default_factory=list)
    stop_reason: str = ""
    parse_errors: int = 0
    guard_flags: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# the old proxy under its old name (``metric: difflib``): 100 x word-level similarity of revision and original
quality = difflib_quality


class Systems:
    """The four systems for one model pair; ``llm_planner`` may be the same callable as ``llm_reviser``."""

    def __init__(self, config: AgentConfig, llm_planner: LLM, llm_reviser: LLM, seed: int = 0,
                 quality: QualityFn = difflib_scorer):
        self.config, self.planner, self.reviser, self.seed = config, llm_planner, llm_reviser, seed
        self.quality = quality
        self.scorer = make_scorer(quality)
        self.templates = {name: load_template(prompt_path(getattr(config, f"{name}_prompt")))
                          for name in ("planner", "reviser", "direct", "iter")}
        self.feedback = {a: load_template(prompt_path(f"craft_feedback_{a}")) for a in FEEDBACK_ASPECTS}

    def _sampling(self, max_tokens: int, temperature: float = 0.0, seed: int = 0, stop: Sequence[str] = (),
                  grammar: str = "") -> dict:
        out = {"max_tokens": max_tokens, "temperature": temperature, "seed": self.seed + seed, "stop": tuple(stop)}
        if grammar:
            out["grammar"] = grammar
        return out

    def _revise(self, messages: list[dict], seed: int) -> Any:
        cfg = self.config
        return self.reviser([(messages, self._sampling(cfg.reviser_max_tokens, cfg.reviser_temperature, seed))])[0]

    def _guarded(self, run: SystemRun, reply: Any, previous: str, original: str) -> str:
        """The guard's one rule: a flagged answer is replaced by the text it revised (counted by reason)."""
        text = reply.text.strip()
        reason = degenerate_reason(text, previous, original, self.config.guard,
                                   truncated=reply.finish_reason == "length")
        if reason:
            run.guard_flags[reason] = run.guard_flags.get(reason, 0) + 1
            return previous
        return text

    # -- baselines -------------------------------------------------------------------------------------------
    def direct(self, instruction: str, text: str) -> SystemRun:
        reply = self._revise(self.templates["direct"].render(instruction=instruction, text=text), 0)
        run = SystemRun(revision=text, stop_reason="done")
        run.revision = self._guarded(run, reply, text, text)
        run.steps.append({"round": 1, "finish_reason": reply.finish_reason, "accepted": not run.guard_flags})
        return run

    def iterate(self, instruction: str, text: str) -> SystemRun:
        run = self.direct(instruction, text)
        for round_no in range(2, self.config.iter_rounds + 1):
            messages = self.templates["iter"].render(instruction=instruction, original=text, previous=run.revision)
            reply = self._revise(messages, 0)
            flags = sum(run.guard_flags.values())
            run.revision = self._guarded(run, reply, run.revision, text)
            run.steps.append({"round": round_no, "finish_reason": reply.finish_reason,
                              "accepted": sum(run.guard_flags.values()) == flags})
        return run

    # -- one planner -> reviser step (the agent's step and an MCTS child) -------------------------------------
    def initial_messages(self, instruction: str, text: str) -> list[dict]:
        return self.templates["planner"].render(examples="", instruction=instruction, text=text)

    def steps(self, history: list[dict], current: str, original: str, k: int, seed: int,
              planner_fn: Callable[[str], str] | None = None) -> list[Proposal]:
        """K planner samples on ``history``, each revised, checked and turned into an observation (batched).

        ``planner_fn(current) -> planner answer`` replaces the planner model (no planner call: the gold planner,
        ``eval.craft.gold_plan``); its K answers are the same and the K revisions differ by the reviser's seeds."""
        cfg = self.config
        if planner_fn is not None:
            outs = [_Reply(planner_fn(current)) for _ in range(k)]
        else:
            grammar = planner_grammar(cfg.planner_max_tokens, sentence_pieces(current)) if cfg.planner_grammar else ""
            outs = self.planner([(history, self._sampling(cfg.planner_max_tokens, cfg.planner_temperature, seed + i,
                                                          ("###OBSERVATION",), grammar)) for i in range(k)])
        parsed = [parse_planner_output(o.text) for o in outs]
        plans = [_plan_for_reviser(s.plan, cfg.unplanned_sentences) for s in parsed]
        with_plan = [i for i, p in enumerate(plans) if p]
        revs = self.reviser([(self.templates["reviser"].render(plan=render_plan_input(plans[i])),
                              self._sampling(cfg.reviser_max_tokens, cfg.reviser_temperature, seed + i))
                             for i in with_plan])
        texts = [""] * k  # a step without plan lines has no revision: the guard counts it as empty
        truncated = [o.finish_reason == "length" for o in outs]
        for i, rev in zip(with_plan, revs):
            texts[i] = splice_revision(current, plans[i], rev.text) if cfg.unplanned_sentences == "keep" \
                else join_revision(rev.text)
            truncated[i] = truncated[i] or rev.finish_reason == "length"
        suggestions = self._quality_feedback(texts, seed) if cfg.quality_feedback else [{} for _ in texts]
        proposals = []
        for i, (step, text) in enumerate(zip(parsed, texts)):
            _, results = constraint_accuracy(step.tool_calls, original, text or current)
            messages = [r.message for r in results if isinstance(r, CallError) or not r.pending]
            # text_eval() -> score (E.2): the text-quality tool's score in the observation when the planner calls it
            score = self.quality(original, [text or current])[0].value \
                if any(c.replace(" ", "") == "text_eval()" for c in step.tool_calls) else None
            calls = (planner_fn is None) + (i in with_plan) + \
                (len(FEEDBACK_ASPECTS) if cfg.quality_feedback and text else 0)
            proposals.append(Proposal(
                text=text, planner_output=step.raw, plan=tuple(asdict(p) for p in step.plan),
                observation=build_observation(text or current, messages, suggestions[i], quality_score=score,
                                              include_feedback=cfg.tool_feedback),
                tool_calls=tuple(step.tool_calls),
                feedback={"constraints": messages, "quality": suggestions[i], "text_eval": score},
                model_calls=calls, truncated=truncated[i], parse_errors=tuple(step.errors)))
        return proposals

    def _quality_feedback(self, texts: list[str], seed: int = 0) -> list[dict]:
        """E.8 suggestions per aspect for every non-empty text, all aspects of all texts in one batch."""
        cfg = self.config
        todo = [(i, a) for i, t in enumerate(texts) if t for a in FEEDBACK_ASPECTS]
        replies = self.reviser([(self.feedback[a].render(text=texts[i]),
                                 self._sampling(cfg.reviser_max_tokens, cfg.reviser_temperature, seed + i))
                                for i, a in todo])
        out: list[dict] = [{} for _ in texts]
        for (i, aspect), reply in zip(todo, replies):
            out[i][aspect.capitalize()] = [s.render() for s in parse_suggestions(reply.text)]
        return out

    # -- the agent ---------------------------------------------------------------------------------------------
    def agent(self, instruction: str, text: str) -> SystemRun:
        """Planner/reviser loop: at most max_steps; stops when the step reward stalls (see the module docstring)."""
        cfg = self.config
        initial = self.initial_messages(instruction, text)
        done: list[tuple[PlannerStep, str]] = []
        run = SystemRun(revision=text, stop_reason="max_steps")
        rc_calls: list[str] | None = None  # the planner's first tool list: what every step's accuracy is over
        best, stall = float("-inf"), 0
        for step_no in range(cfg.max_steps):
            history = render_history(initial, done, window=cfg.history_window)
            proposal = self.steps(history, run.revision, text, k=1, seed=1000 * step_no)[0]
            reason = degenerate_reason(proposal.text, run.revision, text, cfg.guard, truncated=proposal.truncated)
            run.parse_errors += bool(proposal.parse_errors)
            if reason:
                run.guard_flags[reason] = run.guard_flags.get(reason, 0) + 1
            else:
                run.revision = proposal.text  # a flagged revision is not accepted: the text stays as it was
            rc_calls = list(proposal.tool_calls) if rc_calls is None else rc_calls
            terms = self.scorer(text, [run.revision], [rc_calls])[0]
            reward = terms.quality + 100 * terms.accuracy
            run.steps.append({"step": step_no + 1, "planner_output": proposal.planner_output, "revision": proposal.text,
                              "guard": reason, "tool_calls": list(proposal.tool_calls), "accuracy": terms.accuracy,
                              "n_checks": terms.n_checks, "reward": reward, "parse_errors": list(proposal.parse_errors)})
            done.append((parse_planner_output(proposal.planner_output), proposal.observation))
            if cfg.stop_when_all_met and terms.n_checks and terms.accuracy >= 1.0 and not reason:
                run.stop_reason = "all_constraints_met"
                break
            best, stall = (reward, 0) if reward > best else (best, stall + 1)
            if cfg.patience and stall >= cfg.patience:
                run.stop_reason = "patience"
                break
        return run


def _plan_for_reviser(plan: list[PlanLine], unplanned: str) -> list[PlanLine]:
    """The plan lines the reviser gets: all of them (the paper), or each quoted sentence once when unquoted
    sentences are kept (a sentence planned twice would be spliced in twice)."""
    if unplanned != "keep":
        return list(plan)
    seen: set[str] = set()
    return [p for p in plan if not (p.sentence.strip() in seen or seen.add(p.sentence.strip()))]


def expander(systems: Systems, original: str,
             planner_fn: Callable[[str], str] | None = None) -> Callable[[ExpandRequest], list[Proposal]]:
    """TG-MCTS expansion: K of the agent's steps on the node's history (``eval.craft.mcts.Expander``);
    ``planner_fn`` replaces the planner model (the gold planner)."""
    def expand(request: ExpandRequest) -> list[Proposal]:
        return systems.steps(request.history, request.text, original, request.k, request.seed, planner_fn)
    return expand


@dataclass(frozen=True)
class _Reply:
    """A planner answer that no model wrote (``planner_fn``): finished, never cut."""

    text: str
    finish_reason: str = "stop"


def make_scorer(quality_fn: QualityFn) -> Callable[[str, list[str], list[list[str]]], list[RewardTerms]]:
    """TG-MCTS evaluation (``eval.craft.mcts.Scorer``): R_g = ``quality_fn`` (one batched call per expansion),
    accuracy over real checks only; the quality parts (PPL_nom, BART_nom, ...) go to ``RewardTerms.parts``."""
    def score(original: str, revisions: list[str], tool_calls: list[list[str]]) -> list[RewardTerms]:
        qualities = quality_fn(original, list(revisions)) if revisions else []
        out = []
        for revision, calls, q in zip(revisions, tool_calls, qualities):
            accuracy, results = constraint_accuracy(calls, original, revision)
            n_checks = sum(isinstance(r, CallError) or not r.pending for r in results)
            out.append(RewardTerms(quality=q.value, accuracy=accuracy, n_checks=n_checks, parts=dict(q.parts)))
        return out
    return score


# the search's scorer with the old difflib proxy (``metric: difflib``), for tests and scripts without models
scorer = make_scorer(difflib_scorer)
