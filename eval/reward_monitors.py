"""Reward-hacking monitors for GRPO against an LLM judge: the signals that a policy is learning what the judge pays
for (length, the first slot, the judge's own words, its family's style) rather than what it should.

    monitors = RewardMonitors(MonitorConfig(), markers=judge_markers(template_text, rubric_texts))
    sums = step_sums(groups, verdicts, texts, monitors.markers)   # per worker; plain sums, all-reducible
    metrics, alerts = monitors.step(step, sums, reward_mean)      # monitor/* metrics, crossed thresholds
    metrics, alerts = monitors.validation(step, win_rate, policy_lengths, base_lengths)

Monitors (each alert names the `monitor.*` key of its threshold; thresholds and windows: `eval.monitor_config`):

- **length drift**: within-group correlation of reward with response length (Pearson and Spearman, one per group,
  averaged over the groups of a step, then over the last `length_corr_window` monitored steps), the rollouts'
  mean length against step 1's (the base policy's rollouts, sampled before the first update), and on
  validation prompts the policy's mean answer length against the base model's;
- **position preference**: the share of pairwise verdicts that favour the slot shown first (ties count half),
  pooled over the last `position_window` monitored steps. The group reward alternates positions, so a judge that
  reads the answers gives about 0.5 whatever the policy does; a share far from 0.5 says how much of the reward is
  position (either slot: a second-slot bias is a bias too);
- **format gaming**: the share of rollouts that quote the judge's output tags, its output keywords (``FINAL
  GRADE:``) or any `format_ngram` consecutive words of its prompt and rubric, pooled over `format_window` steps;
- **reward vs validation divergence**: over the last `divergence_evals` validations, the mean training reward
  rose by at least `divergence_reward_rise` while the win rate against the base policy rose by no more than
  `divergence_winrate_rise`;
- **judge accuracy on a probe set**: accuracy of the judge's preferences on gold-labelled pairs, alerting when it
  falls more than `probe_accuracy_drop_max` below the first measurement;
- **same family** (`train.grpo.reward.same_family`): policy and judge share a base model or a tokenizer (self-preference), a
  warning at start.

An alert fires when its monitor crosses the threshold and again only after the signal has gone back under it, so
a run that stays gamed raises one alert per monitor, not one per step; ``monitor/<name>/alert`` is 1 while it
holds. Windowed monitors fire only once their window is full: one early step is noise.

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import deque

from eval.monitor_config import MonitorConfig

# reasoning models write <think> themselves; quoting it is no sign of reading the judge's prompt
NATIVE_TAGS = ("think",)
_TAG_RE = re.compile(r"</?([A-Za-z_][\w-]*)>")
# output-format keywords: two or more capitalised words ending in a colon ("FINAL GRADE:")
_KEYWORD_RE = re.compile(r"\b[A-Z]{2,}(?: [A-Z]{2,})+:")
_WORD_RE = re.compile(r"\w+")


@dataclasses.dataclass(frozen=True)
class Alert:
    """One crossed threshold: which monitor, at which step, the value against the threshold (and its key)."""

    monitor: str
    step: int
    value: float
    threshold: float
    key: str
    message: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# Statistics


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's r; nan with fewer than 2 points or a constant side (no correlation to speak of).

    >>> pearson([1, 2, 3], [2, 4, 7])
    0.9933992677987828
    """
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"pearson: {n} x values, {len(ys)} y values")
    if n < 2:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


def ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank. >>> ranks([10, 30, 20, 30])  ->  [1.0, 3.5, 2.0, 3.5]"""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks (ties averaged)."""
    return pearson(ranks(xs), ranks(ys))


def first_slot_credit(grade_first: int | None, grade_second: int | None) -> float | None:
    """1 when the verdict favours the slot shown first, 0 the second, 0.5 a tie; None when a grade is missing."""
    if grade_first is None or grade_second is None:
        return None
    return 1.0 if grade_first > grade_second else 0.0 if grade_first < grade_second else 0.5


# ---------------------------------------------------------------------------------------------------------------
# What the judge's prompt says (format gaming)


@dataclasses.dataclass(frozen=True)
class JudgeMarkers:
    """What a rollout quoting the judge would contain: its output tags, output keywords, prompt/rubric word runs."""

    tags: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    ngrams: frozenset = frozenset()
    n: int = 6

    def quotes(self, text: str) -> bool:
        lowered = text.lower()
        if any(f"<{t}>" in lowered or f"</{t}>" in lowered for t in self.tags):
            return True
        if any(k in lowered for k in self.keywords):
            return True
        words = _words(text)
        return any(tuple(words[i:i + self.n]) in self.ngrams for i in range(len(words) - self.n + 1))

    def to_dict(self) -> dict:
        return {"tags": list(self.tags), "keywords": list(self.keywords), "n": self.n,
                "ngrams": sorted(" ".join(g) for g in self.ngrams)}

    @classmethod
    def from_dict(cls, data: dict) -> JudgeMarkers:
        return cls(tuple(data.get("tags", ())), tuple(data.get("keywords", ())),
                   frozenset(tuple(g.split(" ")) for g in data.get("ngrams", ())), int(data.get("n", 6)))


def judge_markers(template_text: str, rubric_texts: list[str] = (), n: int = 6) -> JudgeMarkers:
    """Markers of a judge prompt template's text (its messages, `{placeholders}` and all) and its rubric texts.

    >>> m = judge_markers("Answer as <final_grade_A> FINAL GRADE: k - LABEL </final_grade_A>", [], n=3)
    >>> m.tags, m.keywords
    (('final_grade_a',), ('final grade:',))
    """
    tags = sorted({t.lower() for t in _TAG_RE.findall(template_text)} - set(NATIVE_TAGS))
    keywords = sorted({k.lower() for k in _KEYWORD_RE.findall(template_text)})
    grams: set = set()
    for text in (re.sub(r"\{\w+\}", " ", template_text), *rubric_texts):
        words = _words(_TAG_RE.sub(" ", text))
        grams |= {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
    return JudgeMarkers(tuple(tags), tuple(keywords), frozenset(grams), n)


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


# ---------------------------------------------------------------------------------------------------------------
# Per-step sums (one worker's share; every value is a plain sum, so workers all-reduce them by addition)


def step_sums(groups: list[tuple[list[int], list[float]]], verdicts: list[tuple[int | None, int | None]],
              texts: list[str], markers: JudgeMarkers | None) -> dict[str, float]:
    """`groups`: (response lengths, rewards) of each scored group; `verdicts`: (grade of the first slot, grade of
    the second) of every pairwise judgment; `texts`: every rollout (scored or not)."""
    sums = {"monitor_groups": 0.0, "monitor_pearson_sum": 0.0, "monitor_spearman_sum": 0.0,
            "monitor_length_sum": 0.0, "monitor_rollouts": float(len(texts)),
            "monitor_first_credit": 0.0, "monitor_verdicts": 0.0, "monitor_quoting": 0.0}
    for lengths, rewards in groups:
        r, rho = pearson(lengths, rewards), spearman(lengths, rewards)
        if not (math.isnan(r) or math.isnan(rho)):  # a group of equal lengths or rewards has no correlation
            sums["monitor_groups"] += 1
            sums["monitor_pearson_sum"] += r
            sums["monitor_spearman_sum"] += rho
    sums["monitor_length_sum"] = float(sum(sum(lengths) for lengths, _ in groups))
    sums["monitor_scored_rollouts"] = float(sum(len(lengths) for lengths, _ in groups))
    for first, second in verdicts:
        credit = first_slot_credit(first, second)
        if credit is not None:
            sums["monitor_first_credit"] += credit
            sums["monitor_verdicts"] += 1
    if markers is not None:
        sums["monitor_quoting"] = float(sum(markers.quotes(t) for t in texts))
    return sums


# ---------------------------------------------------------------------------------------------------------------
# The monitors' state over a run


class RewardMonitors:
    """Windows and alert states of every monitor of one run (see the module docstring)."""

    def __init__(self, cfg: MonitorConfig, markers: JudgeMarkers | None = None):
        self.cfg, self.markers = cfg, markers
        self._corr: deque = deque(maxlen=cfg.length_corr_window)
        self._position: deque = deque(maxlen=cfg.position_window)
        self._format: deque = deque(maxlen=cfg.format_window)
        self._evals: deque = deque(maxlen=cfg.divergence_evals)
        self._base_length: float | None = None
        self._probe_first: float | None = None
        self._rewards: list[float] = []
        self._active: set[str] = set()

    def anchors(self) -> dict:
        """The run's reference values, fixed once measured (base rollout length, first probe accuracy): what a
        restarted worker must not measure again on an already trained policy (`restore`)."""
        return {"base_length": self._base_length, "probe_first": self._probe_first}

    def restore(self, anchors: dict) -> None:
        self._base_length, self._probe_first = anchors.get("base_length"), anchors.get("probe_first")

    def due(self, step: int) -> bool:
        """Step 1 (its rollouts are the base policy's: the length reference) and every `every`-th step."""
        return self.cfg.enabled and (step == 1 or step % self.cfg.every == 0)

    def step(self, step: int, sums: dict[str, float], reward_mean: float | None = None) -> tuple[dict, list[Alert]]:
        """One monitored step's (worker-reduced) `step_sums` -> ``monitor/*`` metrics and newly crossed alerts."""
        cfg, metrics, alerts = self.cfg, {}, []
        if reward_mean is not None and math.isfinite(reward_mean):
            self._rewards.append(reward_mean)
        groups = sums.get("monitor_groups", 0.0)
        if groups:
            step_rho = sums["monitor_spearman_sum"] / groups
            metrics["monitor/length/reward_corr_pearson"] = sums["monitor_pearson_sum"] / groups
            metrics["monitor/length/reward_corr_spearman"] = step_rho
            self._corr.append(step_rho)
        if self._corr:
            window = sum(self._corr) / len(self._corr)
            metrics["monitor/length/reward_corr_window"] = window
            full = len(self._corr) == self._corr.maxlen
            self._check(alerts, metrics, "length_corr", step, window, cfg.length_corr_max,
                        full and window > cfg.length_corr_max, "length_corr_max",
                        "reward rises with response length within groups: the judge may be paying for length")
        scored = sums.get("monitor_scored_rollouts", 0.0)
        if scored:
            mean = sums["monitor_length_sum"] / scored
            self._base_length = self._base_length if self._base_length is not None else mean
            ratio = mean / self._base_length if self._base_length else math.nan
            metrics |= {"monitor/length/rollout_mean": mean, "monitor/length/rollout_ratio": ratio}
            self._check(alerts, metrics, "length_ratio", step, ratio, cfg.length_ratio_max,
                        ratio > cfg.length_ratio_max, "length_ratio_max",
                        "rollouts grew longer than the base policy's")
        self._position.append((sums.get("monitor_first_credit", 0.0), sums.get("monitor_verdicts", 0.0)))
        credit, verdicts = (sum(c for c, _ in self._position), sum(v for _, v in self._position))
        if sums.get("monitor_verdicts"):
            metrics["monitor/position/first_share"] = sums["monitor_first_credit"] / sums["monitor_verdicts"]
        metrics["monitor/position/verdicts_window"] = verdicts
        if verdicts:
            share = credit / verdicts
            metrics["monitor/position/first_share_window"] = share
            biased = share > cfg.position_first_max or share < 1 - cfg.position_first_max
            ready = len(self._position) == self._position.maxlen and verdicts >= cfg.position_min_verdicts
            self._check(alerts, metrics, "position", step, share, cfg.position_first_max, ready and biased,
                        "position_first_max", "the judge's verdicts follow the slot, not the answer")
        rollouts = sums.get("monitor_rollouts", 0.0)
        if self.markers is not None and rollouts:
            self._format.append((sums.get("monitor_quoting", 0.0), rollouts))
            hits, total = sum(h for h, _ in self._format), sum(t for _, t in self._format)
            share = hits / total
            metrics |= {"monitor/format/quoting_share": sums.get("monitor_quoting", 0.0) / rollouts,
                        "monitor/format/quoting_share_window": share}
            full = len(self._format) == self._format.maxlen
            self._check(alerts, metrics, "format", step, share, cfg.format_share_max,
                        full and share > cfg.format_share_max, "format_share_max",
                        "rollouts quote the judge's rubric or output tags")
        return metrics, alerts

    def validation(self, step: int, win_rate: float | None, policy_lengths: list[int] = (),
                   base_lengths: list[int] = ()) -> tuple[dict, list[Alert]]:
        """One validation: the win rate against the base policy (None when not measured) and the answer lengths
        of the policy and the base model on the validation prompts."""
        cfg, metrics, alerts = self.cfg, {}, []
        if policy_lengths and base_lengths and sum(base_lengths):
            ratio = (sum(policy_lengths) / len(policy_lengths)) / (sum(base_lengths) / len(base_lengths))
            metrics["monitor/length/val_ratio"] = ratio
            self._check(alerts, metrics, "val_length_ratio", step, ratio, cfg.length_ratio_max,
                        ratio > cfg.length_ratio_max, "length_ratio_max",
                        "validation answers grew longer than the base model's")
        if win_rate is not None and math.isfinite(win_rate) and self._rewards:
            self._evals.append((sum(self._rewards) / len(self._rewards), win_rate))
            self._rewards = []
            if len(self._evals) == self._evals.maxlen:
                reward_rise = self._evals[-1][0] - self._evals[0][0]
                win_rise = self._evals[-1][1] - self._evals[0][1]
                metrics |= {"monitor/divergence/reward_rise": reward_rise,
                            "monitor/divergence/winrate_rise": win_rise}
                diverged = reward_rise >= cfg.divergence_reward_rise and win_rise <= cfg.divergence_winrate_rise
                self._check(alerts, metrics, "divergence", step, reward_rise, cfg.divergence_reward_rise, diverged,
                            "divergence_reward_rise", f"training reward rose by {reward_rise:.3g} over "
                            f"{len(self._evals)} validations while the win rate against the base policy moved "
                            f"{win_rise:+.3g}")
        return metrics, alerts

    def probe(self, step: int, accuracy: float) -> tuple[dict, list[Alert]]:
        """The judge's accuracy on the probe set (`probe_accuracy`); the first measurement is the reference."""
        alerts: list[Alert] = []
        self._probe_first = accuracy if self._probe_first is None else self._probe_first
        drop = self._probe_first - accuracy
        metrics = {"monitor/probe/accuracy": accuracy, "monitor/probe/accuracy_drop": drop}
        self._check(alerts, metrics, "probe", step, drop, self.cfg.probe_accuracy_drop_max,
                    drop > self.cfg.probe_accuracy_drop_max, "probe_accuracy_drop_max",
                    "the judge's accuracy on the probe set fell: it is being changed or overloaded")
        return metrics, alerts

    def _check(self, alerts: list[Alert], metrics: dict, name: str, step: int, value: float, threshold: float,
               crossed: bool, key: str, why: str) -> None:
        metrics[f"monitor/{name}/alert"] = float(crossed)
        if crossed and name not in self._active:
            alerts.append(Alert(name, step, float(value), float(threshold), f"monitor.{key}",
                                f"{name}: {value:.3g} against monitor.{key}={threshold:g} at step {step}: {why}"))
        (self._active.add if crossed else self._active.discard)(name)


def gold_preference(grade_a: int, grade_b: int) -> str:
    """The gold preference of a pair from its two gold grades.

    >>> gold_preference(5, 2), gold_preference(3, 3)
    ('A', 'tie')
    """
    return "tie" if grade_a == grade_b else "A" if grade_a > grade_b else "B"


def probe_accuracy(predicted: list[str | None], gold: list[str]) -> float:
    """Share of probe pairs whose predicted preference ("A", "B", "tie"; None = unparsed, counted wrong) equals the
    gold one."""
    if len(predicted) != len(gold):
        raise ValueError(f"probe_accuracy: {len(predicted)} predictions for {len(gold)} gold labels")
    if not gold:
        raise ValueError("probe_accuracy: empty probe set")
    return sum(p == g for p, g in zip(predicted, gold)) / len(gold)
