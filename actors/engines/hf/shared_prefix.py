"""Prompt prefixes shared by the rows of one decode call, run through the model once (`actors.engines.hf.decode`).

A judge's instructions and few-shot examples start every prompt of a call; a call may also mix templates (a
generate batch spanning two policies), so rows are grouped by the prefixes that save the most prefill
(`plan_prefixes`) and each group's prefix gets its own keys/values. What a group then does with them depends on
how much attention they would cost:

- *held*: kept once, outside the rows' buffers, and attended to by all the group's rows together
  (`actors.engines.hf.prefix_attention`, cascade attention). Worth it when (rows - 1) x prefix length is large: a judge's
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

from actors.engines.hf.kv_rows import RowKVLayer


class PromptRow(Protocol):
    """What prefix sharing needs of a decode row (`actors.engines.hf.decode.DecodeRow`, which imports this module)."""

    prompt_ids: list[int]


class PrefixSettings(Protocol):
    """What it needs of `actors.engines.hf.decode.DecodeSettings`."""

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


def common_prefix_length(sequences: list[list[int]], start: int = 0) -> int:
    """Length of the longest list that starts every sequence (all of them known to share their first `start`).

    >>> common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]])
    2
    """
    first, length = sequences[0], min(len(seq) for seq in sequences)
    for seq in sequences[1:]:
        length = next((i for i in range(start, length) if seq[i] != first[i]), length)
    return length


def plan_prefixes(prompts: list[list[int]], min_length: int, min_saved: int) -> list[tuple[list[int], int]]:
    """Which prompts share which prefix, as (prompt indices, prefix length) groups chosen to save the most prefill.

    A row's KV layout has room for one shared part, so each prompt joins at most one group. Think of the prompts as
    a trie: at each branch point either all the prompts below it share the prefix up to there, or each branch plans
    its own groups (and the rows no branch grouped share the prefix up to there), whichever saves more. A group of
    n rows sharing L tokens saves (n - 1) x L prompt tokens of prefill, less `min_saved` for the extra forward pass
    that computes the prefix (a 30-layer pass has a fixed cost of several ms on CPU, and a one-row pass runs its
    matmuls less efficiently than a batch), and must save at least 0 that way; a prefix is at least `min_length`
    tokens and leaves every row its last prompt token (its prefill must produce logits). So two templates opening
    with the same system prompt each share their own instructions rather than all rows sharing only the system
    prompt. On `bench.generate` (32 prompts opening with the same 44 tokens, 16 rows) sharing took prefill from
    1.7 s to 0.9 s of a 5.7 s call.

    >>> plan_prefixes([[1, 2, 3], [1, 2, 4], [5, 6]], 2, 0)
    [([0, 1], 2)]
    >>> plan_prefixes([[7, 1, 1, 9], [7, 1, 1, 8], [7, 2, 2, 9], [7, 2, 2, 8]], 1, 1)  # 3 x 1 - 1 < 2 x (3 - 1)
    [([0, 1], 3), ([2, 3], 3)]
    """
    def plan(index: list[int], start: int, depth: int) -> tuple[int, list[tuple[list[int], int]]]:
        # every prompt of `index` is known to start with the same `start` tokens
        if len(index) < 2:
            return 0, []
        group = [prompts[i] for i in index]
        length = min(common_prefix_length(group, start), min(len(p) for p in group) - 1)
        share = (len(index) - 1) * length - min_saved if length >= min_length else -1
        # the rows that go on past `length`, by their next token (a row at its last token stops here)
        branches: dict[int, list[int]] = {}
        for i in index:
            if len(prompts[i]) - 1 > length:
                branches.setdefault(prompts[i][length], []).append(i)
        value, groups = 0, []
        if depth < _MAX_PLAN_DEPTH:
            for branch in branches.values():
                branch_value, branch_groups = plan(branch, length + 1, depth + 1)
                value, groups = value + branch_value, groups + branch_groups
        # the rows no branch grouped may still share this node's prefix among themselves
        grouped = {i for members, _ in groups for i in members}
        rest = [i for i in index if i not in grouped]
        rest_share = (len(rest) - 1) * length - min_saved if length >= min_length and len(rest) >= 2 else -1
        if rest_share >= 0:
            value, groups = value + rest_share, [*groups, (rest, length)]
        if share >= 0 and share >= value:
            return share, [(index, length)]
        return value, groups

    return sorted(plan(list(range(len(prompts))), 0, 0)[1], key=lambda group: group[0][0])


# Branch points followed below one another (each drops at least one prompt; a deeper trie is planned as if flat there).
_MAX_PLAN_DEPTH = 256


def shared_prefixes(model: torch.nn.Module, rows: list[PromptRow],
                     settings: PrefixSettings) -> dict[int, SharedPrefix]:
    """The shared prefix of each row's group (`plan_prefixes`), keyed by `id(row)`; rows without one are absent."""
    if settings.min_shared_prefix <= 0:
        return {}
    out: dict[int, SharedPrefix] = {}
    prompts = [row.prompt_ids for row in rows]
    for index, length in plan_prefixes(prompts, settings.min_shared_prefix, settings.min_saved_prefix_tokens):
        prefix = _shared_prefix(model, prompts[index[0]][:length], len(index), settings)
        out.update((id(rows[i]), prefix) for i in index)
    return out


def _shared_prefix(model: torch.nn.Module, tokens: list[int], rows: int, settings: PrefixSettings) -> SharedPrefix:
    """Run the prompt start `tokens`, shared by `rows` rows, through the model once."""
    length = len(tokens)
    ids = torch.tensor([tokens], device=model.device)
    cache = Cache(layers=[RowKVLayer(length) for _ in range(settings.num_layers)])
    extra = {"logits_to_keep": 1} if settings.logits_to_keep else {}
    positions = torch.arange(length, device=ids.device)[None]
    model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions,
          past_key_values=cache, use_cache=True, **extra)
    return SharedPrefix(length, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                        held=hold_prefix(length, rows, settings.min_held_prefix_columns))
