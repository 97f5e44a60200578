"""Ray Data side of `bench/generate.py`: the generate stage's worker on the same prompts, spec and batch size.

Throughput counts from the moment the first actor finished loading its model (`worker_ready_at`) to the end of
the stage, so it includes every Ray Data cost per batch (scheduling, serialization, pre/post tasks) but not the
one-off model load, which the bare loop also leaves out.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pandas as pd

from actors.chat_worker import ChatWorker
from actors.engines.base import ChatRequest, EngineSpec
from actors.stage_config import PoolConfig
from bench.contention import competitors
from core.ray_env import RayConfig, init_ray


def measure_ray_data(requests: list[ChatRequest], spec: EngineSpec, contention: int = 0,
                     worker_niceness: int = 0) -> float:
    """Tokens/s of one ChatWorker actor (2 CPUs) run by Ray Data over `requests` in batches of the spec's size.

    `contention` busy processes (bench.contention) run while the stage does, not while Ray starts; the cluster is
    started the way jobs start theirs (core.ray_env.init_ray), its workers at `worker_niceness`.
    """
    import ray
    import ray.data

    # logical CPUs only: the actor takes 2 (= 2 torch threads, like the in-process loop); the light pre/post tasks
    # get the extra logical slot instead of waiting for the actor to finish
    init_ray(RayConfig(num_cpus=3, worker_niceness=worker_niceness))
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        rows = pd.DataFrame({
            "id": [r.request_id for r in requests],
            "messages_json": [json.dumps(r.messages) for r in requests],
            "sampling_json": [json.dumps(r.sampling.as_dict()) for r in requests],
        })
        pool = PoolConfig(concurrency=1, num_cpus=2, batch_size=spec.max_batch_size)
        ds = ray.data.from_pandas(rows).repartition(target_num_rows_per_block=spec.max_batch_size).materialize()
        with competitors(contention):
            out = ds.map_batches(ChatWorker, batch_format="pandas",
                                 fn_constructor_kwargs={"spec": dataclasses.asdict(spec), "cache_dir": ""},
                                 **pool.map_batches_kwargs()).to_pandas()
            finished = time.time()
    finally:
        ray.shutdown()
    return float(out["completion_tokens"].sum()) / (finished - float(out["worker_ready_at"].min()))
