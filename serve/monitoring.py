"""Reward-hacking monitors on the service side: per caller, the statistics quorum's own GRPO loop computes on its
workers (`eval.reward_monitors`), computed here from the rewards this replica returned, so a TRL, OpenRLHF or verl
run gets the same alerts without quorum's trainer.

A request names its caller (`caller: {name, step}` in the body of `/reward/group` and `/score`; the `caller` query
parameter of `/openrlhf`); requests without one are judged and never recorded. Per caller the replica keeps:

- the **open step**: every rollout of that step, grouped by prompt (a `/reward/group` request is a group; OpenRLHF's
  one-rollout posts are grouped by their prompt), with its length in words, its reward, and whether it quotes the
  judge's prompt; every pairwise verdict (first slot's grade, second slot's grade);
- the **monitors** (`RewardMonitors`): when a request for a later step arrives, the open step is closed and its sums
  go through the same `step_sums` / `RewardMonitors.step` as a quorum trainer's step. A caller that sends no step
  (OpenRLHF) gets one closed every `monitor.step_rollouts` rollouts. With `monitor.probe_path`, each monitored step
  is followed by the judge's accuracy on the probe pairs (`probe_pairs`, judged by the replica itself, both orders:
  `serve.app`), which feeds `RewardMonitors.probe` as a trainer's probe does;
- its **record**: the last `monitor.record_groups` groups as returned (step, rewards), which `/stats` shows so a
  trainer's logged rewards can be checked against what the service answered, and the counts of null rewards and
  failed judgments.

Length is counted in words (whitespace-split): the service has no policy tokenizer. Each replica keeps its own
callers (a caller spread over several replicas is monitored per replica, in `/stats` of each); the divergence
monitor needs the trainer's validations and is not computed here.

Pure: no ray, no torch.
"""

from __future__ import annotations

import collections
import dataclasses
import math

from core.config import dotted, positive, require_file
from eval.judging.menlo_data import read_menlo_jsonl, render_criteria
from eval.monitor_config import MonitorConfig, MonitorThresholds
from eval.reward_monitors import (
    Alert,
    JudgeMarkers,
    RewardMonitors,
    gold_preference,
    judge_markers,
    probe_accuracy,
    step_sums,
)


@dataclasses.dataclass
class ServiceMonitorConfig(MonitorThresholds):
    """The `monitor:` section of the reward service: quorum's GRPO monitors (docs/monitors.md) applied per caller,
    with the thresholds and windows of policy-grpo's `monitor:` keys (`MonitorThresholds`), plus how the service
    forms steps and keeps its record."""

    enabled: bool = True  # record and monitor the requests that name a caller; false = none is recorded
    # monitor a caller's first step and every this many of its steps (the step numbers it sends)
    every: int = 1
    # labelled pairs (MENLO jsonl: prompt, response_a, response_b, gold_a, gold_b, dimension, locale) the replica
    # judges after each monitored step of a caller, both orders, through its own judge and cache; "" = no probe
    probe_path: str = ""
    # at most this many pairs of probe_path, the first ones (each costs two judge calls unless cached)
    probe_limit: int = 64
    # rollouts that close a step of a caller sending no step number (OpenRLHF posts one rollout per request)
    step_rollouts: int = 64
    # groups of each caller kept in its record (/stats `callers.NAME.record`: step and rewards as returned)
    record_groups: int = 64
    # callers tracked at once per replica; past it the least recently seen caller is dropped
    max_callers: int = 32

    def thresholds(self) -> MonitorConfig:
        """The trainer-side config with this section's thresholds and windows (`eval.monitor_config`)."""
        shared = {f.name for f in dataclasses.fields(MonitorConfig)}
        return MonitorConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in shared})

    def check(self, where: str = "") -> None:
        super().check(where)
        for name in ("every", "probe_limit", "step_rollouts", "record_groups", "max_callers"):
            positive(getattr(self, name), dotted(where, name))
        if self.probe_path:
            require_file(self.probe_path, dotted(where, "probe_path"))


class CallerMonitor:
    """One caller's open step, monitors, alerts and record (see the module docstring)."""

    def __init__(self, name: str, cfg: ServiceMonitorConfig, markers: JudgeMarkers | None):
        self.name, self.cfg, self.markers = name, cfg, markers
        self.monitors = RewardMonitors(cfg.thresholds(), markers)
        self.record: collections.deque = collections.deque(maxlen=cfg.record_groups)
        self.metrics: dict[str, float] = {}
        self.alerts: list[Alert] = []
        self.counts = collections.Counter()
        self.open_step: int | None = None
        self.last_monitored: int | None = None
        self._auto_step = 0
        self._reset_open()

    def _reset_open(self) -> None:
        self._groups: dict[str, tuple[list[int], list[float]]] = {}
        self._verdicts: list[tuple[int, int]] = []
        self._rollouts = 0
        self._quoting = 0
        self._rewards: list[float] = []

    def add(self, step: int | None, prompt: str, texts: list[str], rewards: list[float | None],
            verdicts: list[tuple[int, int]] = (), failed_judgments: int = 0) -> None:
        """One judged group (or one rollout of a group formed by `prompt`) as returned to the caller."""
        auto = step is None
        if auto:
            step = self._auto_step
        if self.open_step is None:
            self.open_step = step
        elif step > self.open_step:
            self.close()
            self.open_step = step
        elif step < self.open_step:
            self.counts["late_groups"] += 1  # a straggler of an earlier step: counted into the open one
        lengths, kept = self._groups.setdefault(prompt, ([], []))
        for text, reward in zip(texts, rewards):
            if reward is not None and math.isfinite(reward):
                lengths.append(len(text.split()))
                kept.append(float(reward))
                self._rewards.append(float(reward))
        if self.markers is not None:
            self._quoting += sum(self.markers.quotes(t) for t in texts)
        self._rollouts += len(texts)
        self._verdicts += list(verdicts)
        self.record.append({"step": step, "rewards": list(rewards)})
        self.counts["groups"] += 1
        self.counts["rollouts"] += len(texts)
        self.counts["null_rewards"] += sum(r is None for r in rewards)
        self.counts["failed_judgments"] += failed_judgments
        if auto and self._rollouts >= self.cfg.step_rollouts:
            self.close()
            self._auto_step += 1
            self.open_step = None

    def close(self) -> list[Alert]:
        """Close the open step: its sums through the monitors (when the step is due); returns new alerts."""
        step, new = self.open_step, []
        if step is not None and self._rollouts and self.monitors.due(step):
            sums = step_sums([g for g in self._groups.values() if g[0]], self._verdicts, [], None)
            sums["monitor_rollouts"] = float(self._rollouts)
            sums["monitor_quoting"] = float(self._quoting)
            mean = sum(self._rewards) / len(self._rewards) if self._rewards else None
            metrics, new = self.monitors.step(step, sums, mean)
            self.metrics.update(metrics)
            self.alerts += new
            self.counts["steps_monitored"] += 1
            self.last_monitored = step
        if step is not None:
            self.counts["steps_closed"] += 1
        self._reset_open()
        return new

    def stats(self) -> dict:
        return {"open_step": self.open_step, **dict(self.counts), "metrics": dict(self.metrics),
                "alerts": [a.as_dict() for a in self.alerts], "record": list(self.record)}


class CallerLedger:
    """Every caller of one replica: `add` records a judged group, `stats` is `/stats`'s `callers`."""

    def __init__(self):
        self.cfg: ServiceMonitorConfig | None = None
        self.markers: JudgeMarkers | None = None
        self.callers: collections.OrderedDict[str, CallerMonitor] = collections.OrderedDict()
        self.new_metrics: list[tuple[str, int, dict]] = []

    def configure(self, cfg: ServiceMonitorConfig, markers: JudgeMarkers | None) -> None:
        """New thresholds or a new judge template: callers start afresh when either changed."""
        if cfg != self.cfg or markers != self.markers:
            self.callers.clear()
        self.cfg, self.markers = cfg, markers

    def add(self, caller: str | None, step: int | None, prompt: str, texts: list[str],
            rewards: list[float | None], verdicts: list[tuple[int, int]] = (), failed_judgments: int = 0) -> None:
        if caller is None or self.cfg is None or not self.cfg.enabled:
            return
        monitor = self.callers.get(caller)
        if monitor is None:
            monitor = self.callers[caller] = CallerMonitor(caller, self.cfg, self.markers)
            while len(self.callers) > self.cfg.max_callers:
                self.callers.popitem(last=False)
        self.callers.move_to_end(caller)
        before = monitor.counts["steps_monitored"]
        monitor.add(step, prompt, texts, rewards, verdicts, failed_judgments)
        if monitor.counts["steps_monitored"] != before:
            self.new_metrics.append((caller, monitor.last_monitored, dict(monitor.metrics)))

    def stats(self) -> dict:
        return {name: monitor.stats() for name, monitor in self.callers.items()}

    def take_metrics(self) -> list[tuple[str, int, dict]]:
        """The (caller, step, monitor/* metrics) of the steps closed since the last call (for W&B)."""
        out, self.new_metrics = self.new_metrics, []
        return out



def served_markers(prompts, n: int) -> JudgeMarkers:
    """What a rollout quoting this service's judge would contain: the served templates (pointwise, pairwise,
    listwise) with their output tags and keywords, and the rubrics' definitions, questions and criteria (as
    `jobs.policy.grpo.judge_markers_of` for quorum's own runs). `prompts` is a `serve.judge_prompts.JudgePrompts`."""
    templates = [t for t in (prompts.pointwise, prompts.pairwise, prompts.listwise) if t is not None]
    text = "\n".join(m["content"] for t in templates for m in t.messages)
    rubric_texts = []
    for rubric in prompts.rubrics.values():
        rubric_texts += [rubric.get("definition", ""), rubric.get("question", ""), render_criteria(rubric, True)]
    return judge_markers(text, rubric_texts, n)


def probe_pairs(cfg: ServiceMonitorConfig) -> list[dict]:
    """The first `probe_limit` pairs of `probe_path` (MENLO jsonl) with their gold preference; [] without one."""
    if not cfg.probe_path:
        return []
    rows = read_menlo_jsonl(cfg.probe_path).head(cfg.probe_limit).to_dict("records")
    return [{"prompt": r["prompt"], "response_a": r["response_a"], "response_b": r["response_b"],
             "dimension": r["dimension"], "locale": r["locale"],
             "gold": gold_preference(int(r["gold_a"]), int(r["gold_b"]))} for r in rows]


def probe_step(monitor: CallerMonitor, step: int, predicted: list[str | None], gold: list[str]) -> dict:
    """One probe measurement for a caller's monitored step: the monitors' probe metrics (alerts kept on the caller)
    and the probe counts, as a trainer logs them."""
    metrics, alerts = monitor.monitors.probe(step, probe_accuracy(predicted, gold))
    metrics |= {"monitor/probe/pairs": float(len(gold)), "monitor/probe/failed": float(sum(p is None for p in predicted))}
    monitor.metrics.update(metrics)
    monitor.alerts += alerts
    return metrics
