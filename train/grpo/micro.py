"""One GRPO micro-batch on the policy: its completion log-probs (chunked or from full logits) and the
clipped-surrogate loss. Torch, transformers and peft only (no ray, no deepspeed), so the Ray Train loop
(`train.grpo.loop`) and the bare-GPU check (`bench.gpu_check`) run the very same code.

`engine` is anything with a forward, `.module` (the peft model) and `.device`: the DeepSpeed engine in the loop, a
thin wrapper around the peft model elsewhere.
"""

from __future__ import annotations

import contextlib

import torch

from train.config import GRPOConfig
from train.grpo.advantages import aggregate_token_losses, grpo_policy_loss
from train.grpo.batch import completion_logps, completion_window
from train.logprobs import chunked_token_logps, final_hidden, token_entropy
from train.precision import autocast

Metrics = dict[str, float]


def policy_logps(engine, batch: dict, part: slice, cfg: GRPOConfig, no_grad: bool = False, reference: bool = False,
                 entropy: bool = False, head=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(per-token completion log-probs, mask, per-token entropy or None) of one micro-batch of the left-padded
    batch, over its trailing completion window; `reference` disables the LoRA adapter.

    With `logprob_chunk_tokens` the vocabulary projection runs chunk by chunk on the final hidden states
    (`train.logprobs.chunked_token_logps`) with `head` (default: the output embedding module; under ZeRO-3 the
    loop passes `train.engine.output_head`), so no (b, T, V) logits exist; else the model's own logits of the window.
    """
    keep = completion_window(batch["loss_mask"])  # the whole batch's window: every micro-batch aligns with `old`
    context = engine.module.disable_adapter() if reference else contextlib.nullcontext()
    ids, loss_mask = batch["input_ids"][part, -keep:], batch["loss_mask"][part, -keep:]
    inputs = {"input_ids": batch["input_ids"][part], "attention_mask": batch["attention_mask"][part],
              "position_ids": batch["position_ids"][part], "use_cache": False}
    with torch.set_grad_enabled(not no_grad), context, autocast(cfg.precision, engine.device):
        if not cfg.logprob_chunk_tokens:
            logits = engine(**inputs, logits_to_keep=keep).logits
            logps, mask = completion_logps(logits, ids, loss_mask)
            # entropy keeps its graph only when it is part of the loss
            with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.entropy_coef > 0):
                ent = token_entropy(logits[:, :-1]) if entropy else None
            return logps, mask, ent
        hidden = final_hidden(engine, inputs, grad=not no_grad)[:, -keep:-1]
        mask = loss_mask[:, 1:].bool()
        logps, ent = chunked_token_logps(hidden, head or engine.module.get_output_embeddings(),
                                         ids[:, 1:].masked_fill(~mask, 0), cfg.logprob_chunk_tokens, entropy)
    if ent is not None and cfg.entropy_coef == 0:
        ent = ent.detach()
    return logps * mask, mask, ent


def micro_loss(engine, cfg: GRPOConfig, batch: dict, part: slice, advantages: torch.Tensor, valid: torch.Tensor,
               old: torch.Tensor | None, ref: torch.Tensor | None, head=None) -> tuple[torch.Tensor, Metrics]:
    """The clipped-surrogate loss over the micro-batch's rollouts of successful groups.

    Every row is forwarded (collectives stay aligned); only valid rows enter the loss, so a failed group neither
    adds gradient nor dilutes the average. A micro-batch without valid rows gives a zero loss with a graph.

    Returns:
        The loss and token-weighted metric sums (``*_wsum`` over ``loss_tokens``).
    """
    logps, mask, entropy = policy_logps(engine, batch, part, cfg, entropy=True, head=head)
    keep = valid.nonzero().squeeze(-1)
    if keep.numel() == 0:
        return logps.sum() * 0.0, {"loss_tokens": 0.0}
    kept_mask = mask[keep]
    loss, metrics = grpo_policy_loss(
        logps[keep], (old if old is not None else logps.detach())[keep], advantages[keep], kept_mask,
        clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, loss_agg=cfg.loss_agg,
        max_len=cfg.max_completion_length, ref_logps=ref[keep] if ref is not None else None, kl_coef=cfg.kl_coef,
        kl_kind=cfg.kl_kind)
    entropy = entropy[keep]
    if cfg.entropy_coef > 0:
        bonus = aggregate_token_losses(entropy, kept_mask, cfg.loss_agg, cfg.max_completion_length)
        loss = loss - cfg.entropy_coef * bonus
    entropy = entropy.detach()
    with torch.no_grad():
        tokens = float(kept_mask.sum())
        out = {f"{k}_wsum": float(v) * tokens for k, v in metrics.items()}
        out["entropy_wsum"] = float((entropy * kept_mask).sum())
        out["loss_wsum"] = float(loss.detach()) * tokens
    return loss, out | {"loss_tokens": tokens}
