"""CPU-bound competitor processes for `bench.generate --contention N`: the busy machine users actually have.

Each competitor is `while True: pass` with a deadline (it exits by itself after `max_seconds`, so a bench killed
with SIGKILL leaves nothing spinning for long) and is killed when the `competitors` block ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

# the competitor: a pure-Python busy loop (one core each), bounded by a deadline given as argv[1]
_SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def competitors(count: int, max_seconds: float = 600.0) -> Iterator[list[subprocess.Popen]]:
    """Run `count` busy-loop processes for the duration of the block (each stops by itself after `max_seconds`)."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(max_seconds)]))
        time.sleep(0.2 if count else 0)  # let the scheduler see them before the measurement starts
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
