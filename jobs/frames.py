"""Stage helpers the jobs share: a stage whose output is one pandas frame, a frame as a Ray Dataset in blocks,
and the part of a model list that belongs in a stage's resume key."""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import pyarrow as pa

from core.runstore import RunStore, write_table


def stage_frame(cfg, store: RunStore, name: str, key: object, build, summarize=None):
    """A stage whose output is a pandas frame: build() -> DataFrame (Ray plans materialised on the driver)."""
    def produce(out_dir: str) -> dict:
        started = time.time()
        df = build()
        write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir)
        return summarize(df, time.time() - started) if summarize else {"rows_out": len(df)}

    return store.run_stage(name, key, produce)


def to_dataset(df: pd.DataFrame, block_rows: int):
    """A Ray Dataset of `df` in blocks of `block_rows`: one block feeds one actor call, so a single block would leave
    every actor but one idle."""
    import ray.data

    return ray.data.from_pandas([df.iloc[i:i + block_rows] for i in range(0, len(df), max(block_rows, 1))])


def model_key(models: list) -> list:
    """The parts of a model list that change outputs (placement does not)."""
    return [{k: v for k, v in dataclasses.asdict(m).items() if k != "pool"} for m in models]
