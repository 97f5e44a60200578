"""One GRPO step's rollouts and rewards, overlapped: each group goes to the judge the moment its rollouts exist.

    got = rollout_and_reward(generate, decode, reward, rows, prompts, group_size=8, per_call=2, overlap=True)
    got.completions, got.finished, got.texts, got.outcomes    # group-major, as one big generate would give them
    got.generate_s, got.reward_wait_s, got.reward_span_s

The worker's prompts are generated `per_call` at a time (`rollout.prompts_per_generate`; 0 = all in one call).
With `overlap` (``reward.overlap``, the default) the groups of a call are sent to the reward callable's `submit`
as soon as that call returns, so the judge scores them while the next call generates; the step then waits only
for the answers still missing after its last rollout. Without it every group is sent after the last call, the
strict generate -> reward order. Both send the same rollouts and read the same answers in prompt order, so the
outcomes, the advantages and the update are the same; only the clock differs (tests/test_grpo_overlap.py).

Timings: `generate_s` is the time spent generating (and sending), `reward_wait_s` the time the step is blocked on
rewards after its last rollout (the reward *phase*: generate + reward wait + update add up to the step), and
`reward_span_s` the wall time from the first request sent to the last answer (the judge's share of the step,
partly hidden behind generation when overlapped).

`rollout_and_reward` is `start_rollouts` (generate, sending each call's groups) then `collect_rewards` (wait for
the answers still missing); between the two the worker may generate the next step's rollouts
(``rollout.max_staleness: 1``, `train.grpo.staleness`).

Pure: no ray, no torch; `generate`, `decode` and `reward` are the caller's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from train.grpo.batch import GroupOutcome

# generate(prompts of one call, index of its first prompt in the step) -> (completion ids, finished), group-major
Generate = Callable[[list[list[int]], int], tuple[list[list[int]], list[bool]]]


@dataclasses.dataclass
class StepRollouts:
    completions: list[list[int]]
    finished: list[bool]
    texts: list[str]
    outcomes: list[GroupOutcome]
    generate_s: float
    reward_wait_s: float
    reward_span_s: float

    @property
    def reward_hidden_s(self) -> float:
        """Seconds of judging that ran while rollouts were being generated."""
        return max(self.reward_span_s - self.reward_wait_s, 0.0)


def generation_calls(n_prompts: int, per_call: int) -> list[slice]:
    """The prompt slices generated in one call each; `per_call` 0 = all prompts in one call.

    >>> generation_calls(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    >>> generation_calls(3, 0)
    [slice(0, 3, None)]
    """
    if per_call < 0:
        raise ValueError(f"prompts per generate call must be >= 0, got {per_call}")
    size = per_call or max(n_prompts, 1)
    return [slice(i, min(i + size, n_prompts)) for i in range(0, n_prompts, size)]


def reward_overlaps(reward) -> bool:
    """Whether a reward callable's config asks for overlap (``reward.overlap``; a local reward has no such key
    and no latency to hide)."""
    return bool(getattr(getattr(reward, "cfg", None), "overlap", False))


def submit_groups(reward, rows: list[dict], groups: list[list[str]]) -> list[Future]:
    """Send `groups` without waiting: the callable's own `submit` where it has one (a served reward's thread
    pool), else a future completed here (a local reward costs no wait worth hiding)."""
    if hasattr(reward, "submit"):
        return reward.submit(rows, groups)
    done: list[Future] = []
    for outcome in reward(rows, groups):
        future: Future = Future()
        future.set_result(outcome)
        done.append(future)
    return done


@dataclasses.dataclass
class InFlight:
    """A step's rollouts, all generated, with their groups' reward requests sent (overlap) or not yet (strict).

    `collect_rewards` turns it into a `StepRollouts`; in between the worker may do other work (generate the next
    step's rollouts: `train.grpo.staleness`) while the judge scores these groups.
    """

    rows: list[dict]
    group_size: int
    completions: list[list[int]]
    finished: list[bool]
    texts: list[str]
    futures: list[Future]  # one per group when overlapped; empty when the groups are still to be sent
    generate_s: float
    generated_at: float
    sent_at: float | None
    last_answer: list[float]
    lock: threading.Lock

    @property
    def generated_tokens(self) -> int:
        return sum(len(c) for c in self.completions)


def start_rollouts(generate: Generate, decode: Callable[[list[list[int]]], list[str]], reward, rows: list[dict],
                   prompts: list[list[int]], group_size: int, per_call: int, overlap: bool,
                   clock: Callable[[], float] = time.perf_counter) -> InFlight:
    """Generate the step's rollouts call by call; with `overlap` each call's groups are sent as it returns."""
    completions: list[list[int]] = []
    finished: list[bool] = []
    texts: list[str] = []
    futures: list[Future] = []
    first_sent: list[float] = []
    last_answer = [0.0]
    lock = threading.Lock()

    def answered(_: Future) -> None:
        with lock:
            last_answer[0] = max(last_answer[0], clock())

    began = clock()
    for part in generation_calls(len(prompts), per_call):
        ids, done = generate(prompts[part], part.start)
        if len(ids) != (part.stop - part.start) * group_size:
            raise RuntimeError(f"rollout engine returned {len(ids)} completions for {part.stop - part.start} "
                               f"prompts x {group_size}")
        completions += ids
        finished += done
        call_texts = decode(ids)
        texts += call_texts
        if overlap:
            groups = [call_texts[g * group_size:(g + 1) * group_size] for g in range(part.stop - part.start)]
            if not first_sent:
                first_sent.append(clock())
            sent = submit_groups(reward, rows[part], groups)
            for future in sent:
                future.add_done_callback(answered)
            futures += sent
    generated = clock()
    return InFlight(rows, group_size, completions, finished, texts, futures, generate_s=generated - began,
                    generated_at=generated, sent_at=first_sent[0] if first_sent else None, last_answer=last_answer,
                    lock=lock)


def collect_rewards(flight: InFlight, reward, clock: Callable[[], float] = time.perf_counter) -> StepRollouts:
    """Wait for every group's answer (strict: send them all now and wait); the outcomes in prompt order."""
    began = clock()
    # answers still missing now end the span when the step has them (a done-callback may run after result())
    pending = any(not future.done() for future in flight.futures)
    if flight.futures:
        outcomes = [future.result() for future in flight.futures]
    else:
        size = flight.group_size
        groups = [flight.texts[g * size:(g + 1) * size] for g in range(len(flight.rows))]
        outcomes = reward(flight.rows, groups)
    waited = clock()
    sent_at = flight.sent_at if flight.sent_at is not None else began
    with flight.lock:
        span_end = max(flight.last_answer[0], sent_at) if flight.futures and not pending else waited
    return StepRollouts(flight.completions, flight.finished, flight.texts, list(outcomes),
                        generate_s=flight.generate_s, reward_wait_s=waited - began, reward_span_s=span_end - sent_at)


def rollout_and_reward(generate: Generate, decode: Callable[[list[list[int]]], list[str]], reward,
                       rows: list[dict], prompts: list[list[int]], group_size: int, per_call: int, overlap: bool,
                       clock: Callable[[], float] = time.perf_counter) -> StepRollouts:
    """Generate the step's rollouts call by call and reward every group (see the module docstring)."""
    flight = start_rollouts(generate, decode, reward, rows, prompts, group_size, per_call, overlap, clock)
    return collect_rewards(flight, reward, clock)
