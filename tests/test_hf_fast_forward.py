"""Jump-forward decoding (actors.engines.hf.fast_forward): the width rule and the fed inputs by hand, then the demo's
two verdict grammars on the bundled SmolLM2 at float32 (the dtype of a CPU without bf16), single steps against
jump-forward: the same answers, token for token, in fewer forwards."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine
from actors.engines.hf.fast_forward import feed_inputs, feed_width
from actors.engines.hf.weights import CPU_BF16_ENV
from actors.jury import render_judge_requests


def test_rows_in_step_feed_their_forced_tokens_together():
    # three rows, five forced tokens each: one forward of 6 positions, all real
    assert feed_width([5, 5, 5], [20, 20, 20], length=10, capacity=40, min_fill=0.75) == 6
    # 3 + 3 + 3 + 3 real tokens of 4 x 4 positions at k = 4 is 14/16 (the two short rows feed 3 each)
    assert feed_width([3, 3, 2, 2], [20] * 4, length=10, capacity=40, min_fill=0.75) == 4
    # 0.9 asks more than 14/16 = 0.875: k = 3 (12 of 12)
    assert feed_width([3, 3, 2, 2], [20] * 4, length=10, capacity=40, min_fill=0.9) == 3


def test_a_lone_row_ahead_and_a_full_buffer_keep_single_steps():
    # one row of four with 8 forced tokens: 9 + 1 + 1 + 1 = 12 real of 36 positions
    assert feed_width([8, 0, 0, 0], [20] * 4, length=10, capacity=40, min_fill=0.75) == 1
    assert feed_width([0, 0], [5, 5], length=10, capacity=16, min_fill=0.75) == 1
    # the second row's pads would leave its 27 remaining tokens no room past k = 3 (10 + 3 + 27 = 40 = capacity - 1)
    assert feed_width([6, 2], [20, 30], length=10, capacity=41, min_fill=0.5) == 3
    assert feed_width([6, 2], [20, 30], length=10, capacity=40, min_fill=0.5) == 1


def test_fed_inputs_are_right_aligned_with_consecutive_positions():
    ids, pos, mask = feed_inputs(torch.tensor([[7], [9], [4]]), torch.tensor([[4], [6], [2]]), [[1, 2], [], [5]],
                                 3, pad_id=0)
    assert ids.tolist() == [[7, 1, 2], [0, 0, 9], [0, 4, 5]]
    assert pos.tolist() == [[4, 5, 6], [0, 0, 6], [0, 2, 3]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]


# ---------------------------------------------------------------------------------------------------------------
# The demo's verdicts on SmolLM2


SOURCES = ["The committee postponed the decision because several members were absent.",
           "Photosynthesis converts light energy into chemical energy stored in glucose.",
           "The ancient manuscript was discovered in a monastery library in 1952.",
           "Despite the heavy rain, the marathon proceeded as scheduled.",
           "The medication should be administered twice daily with food.",
           "Volcanic eruptions can significantly alter global climate patterns."]


def _cut(text: str, words: int) -> str:
    return " ".join(text.split()[:words])


def _jury_requests() -> list[ChatRequest]:
    """The demo jury's request (judge_policy_brief, best/worst over 4 candidates, its grammar within 64 tokens)."""
    rows = [{"id": str(i), "policy": "p", "source": s, "n_candidates": 4,
             "candidates_json": json.dumps([s, _cut(s, 5), _cut(s, 8), s.lower()])} for i, s in enumerate(SOURCES)]
    return _requests(rows, "judge_policy_brief", "best_worst", 64)


def _pairwise_requests() -> list[ChatRequest]:
    """The demo rejudge's request (jury_pairwise_brief: 16 free reasoning tokens, two grades, within 96 tokens)."""
    rows = [{"id": str(i), "policy": "p", "source": s, "candidate_a": _cut(s, 4 + i), "candidate_b": s}
            for i, s in enumerate(SOURCES)]
    return _requests(rows, "jury_pairwise_brief", "pairwise", 96)


def _requests(rows: list[dict], template: str, fmt: str, max_tokens: int) -> list[ChatRequest]:
    import pandas as pd

    sampling = json.dumps({"temperature": 0.0, "max_tokens": max_tokens})
    out = render_judge_requests(pd.DataFrame(rows), "judge", template, fmt, sampling, seed=0, constrained=True)
    return [ChatRequest(json.loads(m), SamplingParams(**json.loads(s)))
            for m, s in zip(out["messages_json"], out["sampling_json"])]


@pytest.fixture(scope="module")
def float32_engines(smollm2_dir):
    import os

    saved = os.environ.pop(CPU_BF16_ENV, None)  # the dtype is set here, whatever the shell says about the CPU
    spec = EngineSpec(model=smollm2_dir, dtype="float32", device="cpu", max_batch_size=8, num_threads=2)
    engines = {ff: HFEngine(dataclasses.replace(spec, fast_forward=ff)) for ff in (False, True)}
    yield engines
    for engine in engines.values():
        engine.close()
    if saved is not None:
        os.environ[CPU_BF16_ENV] = saved


def _tokens(engine: HFEngine, completion) -> list[int]:
    return engine.tokenizer(completion.raw_text, add_special_tokens=False).input_ids


@pytest.mark.slow
@pytest.mark.parametrize("requests, forwards_at_most", [(_jury_requests, 8), (_pairwise_requests, 24)],
                         ids=["jury-best-worst", "rejudge-pairwise"])
def test_jump_forward_answers_the_demo_verdicts_as_single_steps_in_fewer_forwards(float32_engines, requests,
                                                                                   forwards_at_most):
    asked = requests()
    steps = float32_engines[False].generate(asked)
    single = float32_engines[False].last_stats
    jumped = float32_engines[True].generate(asked)
    stats = float32_engines[True].last_stats
    assert single.forced_tokens == 0 and stats.forced_tokens > 0
    for a, b in zip(steps, jumped):
        assert (b.raw_text, b.completion_tokens, b.finish_reason) == (a.raw_text, a.completion_tokens, a.finish_reason)
        assert a.finish_reason == "stop" and not a.error
    # the forced text is most of each verdict; a step per token is what jump-forward saves
    assert sum(single.thread_steps.values()) > 2 * sum(stats.thread_steps.values())
    assert sum(stats.thread_steps.values()) <= forwards_at_most
    assert stats.forced_tokens > sum(c.completion_tokens for c in jumped) // 2


@pytest.mark.slow
def test_padded_rows_and_free_rows_in_one_batch_answer_as_single_steps(float32_engines):
    """min_fill 0.1 makes rows whose forced texts differ in length feed padded positions between their tokens (the
    grades' closing texts, "1 - MAJOR FAILURE" vs "4 - GOOD"); two unconstrained rows share the batch."""
    free = [ChatRequest([{"role": "user", "content": q}], SamplingParams(max_tokens=24))
            for q in ("What is the capital of France?", "Name three primary colours.")]
    asked = _pairwise_requests()[:4] + free + _jury_requests()[:2]
    engine = float32_engines[True]
    keep = engine.settings
    engine.settings = dataclasses.replace(keep, fast_forward_min_fill=0.1)
    try:
        jumped = engine.generate(asked)
        padded = engine.last_stats
    finally:
        engine.settings = keep
    steps = float32_engines[False].generate(asked)
    assert padded.forced_tokens > 0
    assert [c.raw_text for c in jumped] == [c.raw_text for c in steps]
    assert [_tokens(engine, c) for c in jumped] == [_tokens(engine, c) for c in steps]


def test_the_knob_that_restores_single_steps_has_its_own_cache_key():
    spec = EngineSpec(model="smollm2-135m")
    assert spec.cache_identity() == "hf:smollm2-135m:think=False"  # the default's key, as before jump-forward
    assert dataclasses.replace(spec, fast_forward=False).cache_identity() != spec.cache_identity()
    assert EngineSpec(kind="vllm", fast_forward=False).cache_identity() == EngineSpec(kind="vllm").cache_identity()
