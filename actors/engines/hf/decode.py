"""Continuous-batching greedy/sampled decoding over a transformers causal LM's `forward` (not `generate`).

Why not `model.generate`: it keeps a batch until its longest row ends, re-copies the whole KV cache every step
(`DynamicLayer` grows by `torch.cat`) and pays per-step Python overhead in logits processors and stopping
criteria. Here:

- the KV cache is preallocated (`RowKVLayer`), every row writes its next token at the same column;
- a row that finishes leaves the batch and a waiting prompt takes its place (prefilled on its own, then
  merged in, right-aligned to the shared column), so the batch stays full until the queue runs dry;
- the prompt tokens that rows of a call start with (a judge's instructions and few-shot examples) are run
  through the model once per group of rows sharing them (a call may mix templates); a long prefix shared by many
  rows is kept once, outside the rows' buffers, and attended to by all the group's rows together
  (`actors.engines.hf.prefix_attention`), a short one is copied into each row's buffer (`actors.engines.hf.shared_prefix`); either way
  each prefill computes only the rest of its prompts;
- the tokens a row's grammar forces are fed with its last token in one forward where the batch's rows run in
  step (`actors.engines.hf.fast_forward`);
- greedy rows are one vectorised argmax; sampled rows draw from their own seeded `torch.Generator`, so a
  request's random stream does not depend on which other requests share its batch;
- with a `core.thread_tuner.ThreadTuner`, each decode step runs on the thread count it picks from the timed
  earlier steps (fewer threads when another process holds a core: an OpenMP barrier waits for a descheduled
  thread). Prefill runs on its current choice and is not timed: its cost is not comparable with a step's.

Greedy output is token-for-token what `generate(do_sample=False)` gives for the same left-padded prompt: the
same forward, the same position ids (`cumsum(mask) - 1`), the same argmax on float32 logits. A shared prefix
computed apart from the rest of the prompt, and attention merged from its part and the row's own part, sum in
another order than the joint forward: in float32 the tests find the same tokens, in bfloat16 they are close (not
bitwise; a near-tie can flip a greedy token). So do float32 prepacked layers (oneDNN) against the plain model's
(MKL): the same tokens on SmolLM2-135M (tests/test_hf_fast_path.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache

from actors.engines.base import SamplingParams
from actors.engines.hf.constrained import mask_logits
from actors.engines.hf.fast_forward import feed_inputs, feed_width, forced_tokens
from actors.engines.hf.finish import record_token
from actors.engines.hf.kv_rows import RowKVLayer, merge_layer, stack_layers
from actors.engines.hf.prefix_attention import PrefixGroup, prefix_groups_active
from actors.engines.hf.shared_prefix import SharedPrefix, shared_prefixes
from actors.engines.hf.token_sampling import choose_tokens
from actors.threads import use_threads
from core.thread_tuner import ThreadTuner


@dataclass
class DecodeRow:
    """One prompt being completed; the loop fills `token_ids` (EOS included, when it came) and `finish_reason`."""

    prompt_ids: list[int]
    sampling: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    # character offset in the decoded completion where the earliest stop string starts (-1: none)
    stop_at: int = -1
    generator: torch.Generator | None = None
    # an llguidance matcher when the request has a grammar (actors.engines.hf.constrained): it masks the logits of every
    # step and ends the row when the grammar is complete
    matcher: object | None = None
    # why the row failed ("" = it did not), e.g. a grammar that rejected a token
    error: str = ""
    # the prompt start it shares with other rows of the call (if held, its keys/values are not in the row's buffer)
    prefix: SharedPrefix | None = None


@dataclass
class _Batch:
    """The rows decoding together, their KV cache, and the tensors fed to the next forward."""

    rows: list[DecodeRow]
    cache: Cache
    # (rows, capacity) 1 where a column holds a real token of that row
    mask: torch.Tensor
    # (rows, 1) token to feed next and its position id
    next_ids: torch.Tensor
    next_pos: torch.Tensor
    length: int
    # which rows attend to which shared prefix first
    groups: list[PrefixGroup] = field(default_factory=list)


@dataclass
class DecodeSettings:
    """What the loop needs to know about the model beyond its forward."""

    eos_ids: frozenset[int]
    pad_id: int
    num_layers: int
    max_batch_size: int
    # decodes completion token ids to text (stop strings are searched in it)
    decode: Callable[[list[int]], str]
    # the model's forward accepts `logits_to_keep` (skip the LM head on prompt positions)
    logits_to_keep: bool = True
    # reuse the keys/values of a prompt prefix a group of rows shares when it has at least this many tokens (0 =
    # never) and saves at least `min_saved_prefix_tokens` of prefill ((rows - 1) x length; the groups are planned by
    # actors.engines.hf.shared_prefix.plan_prefixes)
    min_shared_prefix: int = 16
    min_saved_prefix_tokens: int = 128
    # hold a shared prefix once (cascade attention) when it saves at least this many attention columns per layer
    # and step, (rows - 1) x length; else copy it into the rows (actors.engines.hf.shared_prefix.hold_prefix)
    min_held_prefix_columns: int = 2048
    # padded prompt tokens per prefill forward (rows are split to fit; 0 = all admitted rows at once)
    prefill_token_budget: int = 4096
    # feed the tokens a row's grammar forces in one forward (actors.engines.hf.fast_forward) when at least
    # `fast_forward_min_fill` of the fed positions are real tokens; the KV buffers get `fast_forward_slack` extra
    # columns for the pads of rows that feed fewer
    fast_forward: bool = True
    fast_forward_min_fill: float = 0.75
    fast_forward_slack: int = 32


@dataclass
class DecodeStats:
    """Where the prompt tokens of one `run_decode` call went."""

    prompt_tokens: int = 0
    # prompt tokens run through the model in prefill passes (the shared prefix once; padding not counted)
    prefilled_tokens: int = 0
    shared_prefix_tokens: int = 0
    # decode steps run per torch thread count (prefill passes not counted)
    thread_steps: dict[int, int] = field(default_factory=dict)
    # grammar-forced tokens fed beside a row's last token (jump-forward), and the forwards that fed them
    forced_tokens: int = 0
    forced_steps: int = 0


def run_decode(model: torch.nn.Module, rows: list[DecodeRow], settings: DecodeSettings,
               tuner: ThreadTuner | None = None) -> DecodeStats:
    """Complete every row in place, keeping up to `settings.max_batch_size` rows in flight.

    Rows are admitted in the order given (callers sort by prompt length so co-admitted prompts need little
    padding). Freed slots are refilled once a quarter of the batch is free (or the queue can fill them all),
    which amortises a prefill pass over several prompts.

    Args:
        model: a causal LM taking `input_ids, attention_mask, position_ids, past_key_values`.
        rows: prompts with their sampling params; `token_ids`, `finish_reason`, `stop_at` are filled in.
        settings: EOS ids, pad id, layer count, batch size and the token decoder.
        tuner: picks each decode step's torch thread count and learns from its time (kept across calls by the
            caller); None = torch's thread count as it is.

    Returns:
        Prompt and prefill token counts (how much the shared prefix saved), decode steps per thread count.
    """
    stats = DecodeStats(prompt_tokens=sum(len(row.prompt_ids) for row in rows))
    for row in rows:
        if row.sampling.temperature > 0:
            row.generator = torch.Generator(device=model.device).manual_seed(row.sampling.seed)
    pending = deque(rows)
    refill_at = max(1, settings.max_batch_size // 4)
    batch: _Batch | None = None
    if tuner is not None:
        tuner.new_sequence()  # this call's first step has no neighbour in the last call
        use_threads(tuner.current)
    with torch.inference_mode():
        prefixes = shared_prefixes(model, rows, settings)
        stats.shared_prefix_tokens = stats.prefilled_tokens = sum(
            {id(p): p.length for p in prefixes.values()}.values())
        for row in rows:
            row.prefix = prefixes.get(id(row))
        while pending or batch is not None:
            live = [] if batch is None else [i for i, row in enumerate(batch.rows) if not row.finish_reason]
            free = settings.max_batch_size - len(live)
            admitted = None
            if pending and free >= min(refill_at, len(pending)):
                if tuner is not None:
                    use_threads(tuner.current)  # not a probe's count, if the last step was one
                admitted = _admit(model, [pending.popleft() for _ in range(min(free, len(pending)))], settings,
                                  stats)
            if batch is None or len(live) < len(batch.rows) or admitted is not None:
                batch = _merge(batch, live, admitted, settings.fast_forward_slack if settings.fast_forward else 0)
            if batch is not None:
                _timed_step(model, batch, settings, tuner, stats)
    if tuner is not None:
        use_threads(tuner.current)
    return stats


def _admit(model: torch.nn.Module, rows: list[DecodeRow], settings: DecodeSettings,
           stats: DecodeStats) -> _Batch | None:
    """Prefill `rows`, each prefix group on its own prefix, into one batch (None if every row ended at once)."""
    groups: dict[int, list[DecodeRow]] = {}
    for row in rows:
        groups.setdefault(id(row.prefix) if row.prefix else 0, []).append(row)
    admitted = None
    for members in groups.values():
        prefix = members[0].prefix
        part = _prefill(model, members, settings, prefix)
        skipped = prefix.length if prefix else 0
        stats.prefilled_tokens += sum(len(row.prompt_ids) - skipped for row in members)
        admitted = part if admitted is None else _merge(
            admitted, [i for i, row in enumerate(admitted.rows) if not row.finish_reason], part)
    return admitted


def _prefill(model: torch.nn.Module, rows: list[DecodeRow], settings: DecodeSettings,
             prefix: SharedPrefix | None = None) -> _Batch:
    """Run the prompts of `rows` (left-padded) through the model and choose each row's first token.

    With a shared prefix, only the rest of each prompt is computed; its position ids continue the prefix's,
    skipping the pads as they do for left padding. A held prefix is attended to, not stored ([pads | rest]
    columns, `actors.engines.hf.prefix_attention`); a copied one fills the first columns of every row ([prefix | pads | rest]).
    """
    device = model.device
    start = prefix.length if prefix else 0
    copied = start if prefix is not None and not prefix.held else 0
    rests = [row.prompt_ids[start:] for row in rows]
    width = max(len(rest) for rest in rests)
    ids = torch.full((len(rows), width), settings.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), copied + width), dtype=torch.long)
    mask[:, :copied] = 1
    for i, rest in enumerate(rests):
        ids[i, width - len(rest) :] = torch.tensor(rest)
        mask[i, copied + width - len(rest) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    # Same position ids as `generate`: count of real tokens so far (the prefix's included), pads at 0.
    positions = (mask.cumsum(-1) - 1 + start - copied).masked_fill(mask == 0, 0)[:, copied:]
    # a held prefix is attended to, not computed or stored: only the rest counts against the budget
    chunks = _row_chunks(len(rows), copied + width, settings.prefill_token_budget)
    parts, logits = [], []
    for chunk in chunks:
        cache = Cache(layers=[RowKVLayer(copied + width) for _ in range(settings.num_layers)])
        if copied:
            for layer, keys, values in zip(cache.layers, prefix.keys, prefix.values):
                layer.start_from(chunk.stop - chunk.start, keys, values)
        groups = [] if prefix is None or copied else [_group(prefix, range(chunk.stop - chunk.start), device)]
        extra = {"logits_to_keep": 1} if settings.logits_to_keep else {}
        with prefix_groups_active(groups):
            out = model(input_ids=ids[chunk], attention_mask=mask[chunk], position_ids=positions[chunk],
                        past_key_values=cache, use_cache=True, **extra)
        parts.append(cache)
        logits.append(out.logits[:, -1, :])
    cache = parts[0] if len(parts) == 1 else Cache(layers=[stack_layers([c.layers[i] for c in parts])
                                                           for i in range(settings.num_layers)])
    groups = [] if prefix is None or copied else [_group(prefix, range(len(rows)), device)]
    batch = _Batch(rows, cache, mask, ids[:, -1:], positions[:, -1:], copied + width, groups)
    _accept_tokens(batch, torch.cat(logits), settings)
    return batch


def _row_chunks(rows: int, width: int, budget: int) -> list[slice]:
    """Row ranges whose padded token count (rows x width) stays within `budget` (at least one row each).

    One forward over many long prompts materialises a (rows, heads, width, width) attention matrix on CPU
    (the masked SDPA path): 16 judge prompts of 2,900 tokens would need gigabytes per layer. Chunking the rows
    keeps prefill compute-bound; the chunks' caches are stacked back into one batch.
    """
    per_chunk = max(1, budget // max(width, 1)) if budget > 0 else rows
    return [slice(i, min(i + per_chunk, rows)) for i in range(0, rows, per_chunk)]


def _step(model: torch.nn.Module, batch: _Batch, settings: DecodeSettings, fed: list[list[int]]) -> None:
    """Feed every row its last token and the forced tokens `fed` (already recorded on it), append the next one."""
    width = 1 + max(map(len, fed), default=0)
    end = batch.length + width
    ids, positions, extra = batch.next_ids, batch.next_pos, {}
    if width == 1:
        batch.mask[:, batch.length] = 1
    else:
        ids, positions, columns = feed_inputs(batch.next_ids, batch.next_pos, fed, width, settings.pad_id)
        batch.mask[:, batch.length:end] = columns
        extra = {"logits_to_keep": 1} if settings.logits_to_keep else {}
    with prefix_groups_active(batch.groups):
        out = model(input_ids=ids, attention_mask=batch.mask[:, :end], position_ids=positions,
                    past_key_values=batch.cache, use_cache=True, **extra)
    batch.length = end
    batch.next_pos = positions[:, -1:]
    _accept_tokens(batch, out.logits[:, -1, :], settings)


def _forced_feed(batch: _Batch, settings: DecodeSettings) -> list[list[int]]:
    """Record on each row the forced tokens this step feeds (`feed_width` picks how many); [] per row for none."""
    if not settings.fast_forward or all(row.matcher is None for row in batch.rows):
        return [[] for _ in batch.rows]
    remaining = [row.sampling.max_tokens - len(row.token_ids) for row in batch.rows]
    forced = [forced_tokens(row.matcher, left) for row, left in zip(batch.rows, remaining)]
    width = feed_width([len(f) for f in forced], remaining, batch.length, batch.cache.layers[0].capacity,
                       settings.fast_forward_min_fill)
    fed = []
    for row, tokens in zip(batch.rows, forced):
        taken = []
        for token in tokens[:width - 1]:
            if row.finish_reason:  # the grammar completed, or the row ran out of tokens, on a forced token
                break
            record_token(row, token, settings.eos_ids, settings.decode)
            taken.append(token)
        fed.append(taken)
    return fed


def _timed_step(model: torch.nn.Module, batch: _Batch, settings: DecodeSettings, tuner: ThreadTuner | None,
                stats: DecodeStats) -> None:
    """`_step` on the tuner's thread count for this step, its wall time fed back; counted in `stats`."""
    fed = _forced_feed(batch, settings)
    if all(row.finish_reason for row in batch.rows):
        # every row ended on a forced token (its verdict's closing text): the forward's next tokens would be
        # dropped, so it is not run
        stats.forced_tokens += sum(map(len, fed))
        return
    if tuner is None:
        threads = torch.get_num_threads()
        _step(model, batch, settings, fed)
    elif any(fed):
        # a wider forward runs on the tuner's choice, never a probe, and is not timed: its time says nothing
        # about a step's
        threads = tuner.current
        use_threads(threads)
        _step(model, batch, settings, fed)
    else:
        threads = tuner.next_threads(len(batch.rows))
        use_threads(threads)
        start = time.perf_counter()
        _step(model, batch, settings, fed)
        tuner.record(threads, time.perf_counter() - start, len(batch.rows))
    stats.thread_steps[threads] = stats.thread_steps.get(threads, 0) + 1
    if any(fed):
        stats.forced_tokens += sum(map(len, fed))
        stats.forced_steps += 1


def _accept_tokens(batch: _Batch, logits: torch.Tensor, settings: DecodeSettings) -> None:
    """Choose one token per row from `logits` (rows, vocab) and update the rows and the next inputs."""
    logits = logits.float()
    if any(row.matcher is not None for row in batch.rows):
        mask_logits(logits, [None if row.finish_reason else row.matcher for row in batch.rows])
    tokens = choose_tokens(logits, batch.rows)
    batch.next_ids = tokens[:, None]
    batch.next_pos = batch.next_pos + 1
    for row, token in zip(batch.rows, tokens.tolist()):
        record_token(row, token, settings.eos_ids, settings.decode)


def _merge(old: _Batch | None, keep: list[int], new: _Batch | None, slack: int = 0) -> _Batch | None:
    """Build the next batch from the unfinished rows of `old` (indices `keep`) and the unfinished rows of `new`.

    The survivors' KV columns are copied right-aligned into fresh buffers sized for the longest remaining
    generation (+ `slack` columns), which also drops columns that only finished rows were using.
    """
    parts = [(old, keep)] if old is not None and keep else []
    if new is not None:
        new_keep = [i for i, row in enumerate(new.rows) if not row.finish_reason]
        parts += [(new, new_keep)] if new_keep else []
    if not parts:
        return None
    widths = [_used_width(batch, idx) for batch, idx in parts]
    width = max(widths)
    rows = [batch.rows[i] for batch, idx in parts for i in idx]
    capacity = width + max(row.sampling.max_tokens - len(row.token_ids) for row in rows) + 1 + slack
    layers = []
    for layer_idx in range(len(parts[0][0].cache.layers)):
        sources = [(batch.cache.layers[layer_idx], idx, w) for (batch, idx), w in zip(parts, widths)]
        layers.append(merge_layer(sources, capacity, width))
    masks = [batch.mask[idx, batch.length - w : batch.length] for (batch, idx), w in zip(parts, widths)]
    mask = torch.cat([_align(m, width) for m in masks])
    return _Batch(
        rows=rows,
        cache=Cache(layers=layers),
        mask=torch.nn.functional.pad(mask, (0, capacity - width)),
        next_ids=torch.cat([batch.next_ids[idx] for batch, idx in parts]),
        next_pos=torch.cat([batch.next_pos[idx] for batch, idx in parts]),
        length=width,
        groups=_groups_of(rows, mask.device),
    )


def _group(prefix: SharedPrefix, rows, device: torch.device) -> PrefixGroup:
    return PrefixGroup(torch.tensor(list(rows), dtype=torch.long, device=device), prefix.keys, prefix.values)


def _groups_of(rows: list[DecodeRow], device: torch.device) -> list[PrefixGroup]:
    """The rows of a merged batch grouped by the held prefix they share (rows without one are in no group)."""
    found: dict[int, tuple[SharedPrefix, list[int]]] = {}
    for i, row in enumerate(rows):
        if row.prefix is not None and row.prefix.held:
            found.setdefault(id(row.prefix), (row.prefix, []))[1].append(i)
    return [_group(prefix, idx, device) for prefix, idx in found.values()]


def _used_width(batch: _Batch, idx: list[int]) -> int:
    """Columns from the first one any kept row uses up to the write position."""
    used = batch.mask[idx, : batch.length].any(dim=0)
    first = int(used.int().argmax())
    return batch.length - first


def _align(columns: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the last dimension of `columns` with zeros to `width`."""
    return torch.nn.functional.pad(columns, (width - columns.shape[-1], 0))
