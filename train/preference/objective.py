"""The training loop's one entry point to the preference and SFT losses of `train.preference.losses`: the loss knobs
(`PreferenceLossConfig`, paper 000's ARPO-SimPO values by default) and the dispatch from a loss name and a batch's
per-sequence log-probabilities to the scalar to back-propagate (pure torch; no ray, vllm or deepspeed).

    loss, metrics = compute_preference_loss("arpo", batch_stats, PreferenceLossConfig())
    loss.backward()
"""

from __future__ import annotations

import torch

from train.config_sections import PreferenceLossConfig
from train.preference.losses import (
    Metrics,
    arpo_loss,
    compute_nll,
    cpo_loss,
    cpo_simpo_loss,
    dpo_loss,
    sft_loss,
    simpo_loss,
)


def compute_preference_loss(
    name: str, batch_stats: dict[str, torch.Tensor], cfg: PreferenceLossConfig
) -> tuple[torch.Tensor, Metrics]:
    """Dispatch to one loss and reduce it to the scalar to back-propagate.

    `batch_stats` holds per-sequence tensors of Shape (b,) from `sequence_logps(..., average=False)`:
    ``chosen_logps``, ``chosen_n_tokens``, ``rejected_logps``, ``rejected_n_tokens`` and, for "dpo" only,
    ``ref_chosen_logps``, ``ref_rejected_logps``. "sft" reads only the chosen pair (the target: a chosen response
    or a human reference). Averages for simpo/cpo_simpo/arpo are taken here, so callers always pass sums.

    Args:
        name: One of "dpo", "cpo", "simpo", "cpo_simpo", "arpo", "sft". "simpo" is pure SimPO (no NLL, α ignored).
        batch_stats: As above.
        cfg: Loss knobs.

    Returns:
        The mean of the per-example losses (0-dim tensor) and the metrics, with ``loss`` added.
    """
    chosen, n_chosen = batch_stats["chosen_logps"], batch_stats["chosen_n_tokens"]
    if name == "sft":
        losses, metrics = sft_loss(chosen, n_chosen, cfg.nll_reduction)
    elif name == "dpo":
        losses, metrics = dpo_loss(
            chosen,
            batch_stats["rejected_logps"],
            batch_stats["ref_chosen_logps"],
            batch_stats["ref_rejected_logps"],
            cfg.beta,
            cfg.label_smoothing,
        )
    else:
        losses, metrics = _reference_free_loss(name, batch_stats, cfg)
    loss = losses.mean()
    metrics["loss"] = loss.detach()
    return loss, metrics


def _reference_free_loss(
    name: str, batch_stats: dict[str, torch.Tensor], cfg: PreferenceLossConfig
) -> tuple[torch.Tensor, Metrics]:
    chosen, n_chosen = batch_stats["chosen_logps"], batch_stats["chosen_n_tokens"]
    rejected, n_rejected = batch_stats["rejected_logps"], batch_stats["rejected_n_tokens"]
    nll = compute_nll(chosen, n_chosen, cfg.nll_reduction)
    avg_chosen = chosen / n_chosen.to(chosen.dtype).clamp(min=1)
    avg_rejected = rejected / n_rejected.to(rejected.dtype).clamp(min=1)
    if name == "cpo":
        return cpo_loss(chosen, rejected, nll, cfg.beta, cfg.cpo_alpha, cfg.label_smoothing)
    if name == "simpo":
        return simpo_loss(avg_chosen, avg_rejected, cfg.beta, cfg.simpo_gamma, cfg.label_smoothing)
    if name == "cpo_simpo":
        return cpo_simpo_loss(
            avg_chosen, avg_rejected, nll, cfg.beta, cfg.simpo_gamma, cfg.cpo_alpha, cfg.label_smoothing
        )
    if name == "arpo":
        return arpo_loss(
            chosen,
            rejected,
            n_chosen,
            n_rejected,
            nll,
            beta=cfg.beta,
            gamma=cfg.simpo_gamma,
            cpo_alpha=cfg.cpo_alpha,
            c1=cfg.arpo_c1,
            c2=cfg.arpo_c2,
            label_smoothing=cfg.label_smoothing,
            reproduce_double_normalisation=cfg.reproduce_double_normalisation,
        )
    raise ValueError(f"unknown loss {name!r}; expected one of dpo, cpo, simpo, cpo_simpo, arpo, sft")
