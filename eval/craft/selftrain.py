"""CRAFT planner self-training, the pure part (paper 002 §5.1.2, Algorithm 1, Eq. 1 and Eq. 2's data).

- :func:`action_score`: Eq. 1, ``S_a = λ_v·S_v + λ_r·S_r + λ_c·S_c`` on a 0..100 scale. S_v is the tool-usage F1
  of the planner's calls against the predefined calls (``eval.craft.tools.tool_f1``, App. D.4), S_r the revision's
  quality, S_c the accuracy of the *predefined* calls on the revision. The paper's weights are λ_v = 0.5,
  λ_r = λ_c = 0.25; S_v and S_c are fractions, so they are scaled by 100 like S_r (the authors' script does the same).
  S_r is App. D.3's score (``eval.craft.quality``, the ``Systems``' ``quality``): normalised PPL and BARTScore
  anchored at the instance's input text (D.3's ``init_text``), SOME not built.
  A degenerate revision (``eval.craft.guard``) gets S_r = S_c = 0 (an empty text would otherwise pass every
  "less than" check), and then, in :func:`score_state`, an S_a below every usable candidate of its state
  (:func:`degenerate_floor`): D.3's S_r has no lower bound (PPL_nom is unclamped), so S_r = 0 alone would rank a
  collapsed answer above a usable one that reads worse than the input. The authors' code scores an empty revision
  far below any usable one (PPL 0, BARTScore -100, SOME 0: BART_nom about -950).
- :func:`pick_pair`: the highest-S_a candidate is w_{i+1}, the lowest l_{i+1} (Algorithm 1 line 5). It reads the
  guard's flag: a candidate whose revision is degenerate is never w_{i+1} and is l_{i+1} before any usable one. The
  paper is silent on ties: we drop a state whose best and worst usable candidates differ by ``min_margin`` or less,
  and never pair an empty response (SimPO divides by its length).
- :func:`sft_rows`: a planner trajectory as trainer rows, one per step: the prompt is H_{i-1} and the target the
  step's thought + action, so the loss covers assistant turns only (§5.1.2: observations masked).
- :func:`oracle_step`: the demo stand-in for GPT-4o's trajectories: one step whose tools are exactly the predefined
  calls plus ``text_eval()`` and whose plan keeps or polishes each sentence.
- :func:`stop_decision`: "until ... no further measurable improvement" as a patience rule on the dev score.
- :func:`score_state`: Algorithm 1 lines 3-5 for one instance around `eval.craft.agent.Systems` (models behind
  callables): roll the planner out to H_i, sample K actions, revise, score.

Pure module: no ray, torch or model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from core.config import Section, dotted, fail, in_range
from eval.craft.agent import Systems
from eval.craft.guard import degenerate_reason
from eval.craft.react import PlannerStep, parse_planner_output
from eval.craft.render import render_history
from eval.craft.text import REFERENCE, TextRules, split_sentences
from eval.craft.tools import constraint_accuracy, tool_f1


@dataclass
class ScoreWeights(Section):
    """Eq. 1's weights (paper: λ_v = 0.5, λ_r = 0.25, λ_c = 0.25, "to emphasis more accurate tool usage"; the
    authors' script uses 0.4 / 0.3 / 0.3), and how far below the usable candidates a degenerate one scores
    (``degenerate_margin``: not in the paper, whose Eq. 1 never meets a degenerate revision)."""

    tool: float = 0.5  # λ_v, weight of the tool-call F1 (paper 0.5; the authors' script 0.4), in [0, 1]
    quality: float = 0.25  # λ_r, weight of the text-quality score (paper 0.25; the authors' script 0.3), in [0, 1]
    # λ_c, weight of the constraint accuracy (paper 0.25; the authors' script 0.3), in [0, 1]
    constraints: float = 0.25
    # a degenerate candidate's S_a is this far below the lowest usable S_a of its state (and below 0): never preferred
    degenerate_margin: float = 100.0

    def check(self, where: str = "") -> None:
        for name in ("tool", "quality", "constraints"):
            in_range(getattr(self, name), 0, 1, dotted(where, name))
        if self.tool + self.quality + self.constraints <= 0:
            fail(dotted(where, "tool"), "at least one weight must be positive")


@dataclass(frozen=True)
class ActionScore:
    """S_a and its parts: ``tool_f1`` and ``accuracy`` are fractions, ``quality`` and ``total`` are on 0..100."""

    total: float
    tool_f1: float
    quality: float
    accuracy: float
    n_calls: int
    degenerate: str = ""

    def to_dict(self) -> dict:
        return {"score": self.total, "tool_f1": self.tool_f1, "quality": self.quality, "accuracy": self.accuracy,
                "n_calls": self.n_calls, "degenerate": self.degenerate}


def action_score(predicted_calls: Sequence[str], gold_calls: Sequence[str], original: str, revised: str,
                 quality: float, weights: ScoreWeights, degenerate: str = "",
                 rules: TextRules = REFERENCE) -> ActionScore:
    """Eq. 1 for one sampled action whose plan the reviser turned into ``revised``.

    Args:
        predicted_calls: The action's tool calls as written (parsed by the whitelisting parser, never run).
        gold_calls: The instance's predefined calls (S_c runs these on the revision).
        original: The text the action revises (y_i).
        revised: The reviser's output for the action's plan (y_{i+1}).
        quality: S_r on 0..100 (ignored when ``degenerate``).
        weights: λ_v, λ_r, λ_c.
        degenerate: The guard's reason ("empty", "refusal", ...) or "" for a usable revision.

    >>> w = ScoreWeights()
    >>> action_score(['word_count_check(5, "less than")'], ['word_count_check(5, "less than")'], "A b c d e f.",
    ...              "A b c.", 40.0, w).total   # 0.5*100*1 + 0.25*40 + 0.25*100*1
    85.0
    """
    f1 = tool_f1(predicted_calls, gold_calls)
    if degenerate:
        quality, accuracy = 0.0, 0.0
    else:
        accuracy, _ = constraint_accuracy(gold_calls, original, revised, rules)
    total = 100 * weights.tool * f1 + weights.quality * quality + 100 * weights.constraints * accuracy
    return ActionScore(total, f1, quality, accuracy, len(predicted_calls), degenerate)


@dataclass(frozen=True)
class Pair:
    """Indices of the chosen (w) and rejected (l) candidates and their score margin."""

    chosen: int
    rejected: int
    margin: float


def degenerate_floor(usable_totals: Sequence[float], margin: float) -> float:
    """S_a of a degenerate candidate: ``min(0, lowest usable S_a) - margin``, below every usable candidate.

    >>> degenerate_floor([48.35, 12.0], 100.0), degenerate_floor([-30.0], 100.0), degenerate_floor([], 100.0)
    (-100.0, -130.0, -100.0)
    """
    return min([0.0, *usable_totals]) - margin


def pick_pair(scores: Sequence[float], responses: Sequence[str], min_margin: float = 0.0,
              degenerate: Sequence[str] | None = None) -> Pair | str:
    """The best and worst candidates of one state, or why there is no pair.

    Usable = a non-empty response. ``degenerate`` holds the guard's flag of each candidate's revision ("" = usable
    revision): a flagged candidate is never the chosen one, and it is the rejected one before any candidate with a
    usable revision, whatever the scores say. Ties for best (and for worst) go to the lowest index. Reasons:
    ``too_few`` (fewer than two usable responses), ``no_usable`` (no candidate with a usable revision), ``tie``
    (two usable revisions whose margin is <= ``min_margin``), ``identical`` (the two responses are the same text:
    a pair that teaches nothing).

    >>> pick_pair([3.0, 9.0, 1.0, 9.0], ["a", "b", "c", "d"])
    Pair(chosen=1, rejected=2, margin=8.0)
    >>> pick_pair([5.0, 5.0], ["a", "b"])
    'tie'
    >>> pick_pair([50.0, 48.35], ["a", "b"], degenerate=["collapsed", ""])   # the flag, not the score, decides
    Pair(chosen=1, rejected=0, margin=-1.6500000000000057)
    """
    if len(scores) != len(responses):
        raise ValueError(f"{len(scores)} scores for {len(responses)} responses")
    flags = list(degenerate) if degenerate is not None else [""] * len(scores)
    if len(flags) != len(scores):
        raise ValueError(f"{len(flags)} guard flags for {len(scores)} responses")
    usable = [i for i, r in enumerate(responses) if r and r.strip()]
    if len(usable) < 2:
        return "too_few"
    clean = [i for i in usable if not flags[i]]
    if not clean:
        return "no_usable"
    best = max(clean, key=lambda i: (scores[i], -i))
    # a flagged candidate sorts below every usable one
    worst = min((i for i in usable if i != best), key=lambda i: (not flags[i], scores[i], i))
    margin = scores[best] - scores[worst]
    if not flags[worst] and margin <= min_margin:
        return "tie"
    if responses[best].strip() == responses[worst].strip():
        return "identical"
    return Pair(best, worst, margin)


def sft_rows(initial_messages: Sequence[dict], steps: Sequence[tuple[PlannerStep, str]],
             window: int | None = None) -> list[dict]:
    """One ``{prompt_messages, target}`` row per step of a trajectory: H_{i-1} -> (t_i, a_i).

    The paper's loss is one sequence with every assistant turn unmasked; a row per step gives the same per-token
    terms (each assistant turn is a target once, observations never are) at the cost of re-reading the prefix.
    """
    rows = []
    for i, (step, _) in enumerate(steps):
        prompt = render_history(initial_messages, steps[:i], window=window)
        rows.append({"prompt_messages": prompt, "target": step.raw})
    return rows


def oracle_step(text: str, gold_calls: Sequence[str], keep_ids: Sequence[int] = (),
                rules: TextRules = REFERENCE) -> PlannerStep:
    """A demo trajectory step (no teacher model): the predefined calls plus ``text_eval()`` as tools, and one plan
    line per sentence that keeps the sentences the instruction protects and polishes the others."""
    calls = ["text_eval()", *gold_calls]
    lines = []
    for i, sentence in enumerate(split_sentences(text, rules), start=1):
        plan = "Keep this sentence unchanged." if i in keep_ids else "Fix grammar and wording; keep the meaning."
        lines.append(f'Sentence: "{sentence}"; Improvement Plan: "{plan}"')
    thought = ("The instruction asks me to polish the text" +
               (" and to respect its constraints, which I check with the tools." if gold_calls else "."))
    raw = ("###THOUGHT: " + thought + "\n###ACTION:\n   -###TOOLS:\n" + "\n".join(calls) + "\n   -###PLAN:\n"
           + "\n".join(lines))
    return parse_planner_output(raw)


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    best_round: int
    reason: str


def stop_decision(dev_scores: Sequence[float], patience: int = 1, min_delta: float = 0.0) -> StopDecision:
    """Whether to stop after the last round. ``dev_scores[0]`` is the starting planner's (round 0, after SFT).

    Stop when none of the last ``patience`` rounds beat the best score before them by more than ``min_delta``
    (the paper: "until ... no further measurable improvement"; it shows four rounds, no rule). The planner to keep
    is ``best_round``, the first round with the best score.

    >>> stop_decision([50.0, 55.0, 54.0], patience=1)
    StopDecision(stop=True, best_round=1, reason='no improvement over round 1 for 1 round(s)')
    >>> stop_decision([50.0, 55.0, 54.0], patience=2).stop
    False
    """
    if not dev_scores:
        raise ValueError("stop_decision needs at least the starting planner's dev score")
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    best_round = max(range(len(dev_scores)), key=lambda r: (dev_scores[r], -r))
    if len(dev_scores) <= patience:
        return StopDecision(False, best_round, "")
    before = max(dev_scores[: len(dev_scores) - patience])
    recent = dev_scores[len(dev_scores) - patience:]
    if max(recent) > before + min_delta:
        return StopDecision(False, best_round, "")
    return StopDecision(True, best_round, f"no improvement over round {best_round} for {patience} round(s)")


def dev_summary(scores: Sequence[ActionScore]) -> dict:
    """The dev score of a planner: mean S_a of its greedy actions, plus the means of the parts (0 rows -> NaN)."""
    n = len(scores)
    if not n:
        nan = float("nan")
        return {"dev_score": nan, "dev_tool_f1": nan, "dev_accuracy": nan, "dev_quality": nan, "dev_rows": 0}
    return {"dev_score": sum(s.total for s in scores) / n, "dev_tool_f1": sum(s.tool_f1 for s in scores) / n,
            "dev_accuracy": sum(s.accuracy for s in scores) / n, "dev_quality": sum(s.quality for s in scores) / n,
            "dev_rows": n, "dev_degenerate": sum(bool(s.degenerate) for s in scores)}


def score_state(systems: Systems, instruction: str, text: str, gold_calls: Sequence[str], *, history_steps: int,
                k: int, seed: int, weights: ScoreWeights) -> tuple[list[dict], str, list[dict]]:
    """H_i, then K scored candidate actions on it.

    The rollout takes ``history_steps`` steps of the current planner (one sample each, the agent's step: a
    flagged revision is not accepted). Each candidate's S_c runs the predefined calls against the *original* text
    (sentence ids refer to it); S_r is ``systems.quality`` of the revision, anchored at the original input (App.
    D.3's ``init_text``; the scorer is the job's ``quality`` section). A candidate whose revision the guard flags
    gets S_a = :func:`degenerate_floor` of the state's usable candidates (``weights.degenerate_margin``).

    Returns:
        The history messages H_i, the current text y_i, and per candidate: response, tool calls, revision, parse
        errors and `ActionScore.to_dict()`.
    """
    guard = systems.config.guard
    initial = systems.initial_messages(instruction, text)
    done: list[tuple[PlannerStep, str]] = []
    current = text
    for step_no in range(history_steps):
        history = render_history(initial, done, window=systems.config.history_window)
        proposal = systems.steps(history, current, text, k=1, seed=seed + 1000 * (step_no + 1))[0]
        if not degenerate_reason(proposal.text, current, text, guard, truncated=proposal.truncated):
            current = proposal.text
        done.append((parse_planner_output(proposal.planner_output), proposal.observation))
    history = render_history(initial, done, window=systems.config.history_window)
    candidates = []
    proposals = systems.steps(history, current, text, k=k, seed=seed)
    flags = [degenerate_reason(p.text, current, text, guard, truncated=p.truncated) for p in proposals]
    usable = [p.text for p, flag in zip(proposals, flags) if not flag]
    scored = iter(systems.quality(text, usable) if usable else [])
    scores = []
    for proposal, flag in zip(proposals, flags):
        s_r = 0.0 if flag else next(scored).value
        scores.append(action_score(list(proposal.tool_calls), gold_calls, text, proposal.text, s_r, weights,
                                   degenerate=flag))
    # a degenerate candidate scores below every usable one of the state (D.3's S_r has no lower bound)
    floor = degenerate_floor([s.total for s in scores if not s.degenerate], weights.degenerate_margin)
    scores = [dataclasses.replace(s, total=floor) if s.degenerate else s for s in scores]
    for proposal, score in zip(proposals, scores):
        candidates.append({"response": proposal.planner_output, "tool_calls": list(proposal.tool_calls),
                           "revision": proposal.text, "parse_errors": list(proposal.parse_errors), **score.to_dict()})
    return history, current, candidates
