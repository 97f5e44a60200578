"""Per-token and per-sequence log-probabilities from causal-LM logits (pure torch).

Every preference loss in `train/preference/losses.py` and the GRPO maths in `train/grpo/advantages.py` consume the outputs of
these functions, so the shift-by-one convention lives here and nowhere else:

    logits[:, t] is the model's prediction for token labels[:, t + 1].

`sequence_logps` therefore scores labels[:, 1:] with logits[:, :-1] and reads the loss mask on the *label*
positions (loss_mask[:, 1:]). This is the convention of TRL's `CPOTrainer.get_batch_logps` and HF's causal-LM
loss; position 0 is never scored (nothing predicts it) and the last logit row is never used.

    logps, n_tokens = sequence_logps(model(input_ids).logits, input_ids, completion_mask)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


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


def _chunk_logps(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, labels: torch.Tensor,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    logps = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logps, logps.new_zeros(())
    return logps, lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def chunked_token_logps(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logps` (and `token_entropy`) from final hidden states, never holding more than one chunk of logits.

    The (b, T) positions are flattened and taken `chunk_tokens` at a time: the output head projects the chunk,
    its log-softmax is gathered at the labels in float32, and the chunk's logits are dropped. With autograd on,
    each chunk runs under non-reentrant `torch.utils.checkpoint`, so backward recomputes that chunk's logits
    instead of keeping them: peak extra memory is one (chunk, V) block, not (b, T, V), with the same values and
    gradients (for the hidden states and the head alike). This is the chunked log-prob of verl's and OpenRLHF's
    trainers and Liger's fused linear cross-entropy, written here because none of them is a dependency and the
    GRPO loss needs the per-token values, not a reduced loss. No shift: ``hidden[i, t]`` scores ``labels[i, t]``.

    Args:
        hidden: Final (post-norm) hidden states. Shape: (b, T, H).
        head: The output projection, (n, H) -> (n, V) logits: the output embedding module, or under ZeRO-3 a
            function of its gathered weight (`train.engine.output_head`): a partitioned module would gather at each
            call, a collective whose count (chunks) differs between ranks. A head with ``chunked_logps`` (the
            trainable partitioned head, `train.engine.GatheringHead`) computes the whole call itself
            (`GatheredChunkedLogps`).
        labels: Token ids in ``[0, V)``. Shape: (b, T).
        chunk_tokens: Positions per chunk (> 0).
        with_entropy: Also return the next-token entropy (nats) at every position.

    Returns:
        ``(logps, entropy)``: float32, Shape: (b, T) each; entropy is None unless asked for.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree on (b, T)")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens: must be >= 1, got {chunk_tokens}")
    if hasattr(head, "chunked_logps"):  # a head whose weight must be gathered (`GatheredChunkedLogps`)
        return head.chunked_logps(hidden, labels, chunk_tokens, with_entropy)
    flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", list)()))
    logps, entropy = [], []
    for start in range(0, flat_labels.shape[0], chunk_tokens):
        args = (flat_hidden[start:start + chunk_tokens], flat_labels[start:start + chunk_tokens])
        if recompute:
            out = checkpoint(lambda h, y: _chunk_logps(head, h, y, with_entropy), *args, use_reentrant=False,
                             preserve_rng_state=False)
        else:
            out = _chunk_logps(head, *args, with_entropy)
        logps.append(out[0])
        entropy.append(out[1])
    shape = labels.shape
    if not logps:  # no positions at all
        empty = hidden.new_zeros(shape, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    return torch.cat(logps).reshape(shape), torch.cat(entropy).reshape(shape) if with_entropy else None


class GatheredChunkedLogps(torch.autograd.Function):
    """`chunked_token_logps` through a weight that must be gathered to be used (ZeRO-3's partitioned, trainable
    output head): `gather()` is entered once in forward and once in backward, whatever the number of chunks, so
    every rank makes the same collectives however long its batch. Call `apply` inside `gather()`, with the
    parameter itself as `weight`: its gradient, the full (V, H) matrix summed over the chunks, reaches the parameter
    through autograd as the model's own projection's would. Backward recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens, with_entropy, gather):
        ctx.save_for_backward(hidden, labels)
        ctx.weight, ctx.chunk_tokens, ctx.with_entropy, ctx.gather = weight, chunk_tokens, with_entropy, gather
        with torch.no_grad():
            logps, entropy = chunked_token_logps(hidden, lambda h: torch.nn.functional.linear(h, weight), labels,
                                                 chunk_tokens, with_entropy)
        return logps, entropy if entropy is not None else logps.new_zeros(())

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        hidden, labels = ctx.saved_tensors
        flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
        flat_grad = grad_logps.reshape(-1)
        flat_grad_entropy = grad_entropy.reshape(-1) if ctx.with_entropy else None
        grad_hidden = torch.zeros_like(flat_hidden)
        with ctx.gather():
            weight = ctx.weight.detach().requires_grad_(True)
            with torch.enable_grad():
                for start in range(0, flat_labels.shape[0], ctx.chunk_tokens):
                    part = slice(start, start + ctx.chunk_tokens)
                    h = flat_hidden[part].detach().requires_grad_(True)
                    logps, entropy = _chunk_logps(lambda x: torch.nn.functional.linear(x, weight), h,
                                                  flat_labels[part], ctx.with_entropy)
                    outputs, grads = [logps], [flat_grad[part]]
                    if ctx.with_entropy:
                        outputs.append(entropy)
                        grads.append(flat_grad_entropy[part])
                    torch.autograd.backward(outputs, grads)
                    grad_hidden[part] = h.grad
            grad_weight = weight.grad if weight.grad is not None else torch.zeros_like(weight)
        return grad_hidden.reshape(hidden.shape), grad_weight, None, None, None, None


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


def final_hidden(engine, inputs: dict, grad: bool) -> torch.Tensor:
    """The final (post-norm) hidden states of a forward, without the vocabulary projection of every position.

    With autograd the forward must go through the DeepSpeed engine, whose hooks on its outputs start the backward
    (ZeRO's backward prologue): the model returns its hidden states (HF ties the last one to the normed
    ``last_hidden_state``) and projects only one position. Without autograd the decoder is called directly, so the
    per-layer hidden states are never all held at once.
    """
    if grad:
        if getattr(engine.module.config, "tie_last_hidden_states", True) is False:
            raise ValueError("logprob_chunk_tokens: this model's last hidden state is not its normed output "
                             "(config.tie_last_hidden_states is false); set logprob_chunk_tokens: 0")
        return engine(**inputs, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
    return engine.module.get_decoder()(**inputs).last_hidden_state
