"""The policy's weights as (name, tensor) pairs for a full weight sync into the colocated vLLM engine
(`train.grpo.rollout_vllm.VLLMRollout.sync_full`), one parameter at a time.

Under ZeRO-3 each parameter is gathered on every rank (`deepspeed.zero.GatheredParameters`, a collective) only while
the engine loads it, so the transient is one parameter, not the model (OpenRLHF's `broadcast_to_vllm` and verl's
sharding manager gather the same way; TRL's colocate mode gathers all at once under ZeRO-3 unless told otherwise).
Every rank walks the same parameters in the same order: its own engine (tensor-parallel group of one) loads them all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def gathered_weights(module: torch.nn.Module, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, full tensor) of every parameter of `module`, each gathered only until the next is asked
    for. A tied output head is the embedding's parameter and comes once (`named_parameters` skips repeats); vLLM's
    `load_weights` of a tied model skips `lm_head.weight` too."""
    for name, param in module.named_parameters():
        gathered = _gathered(param) if zero3 else contextlib.nullcontext()
        with gathered, torch.no_grad():
            yield name, param.data


def _gathered(param: torch.nn.Parameter):
    import deepspeed

    return deepspeed.zero.GatheredParameters([param])
