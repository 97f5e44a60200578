"""The jury stage's manifest counts the actor lives that produced its rows: each ChatWorker life stamps its rows with
`worker_ready_at`. (Its `actor_restarts`, from Ray's actor table, is checked by tests/test_multinode.py.)"""

from __future__ import annotations

import pandas as pd

from actors.jury import actor_incarnations, summarize_jury


def judgments(judge: str, stamps: list[float]) -> pd.DataFrame:
    n = len(stamps)
    return pd.DataFrame({"judge": [judge] * n, "worker_ready_at": stamps, "parse_error": [""] * n,
                         "completion_tokens": [3] * n, "prompt_tokens": [10] * n, "attempts": [1] * n,
                         "engine_error": [""] * n, "cached": [False] * n, "worker_seconds": [0.5] * n})


def test_actor_lives_are_distinct_ready_stamps():
    # judge a: a 1-actor pool whose actor died after its first batch (two lives: 100.0, then 250.0);
    # judge b: a 2-actor pool, both alive throughout; the 0.0 row is a too-few-candidates row no actor saw
    df = pd.concat([judgments("a", [100.0, 100.0, 250.0, 250.0]), judgments("b", [101.0, 102.0, 102.0, 0.0])])
    assert actor_incarnations(df) == {"a": 2, "b": 2}
    summary = summarize_jury(df, 2.0)
    assert summary["actor_lives"] == 4  # judge a: 1 actor + 1 restart; judge b: 2 actors
    assert summary["rows_out"] == 8 and summary["completion_tokens"] == 24
