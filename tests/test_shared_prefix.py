"""Prompt prefixes shared by a call's rows (actors.shared_prefix): when they are shared, and that sharing gives the
tokens of the engine without it. Split from tests/test_hf_engine.py; tests/test_hf_engine_cuda.py runs both on a
GPU (`QUORUM_TEST_DEVICE=cuda`)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from actors.engine import ChatRequest, EngineSpec, SamplingParams
from actors.hf_engine import HFEngine
from actors.shared_prefix import common_prefix_length, prefix_groups, worth_sharing
from tests.engine_prompts import PROMPTS

DEVICE = os.environ.get("QUORUM_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One thread for tiny models (see tests/test_hf_engine.py); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_worth_sharing_weighs_the_prefill_it_saves():
    # 44 tokens x 31 other rows = 1,364 saved; 44 x 2 = 88 < 128; 10 tokens are under the minimum length
    assert worth_sharing(44, 32, 16, 128)
    assert not worth_sharing(44, 3, 16, 128)
    assert worth_sharing(64, 3, 16, 128)  # 64 x 2 = 128, just enough
    assert not worth_sharing(10, 100, 16, 128)


# a shared prefix held once (cascade attention) or copied into every row (actors.shared_prefix.hold_prefix): the
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
    # a generate batch spanning two policies: two system prompts (> 64 tokens each), three requests each,
    # interleaved; each group's prefix runs once and the tokens equal the engine without prefix reuse
    rules = " ".join(f"Rule {i}: keep the meaning, use short words." for i in range(9))
    systems = ["You simplify words. " + rules, "You simplify structure. " + rules]
    requests = [ChatRequest([{"role": "system", "content": systems[i % 2]}, {"role": "user", "content": p}],
                            SamplingParams(max_tokens=3 + i)) for i, p in enumerate(PROMPTS[:6])]
    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, max_batch_size=4)
    cached, plain = HFEngine(spec), HFEngine(dataclasses.replace(spec, enable_prefix_caching=False))
    cached.settings.min_held_prefix_columns = min_held_columns
    assert [c.raw_text for c in cached.generate(requests)] == [c.raw_text for c in plain.generate(requests)]
    stats = cached.last_stats
    prefixes = [common_prefix_length([cached._encode(r.messages) for r in requests[g::2]]) for g in (0, 1)]
    assert min(prefixes) >= 64 and stats.shared_prefix_tokens == sum(prefixes)
    # each prefix counted once, skipped by its group's three prompts
    assert stats.prefilled_tokens == stats.prompt_tokens - 2 * sum(prefixes)


def test_prefix_groups_by_leading_tokens():
    assert prefix_groups([[1, 2, 3], [4, 5, 6], [1, 2, 7], [1, 2], [4, 5, 9, 9]], 2) == [[0, 2], [1, 4], [3]]
    assert prefix_groups([[1, 2], [1, 2]], 0) == [[0], [1]]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 1], [6, 1]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3



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
