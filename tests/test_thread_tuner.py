"""The decode loop's thread count follows the machine's load (issue 14): the pure rule with scripted step times,
then the engine with the rule on: the same greedy tokens as with it off, and the steps per thread count recorded.

Scripted times (2 cores, batch of 16 rows): idle, a step takes 10 ms on 2 threads and 18 ms on 1; beside one busy
process, 40 ms on 2 threads (each barrier waits for the thread sharing its core) and 20 ms on 1.
"""

from __future__ import annotations

import pytest

from core.thread_tuner import ThreadTuner, candidate_threads, mean_threads

IDLE = {2: 0.010, 1: 0.018}
BUSY = {2: 0.040, 1: 0.020}


def drive(tuner: ThreadTuner, steps: int, times, rows=lambda i: 16, start: int = 0) -> list[int]:
    """Run `steps` scripted steps; `times(i)` maps threads to seconds at step i. Returns the threads of each step."""
    ran = []
    for i in range(start, start + steps):
        threads = tuner.next_threads(rows(i))
        tuner.record(threads, times(i)[threads], rows(i))
        ran.append(threads)
    return ran


def test_candidates_and_mean():
    assert candidate_threads(2) == (2, 1)
    assert candidate_threads(4) == (4, 2, 1)
    assert candidate_threads(5) == (5, 3, 1)
    assert candidate_threads(1) == (1,)
    assert mean_threads({2: 3, 1: 1}) == 1.75
    assert mean_threads({}) == 0.0


def test_idle_keeps_two_threads_and_probing_costs_under_three_percent():
    tuner = ThreadTuner(2)
    ran = drive(tuner, 200, lambda i: IDLE)
    # probes after 16 current steps, then the gap doubles on each loss: 32, 64, 64
    # (ratio 1.8 each: smoothed 1.4, capped at 1.3, then 1.3 + 0.5 * (1.8 - 1.3) capped again: above 1.15)
    assert [i for i, t in enumerate(ran) if t == 1] == [16, 49, 114, 179]
    assert tuner.current == 2 and tuner.interval == 64
    assert tuner.ratios[1] == pytest.approx(1.3)
    spent = sum(IDLE[t] for t in ran)
    assert spent / (200 * IDLE[2]) - 1 == pytest.approx(4 * 0.8 / 200)  # 1.6 % slower than never probing


def test_one_core_taken_switches_to_one_thread():
    tuner = ThreadTuner(2)
    ran = drive(tuner, 100, lambda i: BUSY)
    # the first probe (step 16) takes half the time of its neighbours: smoothed 1 + 0.5 * (0.5 - 1) = 0.75 < 0.85,
    # so the step after it is the last one on 2 threads
    assert ran[:16] == [2] * 16 and ran[16] == 1 and ran[17] == 2
    assert tuner.current == 1 and tuner.switches == 1
    # then 2 threads are only probed: at steps 33 (16 steps after the switch's probe) and 66 (gap 32: ratio 2 loses)
    assert [i for i, t in enumerate(ran) if t == 2 and i > 17] == [33, 66]
    assert sum(BUSY[t] for t in ran) / (100 * BUSY[1]) < 1.25  # vs staying on 2 threads: 2.0


def test_load_arrives_then_leaves():
    tuner = ThreadTuner(2)
    load = lambda i: BUSY if 200 <= i < 400 else IDLE
    idle = drive(tuner, 200, load)
    assert tuner.current == 2 and tuner.interval == 64
    busy = drive(tuner, 200, load, start=200)
    # the first 40 ms step is 4x the smoothed 10 ms: the gap falls back to 16, which the 21 steps since the last
    # probe (step 179) already exceed, so step 201 is a probe; it wins (0.5, smoothed 0.75) and 203 runs on 1
    assert busy[:4] == [2, 1, 2, 1] and tuner.current == 1
    # then probes of 2 threads at 218 (16 steps after the switch at 202), 251, 316, 381 (gaps 32, 64, 64)
    assert [200 + i for i, t in enumerate(busy) if t == 2] == [200, 202, 218, 251, 316, 381]
    back = drive(tuner, 200, load, start=400)
    # 1 thread runs 20 ms -> 18 ms when the competitor leaves: no change seen, so the gap stays 64. The probe at
    # 446 (10 / 18 = 0.556) brings the capped 1.3 down to 0.928, the one at 511 to 0.742 < 0.85: switch at 512
    assert [i for i, t in enumerate(back) if t == 2][:3] == [46, 111, 113]
    assert tuner.current == 2 and tuner.switches == 2 and back[128] == 1  # probing 1 thread again, 16 steps on
    assert idle.count(1) == 4


def test_short_batches_at_the_end_of_each_call_are_not_a_change_of_load():
    tuner = ThreadTuner(2)
    # calls of 48 steps: 40 on 16 rows, then 8 on 4 rows (6 ms on 2 threads, 40 % faster than a full batch, which
    # would read as a change of load against the 16-row steps)
    short = {2: 0.006, 1: 0.009}
    ran = drive(tuner, 480, lambda i: IDLE if i % 48 < 40 else short, rows=lambda i: 16 if i % 48 < 40 else 4)
    # the gaps grow 16, 32, 64 and stay there, as on a steady batch (every probe lands among 16-row steps)
    assert [i for i, t in enumerate(ran) if t == 1] == [16, 49, 114, 179, 244, 309, 374, 439]
    assert tuner.current == 2 and tuner.interval == 64


def test_a_marginal_win_needs_several_probes():
    tuner = ThreadTuner(2)
    times = {2: 0.010, 1: 0.0082}  # ratio 0.82: smoothed 0.91, 0.865, 0.8425 < 0.85 -> switch
    ran = drive(tuner, 60, lambda i: times)
    # no loss doubles the gap, so probes come every 16 current steps: 16, 33, 50
    assert [i for i, t in enumerate(ran) if t == 1][:3] == [16, 33, 50]
    assert ran[51] == 2 and ran[52] == 1 and tuner.current == 1


def test_a_probe_whose_neighbours_had_other_rows_is_not_compared():
    tuner = ThreadTuner(2)
    # a row finishes right after the probe at step 16: the after-step has 15 rows
    drive(tuner, 30, lambda i: BUSY, rows=lambda i: 16 if i <= 16 else 15)
    assert tuner.current == 2 and tuner.ratios == {}


def test_a_new_sequence_is_not_compared_with_the_last():
    tuner = ThreadTuner(2)
    drive(tuner, 16, lambda i: BUSY)
    assert tuner.next_threads(16) == 1
    assert tuner.next_threads(12) == 2  # a step over other rows than the last one: not comparable, not a probe
    tuner.new_sequence()  # a new call: no step before the probe to compare it with
    assert tuner.next_threads(16) == 2


def test_one_thread_never_probes_and_bad_settings_are_named():
    tuner = ThreadTuner(1)
    assert drive(tuner, 50, lambda i: {1: 0.01}) == [1] * 50
    with pytest.raises(ValueError, match="max_threads"):
        ThreadTuner(0)
    with pytest.raises(ValueError, match="probe_every"):
        ThreadTuner(2, probe_every=32, max_probe_every=16)


# ---------------------------------------------------------------------------------------------------------------
# The engine with the tuner on


@pytest.fixture
def restore_torch_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_engine_records_thread_counts_and_greedy_tokens_do_not_change(tiny_model_dir, restore_torch_threads):
    import dataclasses

    from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
    from actors.engines.hf.engine import HFEngine

    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device="cpu", max_batch_size=4, num_threads=2)
    tuned = HFEngine(spec)
    assert tuned.tuner is not None and tuned.tuner.candidates == (2, 1)
    # a probe every third step whatever the timings say, so steps alternate between both counts
    tuned.tuner = ThreadTuner(2, probe_every=2, max_probe_every=2)
    # six prompts through four slots with different lengths: refills and merges happen between probes too
    requests = [ChatRequest([{"role": "user", "content": f"Say something about the number {i}." * (1 + i % 3)}],
                            SamplingParams(max_tokens=4 + 2 * i)) for i in range(6)]
    with_tuner = tuned.generate(requests)
    steps = tuned.last_stats.thread_steps
    assert steps.get(1, 0) > 0 and steps.get(2, 0) > 0

    fixed = HFEngine(dataclasses.replace(spec, adaptive_threads=False))
    assert fixed.tuner is None
    without = fixed.generate(requests)
    assert [c.raw_text for c in with_tuner] == [c.raw_text for c in without]
    assert [c.completion_tokens for c in with_tuner] == [c.completion_tokens for c in without]
    assert len({c.raw_text for c in without}) > 1  # distinct prompts, distinct answers: the comparison means something
    assert fixed.last_stats.thread_steps == {2: sum(steps.values())}  # the same steps, all on the engine's 2


def test_adaptive_threads_must_be_a_bool():
    from actors.engines.base import EngineSpec
    from actors.engines.hf.engine import validate_spec

    with pytest.raises(ValueError, match="engine.adaptive_threads"):
        validate_spec(EngineSpec(adaptive_threads="yes"))
