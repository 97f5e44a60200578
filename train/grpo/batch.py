"""GRPO rollout bookkeeping (pure torch): group outcomes -> advantages and a loss mask, token log-probs, statistics.

The worker loop (`train/grpo/loop.py`) samples G completions per prompt, asks a reward callable for one
`GroupOutcome` per prompt, and then only calls these functions:

    adv, valid = outcome_advantages(outcomes, group_size=8, normalize_std=True)   # Shape (n * 8,) each
    keep = completion_window(loss_mask)                    # left-padded batch: completions end every row
    logits = model(input_ids, ..., logits_to_keep=keep).logits
    logps, mask = completion_logps(logits, input_ids[:, -keep:], loss_mask[:, -keep:])   # Shape (b, keep - 1)

A group whose reward could not be computed (the reward service failed or timed out after its retries, or gave no
reward for one of the rollouts) is **failed**: it is counted, and its rollouts get ``valid = False`` so they leave
the loss. A failed group never becomes a group of zero rewards: that would look like a real, uninformative
group and hide an outage in the reward curves.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from train.grpo.advantages import group_advantages
from train.logprobs import token_logps


@dataclasses.dataclass
class GroupOutcome:
    """The reward of one prompt's G rollouts, or why there is none.

    Attributes:
        rewards: One scalar per rollout (in rollout order), or None when the group failed.
        components: Per-rollout values of named reward terms, logged as ``reward/<name>`` means (judge reward:
            exact_a, ..., format_penalty; GRM: mean_grade, ...). Only of successful groups.
        error: "" on success, else a short failure kind (``timeout``, ``connect``, ``http_503``, ``null_rewards``,
            ...), counted per kind.
        attempts: Calls made to the reward service (1 + retries used); 0 for local rewards.
        latency_s: Wall time spent obtaining the rewards, retries and back-off included.
        failed_judgments: Judge generations of this group whose grades could not be parsed (GRM only).
        verdicts: (grade of the slot shown first, grade of the second) of every parsed pairwise judgment (GRM only;
            the position-preference monitor, `eval.reward_monitors`).
    """

    rewards: list[float] | None
    components: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    error: str = ""
    attempts: int = 0
    latency_s: float = 0.0
    failed_judgments: int = 0
    verdicts: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rewards is not None and not self.error


def failed(error: str, attempts: int = 0, latency_s: float = 0.0) -> GroupOutcome:
    return GroupOutcome(rewards=None, error=error, attempts=attempts, latency_s=latency_s)


def outcome_advantages(
    outcomes: list[GroupOutcome], group_size: int, normalize_std: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages of the successful groups; failed groups get 0 and ``valid = False``.

    Args:
        outcomes: One per prompt, in rollout order (group-major, as `group_advantages` expects).
        group_size: G.
        normalize_std: GRPO (True) or Dr. GRPO's centred rewards (False).

    Returns:
        ``(advantages, valid)``, float32 and bool. Shape: (len(outcomes) * G,) each.

    Raises:
        ValueError: a successful outcome does not hold exactly G finite rewards (a reward-callable bug).
    """
    rewards = torch.zeros(len(outcomes), group_size)
    valid = torch.zeros(len(outcomes), dtype=torch.bool)
    for i, outcome in enumerate(outcomes):
        if not outcome.ok:
            continue
        if len(outcome.rewards) != group_size or not all(math.isfinite(r) for r in outcome.rewards):
            raise ValueError(f"group {i}: expected {group_size} finite rewards, got {outcome.rewards!r}")
        rewards[i] = torch.tensor(outcome.rewards, dtype=torch.float32)
        valid[i] = True
    advantages = group_advantages(rewards.reshape(-1), group_size, normalize_std)
    # failed rows are all zero, so group_advantages already gives them 0; the mask is what removes them
    valid = valid.repeat_interleave(group_size)
    return advantages * valid, valid


def completion_logps(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the completion tokens, shifted by one (`train.logprobs` convention).

    Args:
        logits: Shape: (b, T, V).
        input_ids: Prompt + completion ids. Shape: (b, T).
        loss_mask: 1 on completion tokens. Shape: (b, T).

    Returns:
        ``(logps, mask)`` where ``logps[:, t]`` scores ``input_ids[:, t + 1]``; masked positions hold 0.
        Shape: (b, T - 1) each.
    """
    mask = loss_mask[:, 1:].bool()
    targets = input_ids[:, 1:].masked_fill(~mask, 0)
    return token_logps(logits[:, :-1], targets) * mask, mask


def completion_window(loss_mask: torch.Tensor) -> int:
    """Trailing positions whose logits a left-padded batch needs: the longest completion plus the one prompt
    position that predicts its first token. Passed as HF's ``logits_to_keep``, it spares the vocabulary projection
    and log-softmax of every prompt token (a judge prompt is ~10x its answer).

    >>> completion_window(torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]]))
    4
    """
    return int(loss_mask.sum(-1).max()) + 1


def trim_completion(ids: list[int], stop_ids: set[int], pad_id: int | None) -> tuple[list[int], bool]:
    """A sampled completion up to and including its first stop token; trailing padding dropped.

    Returns:
        ``(ids, finished)``: finished is False when the completion hit the length limit without a stop token.

    >>> trim_completion([5, 6, 2, 0, 0], stop_ids={2}, pad_id=0)
    ([5, 6, 2], True)
    >>> trim_completion([5, 6, 7], stop_ids={2}, pad_id=0)
    ([5, 6, 7], False)
    """
    for i, token in enumerate(ids):
        if token in stop_ids:
            return list(ids[: i + 1]), True
    out = list(ids)
    while out and pad_id is not None and out[-1] == pad_id and pad_id not in stop_ids:
        out.pop()
    return out, False


def micro_batch_slices(n_rows: int, micro_batch_size: int) -> list[slice]:
    """Consecutive slices of `micro_batch_size` rows (the last may be shorter).

    >>> micro_batch_slices(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    return [slice(i, min(i + micro_batch_size, n_rows)) for i in range(0, n_rows, micro_batch_size)]


# ---------------------------------------------------------------------------------------------------------------
# Statistics of one step on one worker (summed here, averaged over workers by the loop)


def outcome_sums(outcomes: list[GroupOutcome]) -> dict[str, float]:
    """Sums and counts to be all-reduced: groups, failures by kind, latency, reward moments, component sums.

    Keys ending in ``_max`` are reduced with max, all others summed; `finish_outcome_metrics` then divides.
    """
    good = [o for o in outcomes if o.ok]
    sums = {
        "groups": float(len(outcomes)), "groups_failed": float(len(outcomes) - len(good)),
        "service_calls": float(sum(o.attempts for o in outcomes)),
        "service_retries": float(sum(max(o.attempts - 1, 0) for o in outcomes)),
        "service_latency_s_sum": sum(o.latency_s for o in outcomes),
        "service_latency_s_max": max((o.latency_s for o in outcomes), default=0.0),
        "judgments_failed": float(sum(o.failed_judgments for o in outcomes)),
        "rollouts_scored": float(sum(len(o.rewards) for o in good)),
        "reward_sum": sum(sum(o.rewards) for o in good),
        "reward_std_sum": sum(_std(o.rewards) for o in good),
        "groups_zero_std": float(sum(_std(o.rewards) == 0.0 for o in good)),
    }
    for outcome in outcomes:
        if outcome.error:
            key = "groups_failed/" + outcome.error.split(":")[0]
            sums[key] = sums.get(key, 0.0) + 1.0
    for outcome in good:
        for name, values in outcome.components.items():
            sums[f"component/{name}_sum"] = sums.get(f"component/{name}_sum", 0.0) + sum(values)
    return sums


def finish_outcome_metrics(totals: dict[str, float]) -> dict[str, float]:
    """Turn reduced `outcome_sums` into logged metrics (means per rollout / group, rates)."""
    groups, good = totals.get("groups", 0.0), totals.get("groups", 0.0) - totals.get("groups_failed", 0.0)
    rollouts = totals.get("rollouts_scored", 0.0)
    metrics = {
        "reward/groups": groups, "reward/groups_failed": totals.get("groups_failed", 0.0),
        "reward/groups_failed_fraction": totals.get("groups_failed", 0.0) / groups if groups else 0.0,
        "reward/groups_zero_std": totals.get("groups_zero_std", 0.0),
        "reward/mean": totals.get("reward_sum", 0.0) / rollouts if rollouts else math.nan,
        "reward/std_within_group": totals.get("reward_std_sum", 0.0) / good if good else math.nan,
        "reward_service/calls": totals.get("service_calls", 0.0),
        "reward_service/retries": totals.get("service_retries", 0.0),
        "reward_service/latency_s_mean": totals.get("service_latency_s_sum", 0.0) / groups if groups else 0.0,
        "reward_service/latency_s_max": totals.get("service_latency_s_max", 0.0),
        "reward_service/judgments_failed": totals.get("judgments_failed", 0.0),
    }
    for key, value in totals.items():
        if key.startswith("groups_failed/"):
            metrics[f"reward_service/errors/{key.split('/', 1)[1]}"] = value
        elif key.startswith("component/"):
            metrics[f"reward/{key[len('component/'):-len('_sum')]}"] = value / rollouts if rollouts else math.nan
    return metrics


def _std(values: list[float]) -> float:
    """Population std of one group's rewards (a spread diagnostic, not the advantage normaliser)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


# ---------------------------------------------------------------------------------------------------------------
# Validation


VAL_SCORE = "val/reward/mean"
# the score that picks the best adapter, per grpo.val_metric
VAL_SCORES = {"reward": VAL_SCORE, "vs_baseline": "val/vs_baseline/score"}


def validation_metrics(totals: dict[str, float]) -> dict[str, float]:
    """Reduced `outcome_sums` of a validation pass -> ``val/``-prefixed reward metrics (mean, components, failures).

    >>> validation_metrics({"groups": 2.0, "rollouts_scored": 4.0, "reward_sum": 2.0})[VAL_SCORE]
    0.5
    """
    metrics = finish_outcome_metrics(totals)
    return {f"val/{k}": v for k, v in metrics.items() if k.startswith(("reward/", "reward_service/errors/"))}


def improved(value: float, best: float | None) -> bool:
    """Whether a validation score beats the best so far; NaN (no group scored) never does, and ties keep the
    earlier adapter.

    >>> improved(0.2, None), improved(0.2, 0.2), improved(float("nan"), None), improved(0.3, float("-inf"))
    (True, False, False, True)
    """
    if not math.isfinite(value):
        return False
    return best is None or value > best


# ---------------------------------------------------------------------------------------------------------------
# Validation against the baseline policy (policy GRPO, paper 003 §5.2)
#
# A served reward of mean margins against the siblings sums to 0 over every group, so its validation mean is 0 at
# every check and cannot rank adapters. Instead each validation prompt gets one answer from the current policy and
# one from the baseline (the initial policy, sampled before the first update: `train.grpo.validate`), and the GRM
# grades the pair in both orders (`/reward/group`, scheme vs_reference, both_orders). The outcome of a prompt is
# the sign of the policy's mean grade margin over its parsed judgments (MENLO's sign(s_A - s_B), averaged over the
# two orders so position bias cancels). A prompt with no parsed judgment is counted as failed, never as a loss or a tie.


def versus_outcome(margin: float) -> str:
    """win | tie | loss of the policy against the baseline from its mean grade margin.

    >>> versus_outcome(0.5), versus_outcome(0.0), versus_outcome(-2.0)
    ('win', 'tie', 'loss')
    """
    return "win" if margin > 0 else "loss" if margin < 0 else "tie"


def versus_sums(outcomes: list[GroupOutcome]) -> dict[str, float]:
    """Sums to all-reduce over workers. Each outcome is one prompt's single policy answer judged against the
    baseline; its components carry ``grm_margin`` (own grade - baseline grade, mean over judgments) and
    ``grm_mean_grade`` (own grade)."""
    sums = {"vs_prompts": float(len(outcomes)), "vs_failed": 0.0, "vs_win": 0.0, "vs_tie": 0.0, "vs_loss": 0.0,
            "vs_grade_sum": 0.0, "vs_baseline_grade_sum": 0.0,
            "vs_judgments_failed": float(sum(o.failed_judgments for o in outcomes))}
    for outcome in outcomes:
        if not outcome.ok:
            sums["vs_failed"] += 1.0
            key = "vs_failed/" + outcome.error.split(":")[0]
            sums[key] = sums.get(key, 0.0) + 1.0
            continue
        margin, grade = outcome.components["grm_margin"][0], outcome.components["grm_mean_grade"][0]
        sums[f"vs_{versus_outcome(margin)}"] += 1.0
        sums["vs_grade_sum"] += grade
        # both means run over the same parsed judgments, so mean(own - other) = mean(own) - mean(other)
        sums["vs_baseline_grade_sum"] += grade - margin
    return sums


def versus_metrics(totals: dict[str, float]) -> dict[str, float]:
    """Reduced `versus_sums` -> ``val/vs_baseline/*``: win / tie / loss rates over the judged prompts (MENLO
    Table 7), the score that picks the best adapter (win rate with ties counted half: 0.5 = no better than the
    baseline), both systems' mean grades and their difference, and the failures.

    >>> m = versus_metrics({"vs_prompts": 5.0, "vs_failed": 1.0, "vs_win": 2.0, "vs_tie": 1.0, "vs_loss": 1.0,
    ...                     "vs_grade_sum": 14.0, "vs_baseline_grade_sum": 12.0})
    >>> m["val/vs_baseline/score"], m["val/vs_baseline/win_rate"], m["val/vs_baseline/grade_delta"]
    (0.625, 0.5, 0.5)
    """
    judged = totals.get("vs_prompts", 0.0) - totals.get("vs_failed", 0.0)

    def rate(key: str) -> float:
        return totals.get(key, 0.0) / judged if judged else math.nan

    prefix = "val/vs_baseline/"
    wins_and_half_ties = totals.get("vs_win", 0.0) + 0.5 * totals.get("vs_tie", 0.0)
    metrics = {
        prefix + "win_rate": rate("vs_win"), prefix + "tie_rate": rate("vs_tie"),
        prefix + "loss_rate": rate("vs_loss"), prefix + "score": wins_and_half_ties / judged if judged else math.nan,
        prefix + "grade_mean": rate("vs_grade_sum"), prefix + "baseline_grade_mean": rate("vs_baseline_grade_sum"),
        prefix + "prompts": totals.get("vs_prompts", 0.0), prefix + "prompts_failed": totals.get("vs_failed", 0.0),
        prefix + "judgments_failed": totals.get("vs_judgments_failed", 0.0),
    }
    metrics[prefix + "grade_delta"] = metrics[prefix + "grade_mean"] - metrics[prefix + "baseline_grade_mean"]
    for key, value in totals.items():
        if key.startswith("vs_failed/"):
            metrics[f"{prefix}errors/{key.split('/', 1)[1]}"] = value
    return metrics
