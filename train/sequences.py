"""Preference pairs (and SFT targets) -> token ids -> padded tensors, plus the deterministic per-rank batch plan.

Pure: torch and a Hugging Face tokenizer passed in by the caller; no ray, no deepspeed. The Ray Train loop
(`train/preference/loop.py`) calls these per micro-batch:

    pair = encode_pair(tokenizer, row, max_prompt_length=256, max_completion_length=128, system_instruction=s_p)
    batch = collate_pairs([pair, ...], pad_id=tokenizer.pad_token_id)      # chosen rows first, then rejected
    logits = model(batch["input_ids"], attention_mask=..., position_ids=...).logits
    logps, n_tokens = sequence_logps(logits, batch["input_ids"], batch["loss_mask"])

Row formats:
    * preference: ``{"prompt_messages": [...] | "<json>", "chosen": ..., "rejected": ...}``
    * SFT:        ``{"prompt_messages": [...] | "<json>", "target": ...}``
  ``prompt_messages`` are chat messages (a list, or that list as a JSON string; a plain string is one user turn).
  A response is a string or TRL's conversational form ``[{"role": "assistant", "content": ...}]``.

Prompts go through the tokenizer's chat template with the generation prompt (paper 000 trains with the system
instruction + the source as the user turn, no few-shot). The completion's tokens are what the template adds for the
assistant turn, up to and including the end-of-turn token, so the model learns to stop. Labels (the loss mask) cover
the completion only. Truncation: the prompt keeps its *last* ``max_prompt_length`` tokens (the assistant header must
survive; TRL's ``keep_end``), the completion keeps its *first* ``max_completion_length`` tokens.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from typing import Any

import torch

# ---------------------------------------------------------------------------------------------------------------
# Messages and chat templates


def parse_messages(value: Any) -> list[dict]:
    """Normalise a row's ``prompt_messages`` to a list of ``{"role", "content"}`` dicts.

    Args:
        value: A list of messages, that list serialised as JSON, or a plain string (taken as one user turn).

    Returns:
        The messages as a new list.

    Raises:
        ValueError: the value is neither, or a message lacks ``role``/``content``.
    """
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ValueError(f"prompt_messages: expected a non-empty list of chat messages, got {value!r:.80}")
    for message in value:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"prompt_messages: every message needs 'role' and 'content', got {message!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def response_text(value: Any) -> str:
    """The text of a response given as a string or as TRL's ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return str(value[-1]["content"])
    raise ValueError(f"response: expected a string or a list of assistant messages, got {value!r:.80}")


def _apply_template(tokenizer: Any, messages: list[dict], add_generation_prompt: bool, **kwargs: Any) -> str:
    """Render messages; a template that rejects the system role gets the system text merged into the first user
    turn (the fallback paper 000's setting needs for models without a system role). `kwargs` reach the template
    (Qwen3's ``enable_thinking``; templates that do not read a variable ignore it)."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **kwargs)
    except Exception:  # jinja2 raises TemplateError via the template's raise_exception; the type varies
        if messages[0]["role"] != "system" or len(messages) < 2:
            raise
        system, first, *rest = messages
        merged = {"role": first["role"], "content": f"{system['content']}\n\n{first['content']}"}
        return tokenizer.apply_chat_template([merged, *rest], tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kwargs)


def render_prompt(tokenizer: Any, messages: list[dict], system_instruction: str = "", **template_kwargs: Any) -> str:
    """Chat-templated prompt text ending with the assistant header.

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: Prompt messages (system and user turns).
        system_instruction: Prepended as the system turn when `messages` has none. Leave it empty only if the
            rows carry their own system turn: SmolLM2's template otherwise inserts its default system prompt.
        template_kwargs: Extra chat-template variables (``enable_thinking=False`` for Qwen3's non-thinking mode).

    Returns:
        The prompt text.
    """
    if system_instruction and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_instruction}, *messages]
    return _apply_template(tokenizer, messages, add_generation_prompt=True, **template_kwargs)


def completion_suffix(tokenizer: Any, messages: list[dict], prompt_text: str, response: str) -> str:
    """The text the chat template appends after `prompt_text` for an assistant turn holding `response`.

    It is cut after the last end-of-sequence token (ChatML appends a newline after ``<|im_end|>`` that the model
    never needs to predict). A template whose full rendering does not extend the prompt falls back to
    ``response + eos``.
    """
    full = _apply_template(tokenizer, [*messages, {"role": "assistant", "content": response}], False)
    eos = tokenizer.eos_token or ""
    if not full.startswith(prompt_text):
        return response + eos
    suffix = full[len(prompt_text):]
    cut = suffix.rfind(eos) if eos else -1
    return suffix[: cut + len(eos)] if cut >= 0 else suffix


# ---------------------------------------------------------------------------------------------------------------
# Encoding rows


@dataclasses.dataclass
class EncodedPair:
    """Token ids of one preference pair; chosen and rejected share the prompt."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


@dataclasses.dataclass
class EncodedTarget:
    """Token ids of one SFT example."""

    prompt_ids: list[int]
    target_ids: list[int]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt_and_completions(
    tokenizer: Any, row: dict, keys: tuple[str, ...], max_prompt_length: int, max_completion_length: int,
    system_instruction: str,
) -> tuple[list[int], list[list[int]]]:
    messages = parse_messages(row["prompt_messages"])
    if system_instruction and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_instruction}, *messages]
    prompt_text = render_prompt(tokenizer, messages)
    prompt_ids = _ids(tokenizer, prompt_text)[-max_prompt_length:]
    completions = []
    for key in keys:
        suffix = completion_suffix(tokenizer, messages, prompt_text, response_text(row[key]))
        completions.append(_ids(tokenizer, suffix)[:max_completion_length])
    return prompt_ids, completions


def encode_pair(
    tokenizer: Any, row: dict, max_prompt_length: int, max_completion_length: int, system_instruction: str = ""
) -> EncodedPair:
    """Tokenize one ``{prompt_messages, chosen, rejected}`` row with the truncation rules of the module docstring."""
    prompt_ids, (chosen, rejected) = _prompt_and_completions(
        tokenizer, row, ("chosen", "rejected"), max_prompt_length, max_completion_length, system_instruction
    )
    return EncodedPair(prompt_ids, chosen, rejected)


def encode_target(
    tokenizer: Any, row: dict, max_prompt_length: int, max_completion_length: int, system_instruction: str = ""
) -> EncodedTarget:
    """Tokenize one ``{prompt_messages, target}`` SFT row (same rules as `encode_pair`)."""
    prompt_ids, (target,) = _prompt_and_completions(
        tokenizer, row, ("target",), max_prompt_length, max_completion_length, system_instruction
    )
    return EncodedTarget(prompt_ids, target)


# ---------------------------------------------------------------------------------------------------------------
# Collation


def collate_sequences(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int, padding_side: str = "right"
) -> dict[str, torch.Tensor]:
    """Concatenate prompt + completion per row and pad to the longest row.

    Args:
        prompts: Prompt ids per row.
        completions: Completion ids per row (the only positions the loss sees).
        pad_id: Id written into padding positions (masked out everywhere).
        padding_side: "right" (training default) or "left".

    Returns:
        ``input_ids``, ``attention_mask``, ``loss_mask`` (1 on completion tokens) and ``position_ids``
        (counted over real tokens, so left padding gives the same positions as right padding), each
        Shape: (b, T), int64.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side: {padding_side!r} is not 'left' or 'right'")
    width = max(len(p) + len(c) for p, c in zip(prompts, completions))
    rows = {"input_ids": [], "attention_mask": [], "loss_mask": []}
    for prompt, completion in zip(prompts, completions):
        ids = prompt + completion
        pad = width - len(ids)
        parts = {"input_ids": (ids, [pad_id] * pad), "attention_mask": ([1] * len(ids), [0] * pad),
                 "loss_mask": ([0] * len(prompt) + [1] * len(completion), [0] * pad)}
        for key, (real, padding) in parts.items():
            rows[key].append(real + padding if padding_side == "right" else padding + real)
    batch = {key: torch.tensor(value, dtype=torch.long) for key, value in rows.items()}
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return batch


def collate_pairs(pairs: list[EncodedPair], pad_id: int, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """One batch for the concatenated forward: rows ``[0, b)`` are prompt+chosen, rows ``[b, 2b)`` prompt+rejected.

    Returns:
        As `collate_sequences`, Shape: (2b, T).
    """
    prompts = [p.prompt_ids for p in pairs] * 2
    completions = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    return collate_sequences(prompts, completions, pad_id, padding_side)


def collate_targets(
    targets: list[EncodedTarget], pad_id: int, padding_side: str = "right"
) -> dict[str, torch.Tensor]:
    """SFT batch: rows are prompt+target. Returns as `collate_sequences`, Shape: (b, T)."""
    return collate_sequences([t.prompt_ids for t in targets], [t.target_ids for t in targets], pad_id,
                             padding_side)


# ---------------------------------------------------------------------------------------------------------------
# Deterministic batch plan (what every rank reads at every optimizer step)


def steps_per_epoch(n_rows: int, global_batch: int) -> int:
    """Optimizer steps in one pass over the rows; the last partial global batch of an epoch is dropped."""
    if n_rows < global_batch:
        raise ValueError(f"{n_rows} training rows cannot fill one global batch of {global_batch} "
                         "(micro_batch_size x grad_accum x num_workers)")
    return n_rows // global_batch


def plan_total_steps(n_rows: int, global_batch: int, epochs: int, max_steps: int = 0) -> int:
    """Total optimizer steps: ``max_steps`` when > 0 (it overrides epochs, cycling the data as needed, as HF's
    Trainer does), else ``epochs`` full passes."""
    per_epoch = steps_per_epoch(n_rows, global_batch)
    return max_steps if max_steps > 0 else per_epoch * epochs


def step_row_indices(
    step: int, n_rows: int, micro_batch: int, grad_accum: int, world_size: int, rank: int, seed: int
) -> list[list[int]]:
    """Row indices of the `grad_accum` micro-batches `rank` consumes at 0-based optimizer step `step`.

    Epoch ``e`` visits the rows in the order of a ``random.Random(seed + e)`` shuffle. Step ``s`` of the epoch
    takes the ``G = micro × accum × world`` rows at ``[s·G, (s+1)·G)`` of that order, and micro-step ``a`` of rank
    ``r`` gets the ``micro`` rows at offset ``(a·world + r)·micro``. The plan depends only on the step number, so a
    run resumed at step k reads exactly what an uninterrupted run would.

    >>> rank0 = step_row_indices(0, 8, 2, 1, 2, 0, seed=0)
    >>> rank1 = step_row_indices(0, 8, 2, 1, 2, 1, seed=0)
    >>> len(rank0[0]), set(rank0[0]).isdisjoint(rank1[0])
    (2, True)
    """
    global_batch = micro_batch * grad_accum * world_size
    epoch, offset = divmod(step, steps_per_epoch(n_rows, global_batch))
    order = list(range(n_rows))
    random.Random(seed + epoch).shuffle(order)
    chunk = order[offset * global_batch:(offset + 1) * global_batch]
    return [chunk[(a * world_size + rank) * micro_batch:(a * world_size + rank + 1) * micro_batch]
            for a in range(grad_accum)]


def encode_prompt(tokenizer, row: dict, cfg) -> tuple[list[int], bool]:
    """Chat-templated prompt ids within `max_prompt_length`, and whether the user turn had to be shortened
    (`fit_prompt`: the system turn, e.g. a judge's rubric, is never cut).

    `cfg` is a GRPO trainer config (`train.config`): its `system_instruction`, `max_prompt_length` and `thinking`
    (passed to the chat template as ``enable_thinking``) are read.
    """

    def encode(messages: list[dict]) -> list[int]:
        text = render_prompt(tokenizer, messages, cfg.system_instruction, enable_thinking=cfg.thinking)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def content_ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return fit_prompt(parse_messages(row["prompt_messages"]), encode, content_ids, tokenizer.decode,
                      cfg.max_prompt_length)


def fit_prompt(messages: list[dict], encode: Callable[[list[dict]], list[int]],
               content_ids: Callable[[str], list[int]], decode: Callable[[list[int]], str],
               max_len: int) -> tuple[list[int], bool]:
    """Prompt ids within `max_len`, shortening only the last user turn's content (its tail goes).

    Cutting the rendered ids from the left, as before, dropped the system turn first: the judge lost its rubric
    and output format, the policy its instruction. The system turn and every earlier turn stay whole here.

    Args:
        messages: The prompt's turns (the last user turn is the one shortened).
        encode: Chat-templated ids of a message list (generation prompt included).
        content_ids / decode: Tokenize / detokenize a turn's content (no special tokens).
        max_len: The prompt budget (``grpo.max_prompt_length``).

    Returns:
        ``(ids, truncated)``.

    Raises:
        ValueError: the turns other than the last user turn alone exceed `max_len`.
    """
    ids = encode(messages)
    if len(ids) <= max_len:
        return ids, False
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    content = content_ids(messages[last]["content"])
    keep = len(content) - (len(ids) - max_len)
    # re-tokenizing a cut text can merge or split tokens at the seam: shrink by the remaining excess, a few times
    for _ in range(8):
        if keep <= 0:
            break
        shortened = [*messages[:last], {**messages[last], "content": decode(content[:keep])}, *messages[last + 1:]]
        ids = encode(shortened)
        if len(ids) <= max_len:
            return ids, True
        keep -= len(ids) - max_len
    raise ValueError(f"max_prompt_length: {max_len} tokens cannot hold this prompt's system turn and template "
                     f"even with an empty user turn; raise grpo.max_prompt_length")
