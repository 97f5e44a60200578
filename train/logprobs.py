"""Per-token and per-sequence log-probabilities from causal-LM logits (pure torch).

Every preference loss in `train/losses.py` and the GRPO maths in `train/advantages.py` consume the outputs of
these functions, so the shift-by-one convention lives here and nowhere else:

    logits[:, t] is the model's prediction for token labels[:, t + 1].

`sequence_logps` therefore scores labels[:, 1:] with logits[:, :-1] and reads the loss mask on the *label*
positions (loss_mask[:, 1:]). This is the convention of TRL's `CPOTrainer.get_batch_logps` and HF's causal-LM
loss; position 0 is never scored (nothing predicts it) and the last logit row is never used.

    logps, n_tokens = sequence_logps(model(input_ids).logits, input_ids, completion_mask)
"""

from __future__ import annotations

import torch


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under its logits, without materialising a full log-softmax.

    Computes ``logits[..., label] - logsumexp(logits)`` one batch row at a time in float32, so peak extra memory
    is one (T, V) row instead of a (b, T, V) log-softmax copy (the trick of TRL's `selective_log_softmax`).
    No shift is applied here: row ``[i, t]`` of `logits` scores ``labels[i, t]``.

    Args:
        logits: Unnormalised scores. Shape: (b, T, V).
        labels: Token ids to score, all in ``[0, V)`` (replace ignore ids such as -100 first). Shape: (b, T).

    Returns:
        Float32 log-probabilities. Shape: (b, T).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on (b, T)")
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logits = row_logits.float()
        picked = row_logits.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of the next-token distribution at every position, one batch row at a time.

    Uses H = logsumexp(z) - sum_v softmax(z)_v * z_v, which equals -sum_v p_v log p_v.

    Args:
        logits: Unnormalised scores. Shape: (b, T, V).

    Returns:
        Float32 entropies. Shape: (b, T).
    """
    rows = []
    for row_logits in logits:
        row_logits = row_logits.float()
        probs = torch.softmax(row_logits, dim=-1)
        rows.append(torch.logsumexp(row_logits, dim=-1) - (probs * row_logits).sum(-1))
    return torch.stack(rows)


def sequence_logps(
    logits: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
    average: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed (or per-token averaged) log-probability of the masked target tokens of each sequence.

    Shift-by-one: ``logits[:, :-1]`` scores ``labels[:, 1:]`` and the mask is read as ``loss_mask[:, 1:]``, i.e.
    `loss_mask` marks *label* positions (1 on completion tokens, 0 on prompt and padding), exactly as
    `labels != -100` does in TRL's `get_batch_logps`. Masked label positions may hold any id (including -100);
    they are replaced by 0 before the gather and contribute nothing.

    Args:
        logits: Causal-LM logits for the full sequence. Shape: (b, T, V).
        labels: The input ids (labels are the inputs themselves; the shift is done here). Shape: (b, T).
        loss_mask: 1/True on target tokens. Shape: (b, T).
        average: If True return the mean log-prob per target token (SimPO/IPO style), else the sum (DPO/CPO).
            A row with no target tokens gives 0 in both modes.

    Returns:
        A pair ``(logps, n_tokens)``: summed or averaged log-probs, Shape: (b,), float32; and the number of
        target tokens per row, Shape: (b,), int64.
    """
    if logits.shape[:-1] != labels.shape or labels.shape != loss_mask.shape:
        raise ValueError(
            f"shapes disagree: logits {tuple(logits.shape)}, labels {tuple(labels.shape)}, "
            f"loss_mask {tuple(loss_mask.shape)}"
        )
    mask = loss_mask[:, 1:].bool()
    targets = labels[:, 1:].masked_fill(~mask, 0)
    per_token = token_logps(logits[:, :-1], targets) * mask
    n_tokens = mask.sum(-1)
    total = per_token.sum(-1)
    if average:
        return total / n_tokens.clamp(min=1), n_tokens
    return total, n_tokens
