"""The reward-hacking monitors (`eval.reward_monitors`) inside the GRPO worker loop (`train.grpo.loop`).

The job puts a ``monitor`` entry in the reward spec (policy GRPO against the served judge: `jobs.policy.grpo`):

    {"kind": "grm", "config": {...}, "monitor": {"config": asdict(MonitorConfig), "markers": JudgeMarkers.to_dict(),
                                                 "alerts_path": "<run dir>/monitor_alerts.jsonl"}}

Every `monitor.every` steps each worker turns its step's samples (rollout token counts, rewards, and the judge's
per-order grades of every pairwise judgment) into `step_sums`, the sums are all-reduced (a collective: every rank
calls it at the same steps), and every rank updates the same monitor state from the same totals. Validation adds
the answer lengths of the policy and the base model and the win rate. Rank 0 logs the ``monitor/*`` metrics with
the step's, and for each newly crossed threshold writes a log warning, a W&B alert and a line of
``alerts_path`` (the job copies those lines into the run manifest), and keeps the run's reference values in
``monitor_anchors.json`` beside it for a restarted worker group.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

from eval.monitor_config import MonitorConfig
from eval.reward_monitors import Alert, JudgeMarkers, RewardMonitors, probe_accuracy, step_sums

log = logging.getLogger("quorum.grpo.monitor")
Metrics = dict[str, float]


class LoopMonitors:
    """One worker's monitors; `build` returns None when the reward spec carries none (or they are switched off)."""

    def __init__(self, spec: dict, rank: int, tracker=None):
        markers = JudgeMarkers.from_dict(spec["markers"]) if spec.get("markers") else None
        self.monitors = RewardMonitors(MonitorConfig(**spec.get("config", {})), markers)
        self.alerts_path = spec.get("alerts_path", "")
        self.rank, self.tracker = rank, tracker
        # a worker group restarted by Ray Train resumes from a checkpoint of a trained policy: the base rollout
        # length and the first probe accuracy come back from the attempt that measured them
        self.anchors_path = str(Path(self.alerts_path).with_name("monitor_anchors.json")) if self.alerts_path else ""
        if self.anchors_path and Path(self.anchors_path).is_file():
            self.monitors.restore(json.loads(Path(self.anchors_path).read_text(encoding="utf-8")))
        self._saved = self.monitors.anchors()
        # rank 0's probe set (monitor.probe_path), judged by the run's reward service; None = no probe
        self.probe: ProbeSet | None = None

    @classmethod
    def build(cls, reward_spec: dict, rank: int, tracker=None) -> LoopMonitors | None:
        spec = reward_spec.get("monitor")
        if not spec or not spec.get("config", {}).get("enabled", True):
            return None
        monitors = cls(spec, rank, tracker)
        if spec.get("probe") and rank == 0:
            monitors.probe = ProbeSet(spec["probe"], reward_spec)
        return monitors

    def step(self, step: int, samples: list[dict], metrics: Metrics, reduce_sums: Callable) -> Metrics:
        """This step's ``monitor/*`` metrics (empty between monitored steps)."""
        if not self.monitors.due(step):
            return {}
        groups, verdicts = sample_groups(samples)
        sums = reduce_sums(step_sums(groups, verdicts, [s["completion"] for s in samples], self.monitors.markers))
        # the judge's mean own grade where the reward has one: a margin reward (reward.signal margin) sums to 0 in
        # every group, so its mean cannot rise whatever the policy learns
        out, alerts = self.monitors.step(step, sums, metrics.get("reward/grm_mean_grade", metrics.get("reward/mean")))
        if self.probe is not None:
            probe_metrics, probe_alerts = self.monitors.probe(step, self.probe.accuracy())
            out, alerts = out | probe_metrics | self.probe.counts(), alerts + probe_alerts
        self.raise_alerts(alerts)
        self._save_anchors()
        return out

    def validation(self, step: int, answers: list[dict], token_count: Callable[[str], int], metrics: Metrics,
                   reduce_sums: Callable) -> Metrics:
        """A validation's ``monitor/*`` metrics: answer lengths against the base model's (vs_baseline records hold
        both answers) and the reward-vs-win-rate divergence. Every rank calls it (a collective)."""
        paired = [a for a in answers if a.get("baseline_answer") is not None]
        sums = reduce_sums({"monitor_val_policy_tokens": float(sum(token_count(a["answer"]) for a in paired)),
                            "monitor_val_base_tokens": float(sum(token_count(a["baseline_answer"]) for a in paired)),
                            "monitor_val_answers": float(len(paired))})
        n = sums["monitor_val_answers"]
        policy = [sums["monitor_val_policy_tokens"] / n] if n else []
        base = [sums["monitor_val_base_tokens"] / n] if n else []
        out, alerts = self.monitors.validation(step, metrics.get("val/vs_baseline/score"), policy, base)
        self.raise_alerts(alerts)
        return out

    def _save_anchors(self) -> None:
        anchors = self.monitors.anchors()
        if self.rank != 0 or not self.anchors_path or anchors == self._saved:
            return
        path = Path(self.anchors_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(anchors), encoding="utf-8")
        os.replace(tmp, path)
        self._saved = anchors

    def raise_alerts(self, alerts: list[Alert]) -> None:
        if self.rank != 0:
            return
        for alert in alerts:
            record_alert(alert, self.tracker, self.alerts_path)


class ProbeSet:
    """The judge's accuracy on labelled pairs, measured through the run's own reward client config (the same
    service, the same replicas, Serve handle or HTTP) while the policy trains against it. Each pair is one
    `/reward/group` request of its two responses, all_pairs in both orders whatever `reward.scheme`; the judge
    prefers the response with the higher mean grade margin (equal: tie). A failed request counts as wrong."""

    def __init__(self, pairs: list[dict], reward_spec: dict):
        from train.grpo.reward.build import build_reward

        self.pairs = pairs
        self.reward = build_reward(reward_spec, seed=0)
        self.failed = 0

    def accuracy(self) -> float:
        rows = [dict(pair) for pair in self.pairs]
        calls = [self.reward._pool.submit(self.reward.client.score, row["judge_prompt"],
                                          [row["response_a"], row["response_b"]], scheme="all_pairs",
                                          both_orders=True, **self.reward._context(row)) for row in rows]
        predicted = [probe_verdict(call.result()) for call in calls]
        self.failed = sum(p is None for p in predicted)
        return probe_accuracy(predicted, [pair["gold"] for pair in self.pairs])

    def counts(self) -> Metrics:
        return {"monitor/probe/pairs": float(len(self.pairs)), "monitor/probe/failed": float(self.failed)}

    def close(self) -> None:
        self.reward.close()


def probe_verdict(outcome) -> str | None:
    """The preference of a two-response group outcome: "A", "B" or "tie" by mean grade margin; None = failed."""
    margins = outcome.components.get("grm_margin") if not outcome.error else None
    if not margins or len(margins) != 2:
        return None
    return "tie" if margins[0] == margins[1] else "A" if margins[0] > margins[1] else "B"


def record_alert(alert: Alert, run=None, alerts_path: str = "") -> None:
    """A log warning, a W&B alert on `run` (a wandb Run; offline runs keep it locally) and a line of
    `alerts_path`."""
    log.warning("reward-hacking monitor %s", alert.message)
    if run is not None:
        run.alert(title=f"quorum monitor: {alert.monitor}"[:63], text=alert.message, level="WARN")
    if alerts_path:
        Path(alerts_path).parent.mkdir(parents=True, exist_ok=True)
        with open(alerts_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(alert.as_dict()) + "\n")


def read_alerts(alerts_path: str | Path) -> list[dict]:
    path = Path(alerts_path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def sample_groups(samples: list[dict]) -> tuple[list[tuple[list[int], list[float]]], list[tuple]]:
    """(token counts, rewards) of each scored group and the pairwise verdicts of every group, from `grpo_step`'s
    samples (``group``, ``tokens``, ``reward``, ``error``; ``verdicts`` on each group's first rollout)."""
    by_group: dict[int, list[dict]] = {}
    for sample in samples:
        by_group.setdefault(sample["group"], []).append(sample)
    groups, verdicts = [], []
    for members in by_group.values():
        verdicts += [tuple(v) for m in members for v in m.get("verdicts", ())]
        rewards = [m["reward"] for m in members]
        if all(not m["error"] and rewards[i] is not None and math.isfinite(rewards[i])
               for i, m in enumerate(members)):
            groups.append(([m["tokens"] for m in members], rewards))
    return groups, verdicts
