"""GRPO maths: group-relative advantages, the clipped policy loss, loss aggregation and KL estimators (pure torch).

GRPO follows DeepSeekMath (Shao et al. 2024, arXiv 2402.03300, §4.1); the Dr. GRPO variants follow
"Understanding R1-Zero-Like Training" (Liu et al. 2025, arXiv 2503.20783); KL estimators are Schulman's
"Approximating KL Divergence" (2020). Numerics match TRL's GRPOTrainer (`trl/trainer/grpo_trainer.py`) unless a
docstring says otherwise.

Rollouts are laid out group-major: the G completions of prompt 0 first, then the G of prompt 1, and so on.

    adv = group_advantages(rewards, group_size=8)                   # Shape (n_groups * 8,)
    loss, metrics = grpo_policy_loss(logps, old_logps, adv, mask)   # logps: Shape (b, T)
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
KLKind = Literal["k1", "k2", "k3"]


def group_advantages(
    rewards: torch.Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages A_i = (r_i − mean_g(r)) / (std_g(r) + eps), or r_i − mean_g(r) for Dr. GRPO.

    The std is the *sample* std (Bessel's correction, divide by G − 1), matching TRL's GRPOTrainer (`nanstd`
    applies ``count / (count − 1)``) and verl (``torch.std``). With ``normalize_std=False`` this is Dr. GRPO's
    unbiased advantage: dividing by the std up-weights groups whose rewards barely differ (too easy or too hard
    prompts), so Dr. GRPO only centres the rewards.

    Edge cases, chosen on purpose:
        * equal rewards in a group give exactly 0, also with ``eps=0`` (a zero std is never divided by);
        * ``group_size == 1`` gives 0 for every rollout: a singleton has no sibling to compare with, so the
          centred reward is 0. This differs from verl, which sets mean 0 and std 1 for singletons and so passes
          the raw score through (REINFORCE without a baseline), and from TRL, whose sample std is NaN there.

    Args:
        rewards: Scalar reward per rollout, group-major. Shape: (n_groups * G,).
        group_size: G, the number of rollouts per prompt.
        normalize_std: Divide by the group std (GRPO) or not (Dr. GRPO).
        eps: Added to the std before dividing.

    Returns:
        Advantages, float32. Shape: (n_groups * G,).
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        std = grouped.std(dim=1, keepdim=True)
        # a constant group is already exactly 0; dividing it by 0 + eps = 0 would give NaN
        centred = centred / torch.where(std > 0, std + eps, torch.ones_like(std))
    return centred.reshape(-1)


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimator of KL(π‖π_ref) from tokens sampled from π (Schulman 2020).

    With log r = ref_logps − logps:
        k1 = −log r                  (unbiased, can be negative; verl "kl")
        k2 = ½·(log r)²              (biased, low variance; verl "mse")
        k3 = (r − 1) − log r ≥ 0     (unbiased, low variance; TRL GRPO, verl "low_var_kl" before clamping)

    Args:
        logps: Log-probs of the sampled tokens under π. Shape: (b, T).
        ref_logps: Log-probs of the same tokens under π_ref. Shape: (b, T).
        kind: "k1", "k2" or "k3".

    Returns:
        Per-token estimate. Shape: (b, T).
    """
    log_ratio = ref_logps - logps
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    raise ValueError(f"unknown KL estimator {kind!r}; expected 'k1', 'k2' or 'k3'")


def aggregate_token_losses(
    values: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg = "token_mean", max_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    Modes (TRL loss_type / verl loss_agg_mode in brackets):
        token_mean: Σ masked / Σ mask, every token weighs the same [TRL "bnpo", verl "token-mean"];
        seq_mean_token_mean: mean over sequences of each sequence's token mean, GRPO's 1/|o_i| [TRL "grpo",
            verl "seq-mean-token-mean"]; a sequence with no tokens contributes 0;
        seq_mean_token_sum: mean over sequences of token sums [verl "seq-mean-token-sum"];
        seq_mean_token_sum_norm: Σ masked / (b · max_len), Dr. GRPO: the per-sequence 1/|o_i| is replaced by
            one constant, so long and short completions get the same per-token weight and there is no pull
            towards longer wrong answers [TRL "dr_grpo"]. verl's mode of the same name divides by max_len only
            (a sum over sequences), i.e. b times larger; the gradient direction is the same.

    Args:
        values: Per-token losses. Shape: (b, T).
        mask: 1 on completion tokens. Shape: (b, T).
        loss_agg: One of the modes above.
        max_len: Dr. GRPO's constant; pass the configured max completion length so the scale does not change
            with each batch's padding. Defaults to T.

    Returns:
        0-dim tensor.
    """
    mask = mask.to(values.dtype)
    summed = (values * mask).sum(-1)
    if loss_agg == "token_mean":
        return summed.sum() / mask.sum().clamp(min=1)
    if loss_agg == "seq_mean_token_mean":
        return (summed / mask.sum(-1).clamp(min=1)).mean()
    if loss_agg == "seq_mean_token_sum":
        return summed.mean()
    if loss_agg == "seq_mean_token_sum_norm":
        return summed.sum() / (values.shape[0] * (max_len if max_len is not None else values.shape[-1]))
    raise ValueError(f"unknown loss_agg {loss_agg!r}")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def grpo_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    loss_agg: LossAgg = "token_mean",
    max_len: int | None = None,
    ref_logps: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate GRPO loss with optional KL-to-reference term (DeepSeekMath eq. 3; TRL GRPOTrainer).

    Per token: ρ = exp(logps − old_logps), ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) + kl_coef·KL, then
    `aggregate_token_losses` with `loss_agg`. Where the clip binds (ρ > 1 + ε_high with A > 0, or ρ < 1 − ε_low
    with A < 0) the gradient of that token is zero. ε_high > ε_low is DAPO's "clip-higher".

    Args:
        logps: Current-policy log-probs of the sampled tokens (requires grad). Shape: (b, T).
        old_logps: Log-probs under the policy that sampled them (detached). Shape: (b, T).
        advantages: Per-sequence advantages, broadcast over tokens, Shape: (b,); or per-token, Shape: (b, T).
        mask: 1 on completion tokens. Shape: (b, T).
        clip_eps_low: ε_low.
        clip_eps_high: ε_high.
        loss_agg: Aggregation mode, see `aggregate_token_losses`.
        max_len: Dr. GRPO constant for "seq_mean_token_sum_norm".
        ref_logps: Reference-model log-probs, needed when ``kl_coef > 0``. Shape: (b, T).
        kl_coef: β of the KL term (0 disables it).
        kl_kind: KL estimator, see `kl_penalty`.

    Returns:
        The scalar loss and detached metrics: ``clip_fraction`` (share of tokens where the clip binds; split into
        ``clip_fraction_high``, ρ > 1 + ε_high with A > 0, and ``clip_fraction_low``, ρ < 1 − ε_low with A < 0),
        ``ratio_mean``, ``approx_kl`` (k3 estimate of KL(π_old‖π), tokens sampled from π_old) and, with a KL term,
        ``kl`` (masked mean of the chosen estimator).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    old_logps = old_logps.detach()
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - clip_eps_low, 1 + clip_eps_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    metrics = {}
    if kl_coef != 0.0:
        if ref_logps is None:
            raise ValueError("kl_coef > 0 needs ref_logps")
        kl = kl_penalty(logps, ref_logps.detach(), kl_kind)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = _masked_mean(kl.detach(), mask)
    loss = aggregate_token_losses(per_token, mask, loss_agg, max_len)
    with torch.no_grad():
        high = (ratio > 1 + clip_eps_high) & (advantages > 0)
        low = (ratio < 1 - clip_eps_low) & (advantages < 0)
        metrics["clip_fraction"] = _masked_mean((high | low).float(), mask)
        metrics["clip_fraction_high"] = _masked_mean(high.float(), mask)
        metrics["clip_fraction_low"] = _masked_mean(low.float(), mask)
        metrics["ratio_mean"] = _masked_mean(ratio, mask)
        metrics["approx_kl"] = _masked_mean(kl_penalty(old_logps, logps, "k3"), mask)
    return loss, metrics
