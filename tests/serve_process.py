"""A `quorum serve` started by a test as its own process: wait until it answers `/ready`, or fail with its output."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_until_ready(proc: subprocess.Popen, base: str, timeout_s: float = 300) -> None:
    """Poll `{base}/ready` five times a second until it answers 200; a process that exits first, or a deadline passed,
    fails the test with the tail of the process's output (stdout, stderr folded into it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "quorum serve did not become ready"
        try:
            if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
