"""Preference and SFT losses over per-sequence log-probabilities (pure torch; no ray, vllm or deepspeed).

Every loss takes per-sequence tensors of Shape (b,) (produced by `train.logprobs.sequence_logps`) and returns
``(per_example_loss, metrics)``: the loss of Shape (b,) and a dict of detached 0-dim tensors for logging. The
training loop calls them through the single entry point in `train.preference.objective`:

    loss, metrics = compute_preference_loss("arpo", batch_stats, PreferenceLossConfig())
    loss.backward()

Conventions shared by all losses:
    * ``logps`` are *summed* over target tokens unless the name says ``avg`` (mean per target token).
    * ``chosen_nll`` is the behaviour-cloning term per example, Shape (b,). `compute_preference_loss` builds it
      so that its batch mean equals TRL's token-level cross-entropy on the chosen tokens (see `compute_nll`).
    * Rewards in the metrics follow TRL: β·logps (reference-free) or β·(logps − ref_logps) (DPO), detached.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Metrics = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces


def sigmoid_preference_loss(logits: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Conservative sigmoid loss −(1−ε)·log σ(β·x) − ε·log σ(−β·x), used by DPO, CPO, SimPO and ARPO.

    Args:
        logits: Preference margin x per example (before β). Shape: (b,).
        beta: Temperature β.
        label_smoothing: ε, the assumed probability that the label is flipped (cDPO); 0 gives −log σ(β·x).

    Returns:
        Per-example loss. Shape: (b,).
    """
    return -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)


def compute_nll(
    logps: torch.Tensor,
    n_tokens: torch.Tensor,
    reduction: Literal["token_mean", "seq_mean", "sum"] = "token_mean",
) -> torch.Tensor:
    """Per-example negative log-likelihood of the chosen (or target) tokens, scaled for a chosen batch reduction.

    "token_mean" returns ``−logps_i · b / Σ_j n_j``: its batch mean is ``−Σ logps / Σ n``, the single token-level
    cross-entropy that TRL's CPOTrainer and ALMA compute with ``nn.CrossEntropyLoss`` (longer examples weigh
    more). "seq_mean" returns ``−logps_i / n_i`` (every example weighs the same). "sum" returns ``−logps_i``, the
    sequence NLL ``−log π(w | H)`` as paper 002's Eq. 2 prints it (it grows with the response's length, while the
    SimPO term beside it is length-normalised). Rows with no tokens give 0.

    Args:
        logps: Summed log-probs of the target tokens. Shape: (b,).
        n_tokens: Number of target tokens. Shape: (b,).
        reduction: "token_mean", "seq_mean" or "sum", as above.

    Returns:
        Per-example NLL contribution. Shape: (b,).
    """
    n = n_tokens.to(logps.dtype)
    if reduction == "token_mean":
        return -logps * logps.shape[0] / n.sum().clamp(min=1)
    if reduction == "seq_mean":
        return -logps / n.clamp(min=1)
    if reduction == "sum":
        return -logps
    raise ValueError(f"unknown nll reduction {reduction!r}; expected 'token_mean', 'seq_mean' or 'sum'")


def _reward_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> Metrics:
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Losses


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """Sigmoid DPO (Rafailov et al. 2023, arXiv 2305.18290, eq. 7; cDPO label smoothing as in TRL's DPOTrainer).

    L = −(1−ε)·log σ(β·h) − ε·log σ(−β·h), h = (π_w − ref_w) − (π_l − ref_l). With policy == reference, h = 0 and
    L = ln 2 whatever ε is.

    Args:
        policy_chosen: Policy summed log-probs of the chosen responses. Shape: (b,).
        policy_rejected: Policy summed log-probs of the rejected responses. Shape: (b,).
        ref_chosen: Reference-model summed log-probs of the chosen responses. Shape: (b,).
        ref_rejected: Reference-model summed log-probs of the rejected responses. Shape: (b,).
        beta: Temperature β.
        label_smoothing: ε.

    Returns:
        Per-example loss, Shape: (b,); metrics with the implicit rewards β·(π − ref).
    """
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    losses = sigmoid_preference_loss(chosen_ratio - rejected_ratio, beta, label_smoothing)
    return losses, _reward_metrics(beta * chosen_ratio, beta * rejected_ratio)


def cpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
    beta: float = 0.1,
    cpo_alpha: float = 1.0,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """Contrastive Preference Optimization (Xu et al. 2024, arXiv 2401.08417, eq. 3; TRL `loss_type="sigmoid"`).

    Reference-free: L = −log σ(β·(ℓ_w − ℓ_l)) + α·NLL(chosen), with ℓ the *summed* log-probs.

    Args:
        chosen_logps: Summed log-probs of the chosen responses. Shape: (b,).
        rejected_logps: Summed log-probs of the rejected responses. Shape: (b,).
        chosen_nll: Behaviour-cloning NLL per example (see `compute_nll`). Shape: (b,).
        beta: Temperature β.
        cpo_alpha: Weight α of the NLL term.
        label_smoothing: ε.

    Returns:
        Per-example loss, Shape: (b,); metrics incl. ``nll_loss`` and rewards β·ℓ.
    """
    losses = sigmoid_preference_loss(chosen_logps - rejected_logps, beta, label_smoothing)
    metrics = _reward_metrics(beta * chosen_logps, beta * rejected_logps)
    metrics["nll_loss"] = chosen_nll.detach().mean()
    return losses + cpo_alpha * chosen_nll, metrics


def simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """SimPO (Meng et al. 2024, arXiv 2405.14734, eq. 6) exactly as TRL's CPOTrainer with ``loss_type="simpo"``.

    TRL computes ``logits = ℓ̄_w − ℓ̄_l − simpo_gamma / beta`` and ``−log σ(β·logits)``, i.e.
    L = −log σ(β·ℓ̄_w − β·ℓ̄_l − γ): TRL's `simpo_gamma` *is* the paper's γ (reward units), and γ/β is the
    SimPO repository's ``gamma_beta_ratio``. Here ``gamma`` = TRL ``simpo_gamma``. The defaults β=2, γ=1
    (γ/β = 0.5) are SimPO-repository-style values; paper 000 trains with β=0.1, γ=1.5 (γ/β = 15 nats/token, so
    its preference term is nearly linear in the margin) — pass those through `PreferenceLossConfig`.

    Args:
        chosen_avg_logps: Mean per-token log-probs of the chosen responses. Shape: (b,).
        rejected_avg_logps: Mean per-token log-probs of the rejected responses. Shape: (b,).
        beta: Temperature β.
        gamma: Target reward margin γ.
        label_smoothing: ε.

    Returns:
        Per-example loss, Shape: (b,); metrics with rewards β·ℓ̄.
    """
    logits = chosen_avg_logps - rejected_avg_logps - gamma / beta
    losses = sigmoid_preference_loss(logits, beta, label_smoothing)
    return losses, _reward_metrics(beta * chosen_avg_logps, beta * rejected_avg_logps)


def cpo_simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
    beta: float = 0.1,
    gamma: float = 1.5,
    cpo_alpha: float = 1.0,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """CPO-SimPO (github.com/fe1ixxu/CPO_SIMPO): the SimPO term plus α·NLL, as TRL CPOTrainer with
    ``loss_type="simpo"`` and ``cpo_alpha > 0``. Defaults are paper 000's β=0.1, γ=1.5, α=1.

    Args:
        chosen_avg_logps: Mean per-token log-probs of the chosen responses. Shape: (b,).
        rejected_avg_logps: Mean per-token log-probs of the rejected responses. Shape: (b,).
        chosen_nll: Behaviour-cloning NLL per example (see `compute_nll`). Shape: (b,).
        beta: Temperature β.
        gamma: Target reward margin γ (TRL ``simpo_gamma``).
        cpo_alpha: Weight α of the NLL term.
        label_smoothing: ε.

    Returns:
        Per-example loss, Shape: (b,); SimPO metrics plus ``nll_loss``.
    """
    losses, metrics = simpo_loss(chosen_avg_logps, rejected_avg_logps, beta, gamma, label_smoothing)
    metrics["nll_loss"] = chosen_nll.detach().mean()
    return losses + cpo_alpha * chosen_nll, metrics


def arpo_penalty(gap: torch.Tensor, c1: float = 0.9, c2: float = 0.4) -> torch.Tensor:
    """ARPO adaptive rejection weight w = min(c1·exp(c2·d) − 1, 1) (X-ALMA, Xu et al., ICLR 2025).

    Not detached. At d = 0, w = c1 − 1 = −0.1 (slightly negative); w reaches its cap 1 at
    d = ln(2/c1)/c2 ≈ 1.996 for the defaults.

    Args:
        gap: Non-negative per-token log-prob gap d between chosen and rejected. Shape: (b,).
        c1: Relax coefficient 1.
        c2: Relax coefficient 2.

    Returns:
        Penalty weight on the rejected term. Shape: (b,).
    """
    return torch.clamp(c1 * torch.exp(c2 * gap) - 1, max=1.0)


def arpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_n_tokens: torch.Tensor,
    rejected_n_tokens: torch.Tensor,
    chosen_nll: torch.Tensor,
    beta: float = 0.1,
    gamma: float = 1.5,
    cpo_alpha: float = 1.0,
    c1: float = 0.9,
    c2: float = 0.4,
    label_smoothing: float = 0.0,
    reproduce_double_normalisation: bool = True,
) -> tuple[torch.Tensor, Metrics]:
    """ARPO on CPO-SimPO, following `CPOTrainer.cpo_loss` in github.com/fe1ixxu/ALMA `utils/cpo_trainer.py`.

    With ℓ̄ = logps / n (SimPO's length-normalised log-probs):
        d = |ℓ̄_w − ℓ̄_l|,  w = min(c1·exp(c2·d) − 1, 1)  (not detached, see `arpo_penalty`),
        z = ℓ̄_w − w·ℓ̄_l − γ/β,  L = −log σ(β·z) + α·NLL(chosen).

    The authors' code computes the gap as ``|ℓ_w/n_w − ℓ_l/n_l|`` on whatever log-probs the loss uses; with
    ``loss_type="simpo"`` those are already averages, so the gap becomes ``|ℓ̄_w/n_w − ℓ̄_l/n_l|`` (divided by
    the length twice). For realistic lengths that gap is ≈ 0, so w ≈ −0.1 for every pair and the rejected term
    gets a small *positive* weight. ``reproduce_double_normalisation=True`` (the default) reproduces that quirk,
    since it is what paper 000's runs computed; False uses the intended gap between per-token averages, which is
    also what their non-SimPO path computes. Metrics rewards are β·ℓ̄ as in the authors' code.

    Args:
        chosen_logps: Summed log-probs of the chosen responses. Shape: (b,).
        rejected_logps: Summed log-probs of the rejected responses. Shape: (b,).
        chosen_n_tokens: Target-token counts of the chosen responses. Shape: (b,).
        rejected_n_tokens: Target-token counts of the rejected responses. Shape: (b,).
        chosen_nll: Behaviour-cloning NLL per example (see `compute_nll`). Shape: (b,).
        beta: Temperature β (paper 000: 0.1).
        gamma: SimPO margin γ (paper 000: 1.5).
        cpo_alpha: Weight α of the NLL term (paper 000: 1).
        c1: Relax coefficient 1.
        c2: Relax coefficient 2.
        label_smoothing: ε (the authors' code supports it; paper 000 uses 0).
        reproduce_double_normalisation: See above.

    Returns:
        Per-example loss, Shape: (b,); metrics incl. ``arpo/penalty``, ``arpo/gap`` and ``nll_loss``.
    """
    n_w = chosen_n_tokens.to(chosen_logps.dtype).clamp(min=1)
    n_l = rejected_n_tokens.to(rejected_logps.dtype).clamp(min=1)
    avg_w, avg_l = chosen_logps / n_w, rejected_logps / n_l
    if reproduce_double_normalisation:
        gap = torch.abs(avg_w / n_w - avg_l / n_l)
    else:
        gap = torch.abs(avg_w - avg_l)
    penalty = arpo_penalty(gap, c1, c2)
    logits = avg_w - penalty * avg_l - gamma / beta
    losses = sigmoid_preference_loss(logits, beta, label_smoothing)
    metrics = _reward_metrics(beta * avg_w, beta * avg_l)
    metrics["arpo/penalty"] = penalty.detach().mean()
    metrics["arpo/gap"] = gap.detach().mean()
    metrics["nll_loss"] = chosen_nll.detach().mean()
    return losses + cpo_alpha * chosen_nll, metrics


def sft_loss(
    target_logps: torch.Tensor,
    target_n_tokens: torch.Tensor,
    reduction: Literal["token_mean", "seq_mean", "sum"] = "token_mean",
) -> tuple[torch.Tensor, Metrics]:
    """Supervised NLL on target tokens (SFT-on-chosen and SFT-on-references baselines).

    With "token_mean" the batch mean of the returned tensor is HF/TRL SFT's token-level cross-entropy.

    Args:
        target_logps: Summed log-probs of the target tokens. Shape: (b,).
        target_n_tokens: Number of target tokens. Shape: (b,).
        reduction: "token_mean", "seq_mean" or "sum" (see `compute_nll`).

    Returns:
        Per-example loss, Shape: (b,); metrics ``nll_loss`` and ``n_tokens`` (total).
    """
    losses = compute_nll(target_logps, target_n_tokens, reduction)
    return losses, {"nll_loss": losses.detach().mean(), "n_tokens": target_n_tokens.detach().sum()}
