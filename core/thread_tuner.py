"""Torch's intra-op thread count chosen by timing decode steps, so that it follows the machine's load.

Why: every OpenMP parallel region ends at a barrier. On 2 cores beside one busy process, a decode step on 2 threads
runs at the speed of the thread that shares its core with the competitor (bench.generate --contention 1: 0.21 to
0.28 of idle, a fair share being 0.5), while 1 thread keeps a core to itself. On an idle machine 2 threads win. No
fixed count is right for both, and which load a laptop or CI runner has is known only by measuring.

How (pure logic; `actors.engines.hf.decode` times the steps and applies the choice):

- candidates: the assigned maximum n, ceil(n / 2) and 1, distinct (`candidate_threads`); start at n;
- exploit the current count; every `interval` steps run one step at an alternative (round robin) — a probe;
- compare a probe with its neighbours: its time / the mean of the steps just before and after it at the current
  count. The batch changes by a row now and then and its context by one token a step, so adjacent steps do the
  same work; a probe whose neighbours had another row count is dropped, not compared;
- smooth each alternative's ratio (exponential, from a neutral 1.0, capped at 1 + 2 `margin`) and switch when it is
  below 1 - `margin`: after a switch or a change of load one clearly faster probe (ratio < 0.7 with the defaults)
  switches at once, otherwise two do; a marginal win needs several;
- a probe that clearly loses doubles `interval` (up to `max_probe_every`), so the idle cost of probing falls
  towards (slowdown of the probe) / `max_probe_every`;
- load changes: a step at the current count more than `change` times slower or faster than the smoothed time of
  earlier steps over as many rows means the load moved: comparisons are forgotten and probing restarts at
  `probe_every`. (Per row count: the short batches at the end of a call, or the full one at the start of the
  next, are not a change of load.) The way back (a competitor leaves while 1 thread runs: its steps do not get
  faster) is found by the periodic probes.

Steps are timed by the caller, so tests script them (tests/test_thread_tuner.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def candidate_threads(max_threads: int) -> tuple[int, ...]:
    """Thread counts worth trying below an assigned maximum, largest first.

    >>> candidate_threads(2), candidate_threads(3), candidate_threads(8), candidate_threads(1)
    ((2, 1), (3, 2, 1), (8, 4, 1), (1,))
    """
    return tuple(sorted({max_threads, -(-max_threads // 2), 1}, reverse=True))


def mean_threads(steps: dict[int, int]) -> float:
    """Mean thread count over steps, from {threads: steps run}; 0.0 when nothing ran.

    >>> mean_threads({2: 30, 1: 10})
    1.75
    """
    total = sum(steps.values())
    return sum(threads * count for threads, count in steps.items()) / total if total else 0.0


@dataclass
class _Probe:
    threads: int
    seconds: float
    rows: int
    # (seconds, rows) of the step at the current count just before the probe
    before: tuple[float, int]


@dataclass
class ThreadTuner:
    """Picks the thread count of each step from the times of earlier ones. See module docstring.

    Call `next_threads(rows)` before a step, run it on that many threads, then `record(threads, seconds, rows)`.
    `new_sequence()` between unrelated runs (a new call): a probe is never compared across them.
    """

    max_threads: int
    # steps at the current count between probes, right after a switch or a change of load
    probe_every: int = 16
    # the longest gap between probes once probes keep losing
    max_probe_every: int = 64
    # an alternative must be this much faster (smoothed time ratio below 1 - margin) to be switched to
    margin: float = 0.15
    # weight of a new ratio (or step time) in its smoothed value
    weight: float = 0.5
    # a current-count step this many times slower or faster than earlier ones over as many rows: the load changed
    change: float = 1.5
    current: int = field(init=False)
    interval: int = field(init=False)
    switches: int = field(init=False, default=0)
    # smoothed probe / neighbours time ratio per alternative, since the last switch or load change
    ratios: dict[int, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_threads < 1:
            raise ValueError(f"ThreadTuner.max_threads: must be >= 1, got {self.max_threads}")
        if not 2 <= self.probe_every <= self.max_probe_every:
            raise ValueError(f"ThreadTuner: need 2 <= probe_every <= max_probe_every, got {self.probe_every}, "
                             f"{self.max_probe_every}")
        if not (0 < self.margin < 1 and 0 < self.weight <= 1 and self.change > 1):
            raise ValueError("ThreadTuner: need 0 < margin < 1, 0 < weight <= 1 and change > 1")
        self.candidates = candidate_threads(self.max_threads)
        self.current = self.candidates[0]
        self.interval = self.probe_every
        self._since_probe = 0
        self._turn = 0
        self._before: tuple[float, int] | None = None
        self._probe: _Probe | None = None
        # smoothed seconds of a current-count step, per batch row count
        self._levels: dict[int, float] = {}

    @property
    def alternatives(self) -> tuple[int, ...]:
        return tuple(c for c in self.candidates if c != self.current)

    def next_threads(self, rows: int) -> int:
        """The thread count for the next step over `rows` rows: the current one, or an alternative when a probe is
        due (and the step before had as many rows: else the probe could not be compared)."""
        alternatives = self.alternatives
        due = self._since_probe >= self.interval and self._probe is None
        due = due and self._before is not None and self._before[1] == rows
        return alternatives[self._turn % len(alternatives)] if alternatives and due else self.current

    def record(self, threads: int, seconds: float, rows: int) -> None:
        """Take the wall time of a step that ran on `threads` threads over a batch of `rows` rows."""
        if threads != self.current:
            self._probe = _Probe(threads, seconds, rows, self._before) if self._before else None
            self._since_probe = 0
            self._turn += 1
            return
        self._since_probe += 1
        self._track_level(seconds, rows)
        probe, self._probe = self._probe, None
        self._before = (seconds, rows)
        if probe is not None:
            self._compare(probe, seconds, rows)

    def new_sequence(self) -> None:
        """Forget the neighbouring steps (not the learned choice): the next step starts an unrelated run."""
        self._before = None
        self._probe = None

    def _compare(self, probe: _Probe, after: float, rows: int) -> None:
        before, before_rows = probe.before
        if not before_rows == probe.rows == rows:
            return  # the batch changed around the probe: not the same work
        ratio = probe.seconds / ((before + after) / 2)
        old = self.ratios.get(probe.threads, 1.0)
        # capped: however long an alternative kept losing, two clear wins in a row switch to it (load can change
        # without the current count's steps showing it, e.g. 1 thread beside a competitor that leaves)
        smoothed = min(old + self.weight * (ratio - old), 1 + 2 * self.margin)
        self.ratios[probe.threads] = smoothed
        if smoothed < 1 - self.margin:
            self._switch(probe.threads)
        elif smoothed > 1 + self.margin:
            self.interval = min(2 * self.interval, self.max_probe_every)

    def _switch(self, threads: int) -> None:
        self.current = threads
        self.switches += 1
        self._restart()
        self._before = None  # the last step ran on the old count: no neighbour for the new one

    def _track_level(self, seconds: float, rows: int) -> None:
        level = self._levels.get(rows)
        if level is not None and (seconds > self.change * level or seconds * self.change < level):
            self._restart()
            level = None
        self._levels[rows] = seconds if level is None else level + self.weight * (seconds - level)

    def _restart(self) -> None:
        """Probe often again and compare afresh: what was measured before no longer holds."""
        self.ratios = {}
        self.interval = self.probe_every
        self._levels = {}
