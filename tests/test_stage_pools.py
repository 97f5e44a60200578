"""Actor pools of the Ray Data stages: fixed or [min, max] sizes, batches in flight, busy-time shares (pure)."""

from __future__ import annotations

import pytest

from actors.chat_worker import BusyClock
from actors.stage_config import PoolConfig
from core.config import ConfigError, build, check_tree


def pool(**data) -> PoolConfig:
    cfg = build(PoolConfig, data, "judges.0.pool")
    check_tree(cfg, "judges.0.pool")
    return cfg


def test_concurrency_is_an_int_or_a_min_max_pair():
    fixed, scaling = pool(concurrency=3), pool(concurrency=[1, 4])
    assert (fixed.min_actors, fixed.max_actors) == (3, 3)
    assert (scaling.min_actors, scaling.max_actors) == (1, 4)
    assert PoolConfig().batches_in_flight > 1


@pytest.mark.parametrize(("data", "message"), [
    ({"concurrency": 0}, r"judges\.0\.pool\.concurrency: must be >= 1, got 0"),
    ({"concurrency": [0, 2]}, r"judges\.0\.pool\.concurrency: min must be >= 1, got \[0, 2\]"),
    ({"concurrency": [3, 2]}, r"judges\.0\.pool\.concurrency: max must be >= min, got \[3, 2\]"),
    ({"concurrency": [1, 2, 3]}, r"judges\.0\.pool\.concurrency: must be an int or a \[min, max\] pair"),
    ({"concurrency": [1]}, r"judges\.0\.pool\.concurrency: must be an int or a \[min, max\] pair"),
    ({"concurrency": [1, 2.5]}, r"judges\.0\.pool\.concurrency"),
    ({"concurrency": "2"}, r"judges\.0\.pool\.concurrency"),
    ({"batches_in_flight": 0}, r"judges\.0\.pool\.batches_in_flight: must be >= 1, got 0"),
])
def test_bad_pool_sizes_are_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        pool(**data)


def test_fixed_pool_builds_a_fixed_strategy_with_batches_in_flight():
    strategy = pool(concurrency=2, batches_in_flight=3).compute()
    assert (strategy.min_size, strategy.max_size, strategy.initial_size) == (2, 2, 2)
    assert strategy.max_concurrent_calls_per_actor == 3
    assert strategy.max_tasks_in_flight_per_actor is None  # Ray Data's default: 2 x the calls, queued at the actor
    assert not strategy.enable_true_multi_threading  # a sync UDF still runs one call at a time


def test_min_max_pool_builds_an_autoscaling_strategy():
    strategy = pool(concurrency=[1, 4], batches_in_flight=2).compute()
    assert (strategy.min_size, strategy.max_size, strategy.initial_size) == (1, 4, 1)
    assert strategy.max_concurrent_calls_per_actor == 2


def test_busy_clock_splits_time_among_rows_in_flight():
    # batch a (4 rows) alone 0-2 s, with b (4 rows) 2-4 s, b alone 4-8 s:
    # a's rows: 2/4 + 2/8 = 0.75 s each; b's rows: 2/8 + 4/4 = 1.25 s each; 4 * 0.75 + 4 * 1.25 = 8 s busy
    clock = BusyClock()
    a = clock.enter(4, 0.0)
    b = clock.enter(4, 2.0)
    assert clock.leave(4, a, 4.0) == pytest.approx(0.75)
    assert clock.leave(4, b, 8.0) == pytest.approx(1.25)
    # idle 8-10 s counts for nobody; a lone batch of 2 rows for 3 s: 1.5 s each
    c = clock.enter(2, 10.0)
    assert clock.leave(2, c, 13.0) == pytest.approx(1.5)
