"""`bench.generate --contention N`'s competitors never outlive their measurement, nor their own deadline."""

from __future__ import annotations

import time

import pytest

from bench.contention import competitors


def test_competitors_are_killed_when_the_block_ends():
    with competitors(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)  # spinning
    assert all(p.poll() is not None for p in procs)


def test_competitors_are_killed_when_the_block_raises():
    with pytest.raises(KeyboardInterrupt), competitors(1) as procs:
        raise KeyboardInterrupt
    assert procs[0].poll() is not None


def test_a_competitor_stops_by_itself_after_its_deadline():
    with competitors(1, max_seconds=0.3) as procs:
        deadline = time.monotonic() + 30  # generous: a busy machine starts Python slowly
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs[0].returncode == 0  # it exited on its own, before any kill


def test_no_competitor():
    with competitors(0) as procs:
        assert procs == []
