"""Several batches in flight per ChatWorker actor, on real Ray with a real tiny model (hf engine).

Each batch's arrival at the actor and its finish are read from the worker's timeline: with `batches_in_flight`
above 1 the next batch is at the actor before the last one finishes; with 1 (the control) it never is. In process,
batches awaited together still enter the hf engine one at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from actors.chat_worker import ChatWorker
from actors.engines.base import EngineSpec
from actors.stage_config import PoolConfig, SamplingConfig

pytestmark = pytest.mark.slow

ROWS, BATCH = 24, 4


def requests(prefix: str = "r") -> list[pd.DataFrame]:
    sampling = SamplingConfig(max_tokens=32, seed=5).to_json()
    df = pd.DataFrame({"id": [f"{prefix}{i:02d}" for i in range(ROWS)],
                       "messages_json": [json.dumps([{"role": "user", "content": f"Count to {i}."}])
                                         for i in range(ROWS)],
                       "sampling_json": sampling})
    return [df.iloc[i:i + BATCH] for i in range(0, ROWS, BATCH)]  # one block per batch


def stage(model_dir: str, prefix: str, timeline: Path, batches_in_flight: int):
    import ray.data

    pool = PoolConfig(concurrency=1, num_cpus=0.5, batch_size=BATCH, batches_in_flight=batches_in_flight)
    spec = EngineSpec(kind="hf", model=model_dir, num_threads=1)
    return ray.data.from_pandas(requests(prefix)).materialize().map_batches(
        ChatWorker, batch_format="pandas",
        fn_constructor_kwargs={"spec": dataclasses.asdict(spec), "timeline_dir": str(timeline)},
        **pool.map_batches_kwargs("tiny"))


def timeline_batches(timeline: Path) -> list[dict]:
    [log] = timeline.glob("*.jsonl")  # one actor
    return sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda b: b["finished"])


@pytest.fixture(scope="module")
def stages(ray_local, tiny_model_dir, tmp_path_factory) -> dict[str, tuple[pd.DataFrame, list[dict]]]:
    """The two tests' stages (3 batches in flight, and 1, the control) run as one Ray Data execution, their union:
    each has its own pool, actor and timeline, and its own rows (ids "i.." and "s.."); one stage run's start-up
    instead of two."""
    root = tmp_path_factory.mktemp("stage-inflight")
    runs = {"inflight": ("i", 3), "serial": ("s", 1)}
    parts = [stage(tiny_model_dir, prefix, root / name, n) for name, (prefix, n) in runs.items()]
    out = parts[0].union(*parts[1:]).to_pandas()
    return {name: (out[out["id"].str.startswith(prefix)], timeline_batches(root / name))
            for name, (prefix, _) in runs.items()}


def test_next_batch_is_at_the_actor_before_the_last_one_finishes(stages):
    out, batches = stages["inflight"]
    assert sorted(out["id"]) == [f"i{i:02d}" for i in range(ROWS)]
    assert (out["completion_tokens"] > 0).all() and (out["engine_error"] == "").all()
    assert [b["rows"] for b in batches] == [BATCH] * (ROWS // BATCH)
    for k in range(len(batches) - 1):
        assert batches[k + 1]["arrived"] < batches[k]["finished"], f"batch {k + 1} arrived after batch {k} finished"
    # overlapping batches share the actor's busy time: their rows' seconds add up to it, not to more
    busy = max(b["finished"] for b in batches) - min(b["arrived"] for b in batches)
    assert 0 < out["worker_seconds"].sum() <= busy + 1e-6


def test_one_batch_in_flight_never_overlaps(stages):
    out, batches = stages["serial"]
    assert len(out) == ROWS
    for k in range(len(batches) - 1):
        assert batches[k + 1]["arrived"] >= batches[k]["finished"]


def test_autoscaling_pool_must_fit_its_min_not_its_max(ray_local, caplog):
    import logging

    from core.config import ConfigError

    with caplog.at_level(logging.INFO, logger="quorum.resources"):
        kwargs = PoolConfig(concurrency=[1, 5], num_cpus=1.5).map_batches_kwargs("judge")  # 5 x 1.5 CPU never fit
    assert (kwargs["compute"].min_size, kwargs["compute"].max_size) == (1, 5)
    assert "actor pool of model 'judge': its max is not reserved" in caplog.text  # said, not refused
    with pytest.raises(ConfigError, match=r"actor pool of model 'judge': 2 actors × 1\.5 CPU = 3 CPU, .* Change "
                                          r"pool\.concurrency or pool\.num_cpus"):
        PoolConfig(concurrency=[2, 3], num_cpus=1.5).map_batches_kwargs("judge")


def test_hf_engine_is_entered_by_one_batch_at_a_time(tiny_model_dir):
    """Batches awaited together on one event loop (as Ray Data runs them) still reach the hf engine one by one, on
    the worker's one engine thread, and every row gets its completion."""
    worker = ChatWorker(dataclasses.asdict(EngineSpec(kind="hf", model=tiny_model_dir, num_threads=1)))
    inside, most, threads = 0, 0, set()
    complete = worker.model.complete_cached

    def counted(requests):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        threads.add(threading.get_ident())
        try:
            return complete(requests)
        finally:
            inside -= 1

    worker.model.complete_cached = counted

    async def run() -> list[pd.DataFrame]:
        return await asyncio.gather(*(worker(batch) for batch in requests()))

    started = time.time()
    outs = asyncio.run(run())
    wall = time.time() - started
    assert most == 1 and len(threads) == 1 and threading.get_ident() not in threads
    assert [len(o) for o in outs] == [BATCH] * (ROWS // BATCH)
    assert all((o["completion_tokens"] > 0).all() for o in outs)
    # six batches in flight together: their rows' shares add up to the time the worker was busy, not 6 x it
    assert 0 < sum(o["worker_seconds"].sum() for o in outs) <= wall
