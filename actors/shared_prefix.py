"""Prompt prefixes shared by the rows of one decode call, run through the model once (`actors.hf_decode`).

A judge's instructions and few-shot examples start every prompt of a call; a call may also mix templates (a
generate batch spanning two policies), so rows are grouped by their leading tokens and each group's common prefix
gets its own keys/values. What a group then does with them depends on how much attention they would cost:

- *held*: kept once, outside the rows' buffers, and attended to by all the group's rows together
  (`actors.prefix_attention`, cascade attention). Worth it when (rows - 1) x prefix length is large: a judge's
  ~640-token rubric shared by 64 rows saves ~40,000 columns per layer and step;
- *copied*: written into every row's buffer at prefill, attended to as the rows' own columns. The cascade path
  costs ~20 small tensor ops per group, layer and step, which a short prefix shared by two or three rows (the
  same sentence asked of several samplers) never pays back: 128 `bench.generate` prompts in groups of 2-3 decoded
  at 135-147 tok/s held, 176-183 copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import Cache

from actors.kv_rows import RowKVLayer


class PromptRow(Protocol):
    """What prefix sharing needs of a decode row (`actors.hf_decode.DecodeRow`, which imports this module)."""

    prompt_ids: list[int]


class PrefixSettings(Protocol):
    """What it needs of `actors.hf_decode.DecodeSettings`."""

    min_shared_prefix: int
    min_saved_prefix_tokens: int
    min_held_prefix_columns: int
    num_layers: int
    logits_to_keep: bool


@dataclass
class SharedPrefix:
    """Per-layer keys/values, shape (1, kv_heads, length, head_dim), of the prompt start shared by all rows."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    # held once and attended to by the group (cascade), else copied into each row's buffer at prefill
    held: bool = True


def hold_prefix(length: int, rows: int, min_columns: int) -> bool:
    """Whether a prefix of `length` tokens shared by `rows` rows is held once rather than copied into every row:
    it must save at least `min_columns` attention columns per layer and step ((rows - 1) x length; 0 = always).

    >>> hold_prefix(640, 64, 2048), hold_prefix(70, 3, 2048), hold_prefix(70, 3, 0)
    (True, False, True)
    """
    return (rows - 1) * length >= min_columns


def worth_sharing(length: int, rows: int, min_length: int, min_saved: int) -> bool:
    """Whether a prefix of `length` tokens common to `rows` prompts is prefilled once rather than in every row.

    Computing it apart costs one more forward pass (a 30-layer pass has a fixed cost of several ms on CPU, and a
    one-row pass runs its matmuls less efficiently than a batch); it saves (rows - 1) x length prompt tokens of
    prefill, which must reach `min_saved`. On `bench.generate` (32 prompts opening with the same 44 tokens, 16
    rows) sharing took prefill from 1.7 s to 0.7 s of a 5.7 s call.

    >>> worth_sharing(44, 32, 16, 128), worth_sharing(44, 3, 16, 128), worth_sharing(10, 32, 16, 128)
    (True, False, False)
    """
    return length >= min_length and (rows - 1) * length >= min_saved


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest list that starts every sequence.

    >>> common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]])
    2
    """
    first, length = sequences[0], min(len(seq) for seq in sequences)
    for seq in sequences[1:]:
        length = next((i for i in range(length) if seq[i] != first[i]), length)
    return length


def prefix_groups(prompts: list[list[int]], min_length: int) -> list[list[int]]:
    """Indices of the prompts grouped by their first `min_length` tokens, groups in first-appearance order.

    One call can hold prompts of several templates (a generate batch spanning two policies, a jury of two
    guidelines): each group then shares its own prefix. A prompt no longer than `min_length` is a group alone.

    >>> prefix_groups([[1, 2, 3], [4, 5, 6], [1, 2, 7], [1, 2]], 2)
    [[0, 2], [1], [3]]
    """
    groups: dict[tuple, list[int]] = {}
    for i, prompt in enumerate(prompts):
        key = tuple(prompt[:min_length]) if min_length > 0 and len(prompt) > min_length else ("alone", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def shared_prefixes(model: torch.nn.Module, rows: list[PromptRow],
                     settings: PrefixSettings) -> dict[int, SharedPrefix]:
    """The shared prefix of each row's group (`prefix_groups`), keyed by `id(row)`; rows without one are absent."""
    out: dict[int, SharedPrefix] = {}
    for group in prefix_groups([row.prompt_ids for row in rows], settings.min_shared_prefix):
        members = [rows[i] for i in group]
        prefix = _shared_prefix(model, members, settings)
        if prefix is not None:
            out.update((id(row), prefix) for row in members)
    return out


def _shared_prefix(model: torch.nn.Module, rows: list[PromptRow], settings: PrefixSettings) -> SharedPrefix | None:
    """Run the prompt start that all `rows` share through the model once, if it pays off (`worth_sharing`).

    Each row keeps at least its last prompt token out of the prefix: its prefill must produce logits.
    """
    if settings.min_shared_prefix <= 0 or len(rows) < 2:
        return None
    prompts = [row.prompt_ids for row in rows]
    length = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
    if not worth_sharing(length, len(rows), settings.min_shared_prefix, settings.min_saved_prefix_tokens):
        return None
    ids = torch.tensor([prompts[0][:length]], device=model.device)
    cache = Cache(layers=[RowKVLayer(length) for _ in range(settings.num_layers)])
    extra = {"logits_to_keep": 1} if settings.logits_to_keep else {}
    positions = torch.arange(length, device=ids.device)[None]
    model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions,
          past_key_values=cache, use_cache=True, **extra)
    return SharedPrefix(length, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                        held=hold_prefix(length, len(rows), settings.min_held_prefix_columns))
