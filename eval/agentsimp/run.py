"""Driving AgentSimp schedules (eval.agentsimp.plan) with any completion function, retries included.

`run_schedules(schedules, complete, max_retries)` advances many schedules in lockstep (e.g. the four
configurations of one document, or of every document of a corpus): each round it gathers the calls all waiting
schedules need, drops duplicates by key (and calls already settled in an earlier round), and settles them:

    attempts = [Attempt(call, 0) for each new call]
    repeat: replies = complete(attempts)                      # one batch: the job's engine pool, or a fake
            each call: eval.agentsimp.outputs.settle(...)      # accept / retry (Attempt(call, n)) / fall back
    until every call is settled; then every schedule is sent its outcomes and yields its next batch

`complete` receives `Attempt`s and returns one `Reply` per attempt, in order. It renders the prompt
(`RoleBook.messages(call.role, call.inputs)`), takes the sampling of that attempt from `attempt_sampling` (the
paper's temperature 0.6, a new seed per retry, the role's grammar when the engine decodes under one), and calls
the engine; the job's request cache makes a re-run free. `run_record` turns a DocumentRun into plain JSON for the
run store (every stage, paragraph, window and call).

Pure: no ray, vllm, deepspeed or torch; `complete` is the only door to a model.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass

from eval.agentsimp.grammar import role_grammar
from eval.agentsimp.outputs import Reply, RoleOutcome, retry_sampling, settle
from eval.agentsimp.plan import DocumentRun, RoleCall, Schedule

# §4.2 / Appendix B: "We set the temperature parameter to 0.6 for all models"
PAPER_TEMPERATURE = 0.6


@dataclass(frozen=True)
class Attempt:
    """One try at a call: `number` 0 is the first, 1.. the retries (the seed of attempt n differs)."""

    call: RoleCall
    number: int


Complete = Callable[[Sequence[Attempt]], Sequence[Reply]]


def resolve_calls(calls: Sequence[RoleCall], complete: Complete, max_retries: int) -> dict[str, RoleOutcome]:
    """Settle `calls` (duplicates by key made once), retrying failed answers in later batches.

    Returns:
        key -> RoleOutcome for every distinct call.

    Raises:
        ValueError: `complete` returned another number of replies than it was given attempts (a driver bug).
    """
    unique = list({call.key: call for call in calls}.values())
    replies: dict[str, list[Reply]] = {call.key: [] for call in unique}
    settled: dict[str, RoleOutcome] = {}
    pending = unique
    while pending:
        batch = [Attempt(call, len(replies[call.key])) for call in pending]
        answers = list(complete(batch))
        if len(answers) != len(batch):
            raise ValueError(f"complete() returned {len(answers)} replies for {len(batch)} attempts")
        still = []
        for call, reply in zip(pending, answers):
            replies[call.key].append(reply)
            outcome = settle(call.role, replies[call.key], call.fallback, max_retries, call.expect_paragraphs,
                             call.min_ratio)
            if outcome is None:
                still.append(call)
            else:
                settled[call.key] = outcome
        pending = still
    return settled


def run_schedules(schedules: Mapping[Hashable, Schedule], complete: Complete, max_retries: int = 2,
                  outcomes: dict[str, RoleOutcome] | None = None) -> dict[Hashable, DocumentRun]:
    """Run every schedule to its end; identical calls (same key) are made once across all of them.

    Args:
        schedules: name -> a fresh `plan_document` generator (names are the caller's: config, (doc, config), ...).
        complete: the completion function (module docstring).
        max_retries: retries of an invalid answer before the stage falls back.
        outcomes: a dict to collect key -> outcome of every distinct call in (pass {} to count them); calls
            already in it are not made again.

    Returns:
        name -> DocumentRun, in the order of `schedules`.
    """
    outcomes = {} if outcomes is None else outcomes
    waiting: dict[Hashable, tuple[RoleCall, ...]] = {}
    done: dict[Hashable, DocumentRun] = {}
    for name, schedule in schedules.items():
        _advance(name, schedule, None, waiting, done)
    while waiting:
        new = [call for batch in waiting.values() for call in batch if call.key not in outcomes]
        outcomes.update(resolve_calls(new, complete, max_retries))
        for name in list(waiting):
            answers = {call.key: outcomes[call.key] for call in waiting.pop(name)}
            _advance(name, schedules[name], answers, waiting, done)
    return {name: done[name] for name in schedules}


def _advance(name, schedule: Schedule, answers, waiting: dict, done: dict) -> None:
    try:
        waiting[name] = next(schedule) if answers is None else schedule.send(answers)
    except StopIteration as stop:
        done[name] = stop.value


def run_schedule(schedule: Schedule, complete: Complete, max_retries: int = 2) -> DocumentRun:
    """One schedule alone (e.g. `quorum simplify-doc` on one configuration)."""
    return run_schedules({"run": schedule}, complete, max_retries)["run"]


def attempt_sampling(attempt: Attempt, max_tokens: int | Mapping[str, int], temperature: float = PAPER_TEMPERATURE,
                     seed: int = 0, constrained: bool = True) -> dict:
    """Sampling fields of one attempt (the keyword arguments of `actors.engines.base.SamplingParams`).

    Args:
        attempt: The attempt (its number picks the retry's seed and temperature).
        max_tokens: Completion tokens, one number or role id -> number (document-level roles need more).
        temperature: Of the first attempt (retries run at least at 0.7).
        seed: Of the first attempt (retry n uses seed + n).
        constrained: Decode a JSON role under its grammar (`eval.agentsimp.grammar`); free-text roles never are.

    >>> call = RoleCall("simplify_supervisor", (("guidelines", "G"), ("simplified_paragraph", "P")), None)
    >>> s = attempt_sampling(Attempt(call, 1), {"simplify_supervisor": 128}, seed=5)
    >>> (s["temperature"], s["seed"], s["max_tokens"], s["grammar"].startswith('start: "{" f0'))
    (0.7, 6, 128, True)
    """
    role = attempt.call.role
    tokens = max_tokens if isinstance(max_tokens, int) else max_tokens[role]
    t, s = retry_sampling(temperature, seed, attempt.number)
    return {"temperature": t, "seed": s, "max_tokens": tokens,
            "grammar": role_grammar(role, tokens) if constrained else ""}


def call_record(call: RoleCall, outcome: RoleOutcome) -> dict:
    """One call and its outcome as plain JSON-able data (an entry of a run record's "calls")."""
    return {"role": call.role, "unit": call.unit, "step": call.step, "key": call.key, "inputs": dict(call.inputs),
            "value": asdict(outcome.value), "attempts": outcome.attempts, "errors": list(outcome.errors),
            "fell_back": outcome.fell_back, "raws": list(outcome.raws), "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens, "seconds": outcome.seconds, "cached": outcome.cached,
            "guard": outcome.guard}


def run_record(run: DocumentRun) -> dict:
    """A DocumentRun as plain JSON-able data: config, guideline, outline, stages, paragraphs, windows and calls."""
    calls = [call_record(call, outcome) for call, outcome in run.calls]
    return {
        "config": run.config.name, "label": run.config.label, "settings": asdict(run.config),
        "guideline": run.guideline, "outline": asdict(run.outline) if run.outline else None,
        "stages": dict(run.stages), "final": run.final,
        "paragraphs": [{"index": p.index, "original": p.original, "stages": dict(p.stages), "notes": dict(p.notes),
                        "final": p.final} for p in run.paragraphs],
        "windows": [asdict(w) for w in run.windows],
        "calls": calls,
    }
