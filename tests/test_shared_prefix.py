"""Prompt prefixes shared by a call's rows (actors.engines.hf.shared_prefix): when they are shared, and that sharing gives the
tokens of the engine without it. Split from tests/test_hf_engine.py; tests/test_hf_engine_cuda.py runs both on a
GPU (`QUORUM_TEST_DEVICE=cuda`)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine, min_held_prefix_columns
from actors.engines.hf.shared_prefix import common_prefix_length, hold_prefix, plan_prefixes
from tests.engine_prompts import PROMPTS

DEVICE = os.environ.get("QUORUM_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One thread for tiny models (see tests/test_hf_engine.py); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _bench_like(rows: int, shared: int, rest: int) -> list[list[int]]:
    """`rows` prompts opening with the same `shared` tokens, then `rest` tokens of their own."""
    return [[1] * shared + [100 + i] * rest for i in range(rows)]


def test_plan_shares_a_short_prefix_among_many_rows_only():
    # 44 tokens x 31 other rows = 1,364 saved, less 128 for the prefix's own pass: shared
    assert plan_prefixes(_bench_like(32, 44, 20), 16, 128) == [(list(range(32)), 44)]
    # 3 rows: 44 x 2 = 88 < 128, not worth a pass; 10 tokens are under the minimum length
    assert plan_prefixes(_bench_like(3, 44, 20), 16, 128) == []
    assert plan_prefixes(_bench_like(3, 64, 20), 16, 128) == [([0, 1, 2], 64)]  # 64 x 2 = 128, just enough
    assert plan_prefixes(_bench_like(100, 10, 20), 16, 128) == []


def test_plan_gives_two_templates_with_one_system_prompt_their_own_prefixes():
    # 20 system tokens common to all six prompts, then 300 template tokens per template (3 prompts each, interleaved)
    system, templates = [1] * 20, ([2] * 300, [3] * 300)
    prompts = [system + templates[i % 2] + [100 + i] * 5 for i in range(6)]
    # all six sharing 20 tokens: 5 x 20 - 128 < 0; each template's three: 2 x 320 - 128 = 512 each
    assert plan_prefixes(prompts, 16, 128) == [([0, 2, 4], 320), ([1, 3, 5], 320)]


def _trunk_and_pairs(extra: int) -> list[list[int]]:
    """10 prompts opening with the same 40 tokens; two pairs among them share `extra` more, six go their own way."""
    base = [1] * 40
    prompts = [base + [2] * extra + [10], base + [2] * extra + [11],
               base + [3] * extra + [12], base + [3] * extra + [13]]
    return prompts + [base + [20 + i] * 5 for i in range(6)]


def test_plan_prefers_one_wide_group_when_it_saves_more():
    # all ten at 40 tokens: 9 x 40 - 128 = 232. A pair sharing 100: 1 x 100 - 128 < 0, so no branch is grouped and
    # the "rest" is all ten again: a tie, which the one group takes
    assert plan_prefixes(_trunk_and_pairs(60), 16, 128) == [(list(range(10)), 40)]


def test_plan_splits_when_the_branches_save_more_and_the_rest_share_the_trunk():
    # pairs sharing 340 tokens: 1 x 340 - 128 = 212 each; the six others share the 40-token trunk: 5 x 40 - 128 = 72;
    # 212 + 212 + 72 = 496 > 232 for all ten at 40
    assert plan_prefixes(_trunk_and_pairs(300), 16, 128) == [([0, 1], 340), ([2, 3], 340), ([4, 5, 6, 7, 8, 9], 40)]


def test_plan_leaves_every_row_its_last_token():
    # the shortest prompt (3 tokens) caps the group's prefix at 2; its longer siblings sharing 3 would save
    # 1 x 3 < 2 x 2
    assert plan_prefixes([[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5]], 1, 0) == [([0, 1, 2], 2)]
    # identical prompts share all but their last token
    assert plan_prefixes([[1, 2, 3, 4]] * 3, 1, 0) == [([0, 1, 2], 3)]
    assert plan_prefixes([[5]], 1, 0) == [] and plan_prefixes([], 1, 0) == []


# a shared prefix held once (cascade attention) or copied into every row (actors.engines.hf.shared_prefix.hold_prefix): the
# engine picks by the attention it saves; both must give the tokens of the engine without prefix reuse
HELD_OR_COPIED = pytest.mark.parametrize("min_held_columns", [0, 10**9], ids=["held", "copied"])


@HELD_OR_COPIED
def test_shared_prefix_is_prefilled_once_with_the_same_greedy_tokens(tiny_model_dir, min_held_columns):
    # a judge-like system prompt (> 64 tokens) shared by all six requests; four slots, so refills reuse it too
    system = "You judge simplifications. " + " ".join(f"Rule {i}: keep the meaning, use short words." for i in range(9))
    requests = [ChatRequest([{"role": "system", "content": system}, {"role": "user", "content": p}],
                            SamplingParams(max_tokens=4 + 2 * i)) for i, p in enumerate(PROMPTS)]
    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, max_batch_size=4)
    cached, plain = HFEngine(spec), HFEngine(dataclasses.replace(spec, enable_prefix_caching=False))
    cached.settings.min_held_prefix_columns = min_held_columns
    with_prefix, without = cached.generate(requests), plain.generate(requests)
    assert [c.raw_text for c in with_prefix] == [c.raw_text for c in without]
    assert [c.completion_tokens for c in with_prefix] == [c.completion_tokens for c in without]
    stats, plain_stats = cached.last_stats, plain.last_stats
    assert stats.prompt_tokens == plain_stats.prompt_tokens == sum(c.prompt_tokens for c in with_prefix)
    assert stats.shared_prefix_tokens >= 64 and plain_stats.shared_prefix_tokens == 0
    # the prefix ran once instead of six times
    assert stats.prefilled_tokens == stats.prompt_tokens - 5 * stats.shared_prefix_tokens
    assert plain_stats.prefilled_tokens == plain_stats.prompt_tokens
    # a lone request has nothing to share
    cached.generate(requests[:1])
    assert cached.last_stats.shared_prefix_tokens == 0


@HELD_OR_COPIED
def test_two_templates_in_one_call_each_share_their_own_prefix(tiny_model_dir, min_held_columns):
    # a generate batch spanning two policies: two system prompts (> 64 tokens each) opening with the same sentence,
    # three requests each, interleaved; each group's prefix runs once (not one prefix of the common sentence for
    # all six) and the tokens equal the engine without prefix reuse
    rules = " ".join(f"Rule {i}: keep the meaning, use short words." for i in range(9))
    opening = "You are a careful editor who helps people read. Follow every rule below exactly. "
    systems = [opening + "Task: simplify words. " + rules, opening + "Task: simplify structure. " + rules]
    requests = [ChatRequest([{"role": "system", "content": systems[i % 2]}, {"role": "user", "content": p}],
                            SamplingParams(max_tokens=3 + i)) for i, p in enumerate(PROMPTS[:6])]
    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, max_batch_size=4)
    cached, plain = HFEngine(spec), HFEngine(dataclasses.replace(spec, enable_prefix_caching=False))
    cached.settings.min_held_prefix_columns = min_held_columns
    assert [c.raw_text for c in cached.generate(requests)] == [c.raw_text for c in plain.generate(requests)]
    stats = cached.last_stats
    prefixes = [common_prefix_length([cached._encode(r.messages) for r in requests[g::2]]) for g in (0, 1)]
    assert min(prefixes) >= 64 and stats.shared_prefix_tokens == sum(prefixes)
    assert common_prefix_length([cached._encode(r.messages) for r in requests]) >= 16  # the opening all six share
    # each prefix counted once, skipped by its group's three prompts
    assert stats.prefilled_tokens == stats.prompt_tokens - 2 * sum(prefixes)


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 1], [6, 1]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3
    assert common_prefix_length([[9, 2, 3], [8, 2, 4]], start=1) == 2  # the caller vouches for the first token



def test_short_prefix_shared_by_many_rows_is_prefilled_once_and_few_rows_recompute_it(tiny_model_dir):
    # the bench's case: no system prompt, one instruction (~30 tokens with the chat template) opening every prompt
    instruction = "Simplify this sentence for a young reader, then explain what you changed.\n\nSentence: "
    requests = [ChatRequest([{"role": "user", "content": instruction + p}], SamplingParams(max_tokens=3))
                for p in PROMPTS * 2]
    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, max_batch_size=4)
    cached, plain = HFEngine(spec), HFEngine(dataclasses.replace(spec, enable_prefix_caching=False))
    assert [c.raw_text for c in cached.generate(requests)] == [c.raw_text for c in plain.generate(requests)]
    shared = common_prefix_length([cached._encode(r.messages) for r in requests])
    assert 16 <= shared < 64 and cached.last_stats.shared_prefix_tokens == shared
    assert cached.last_stats.prefilled_tokens == cached.last_stats.prompt_tokens - 11 * shared
    # three rows would save 2 x shared < 128 tokens: each computes the prefix itself
    cached.generate(requests[:3])
    assert cached.last_stats.shared_prefix_tokens == 0


def test_cuda_engines_copy_every_shared_prefix_and_cpu_engines_hold_long_ones():
    """Held prefixes halved an H100's decode rate (kernel launches; docs/engine.md); on CPU a judge rubric
    of 640 tokens shared by 64 rows is held, a 44-token prefix over 16 rows is copied."""
    cpu, cuda = min_held_prefix_columns(torch.device("cpu")), min_held_prefix_columns(torch.device("cuda"))
    assert hold_prefix(640, 64, cpu) and not hold_prefix(44, 16, cpu)
    assert not hold_prefix(640, 64, cuda) and not hold_prefix(4096, 1024, cuda)
