"""The service-side monitors' metrics in W&B: one run per caller (`serve/<caller>`, grouped under the caller's name),
its `monitor/*` values logged at the caller's step, from a background thread so that starting a run or logging to it
never holds a request.

On when the serve config's `wandb.enabled` (off by default for the service); the mode resolves as every quorum run's
(`core.tracking.resolve_mode`: online with WANDB_API_KEY, which reaches the replicas as a secret, else offline).
Offline runs are written under WANDB_DIR (wandb's default: ./wandb of the replica's working directory).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading

from core.tracking import WandbConfig, resolve_mode

log = logging.getLogger("ray.serve")
_STOP = object()


@dataclasses.dataclass
class ServiceWandbConfig(WandbConfig):
    """W&B runs of the service's monitors, one per caller: `serve/<caller>` in group `<caller>`."""

    # log each caller's monitor/* values to a W&B run of its own (offline without a key); false = no W&B
    enabled: bool = False


class MonitorSink:
    def __init__(self, cfg: WandbConfig):
        self.cfg = cfg
        self._queue: queue.Queue = queue.Queue()
        self._runs: dict[str, object] = {}
        self._thread: threading.Thread | None = None
        self.logged = 0
        self.errors = 0

    def put(self, entries: list[tuple[str, int | None, dict]]) -> None:
        """(caller, step, metrics) of steps just closed; nothing when W&B is off."""
        if not self.cfg.on or not entries:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="quorum-monitor-wandb", daemon=True)
            self._thread.start()
        for entry in entries:
            self._queue.put(entry)

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish every run (flushes offline files); waits for the queued metrics first."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
            self._thread = None

    def _work(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is _STOP:
                break
            caller, step, metrics = entry
            try:
                run = self._runs.get(caller) or self._start(caller)
                run.log(metrics, step=step)
                self.logged += 1
            except Exception as exc:  # noqa: BLE001 - W&B trouble must never fail the service's judgments
                self.errors += 1
                log.warning("W&B logging of caller %s's monitors failed: %s: %s", caller, type(exc).__name__, exc)
        for run in self._runs.values():
            try:
                run.finish()
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                log.warning("finishing a W&B run failed: %s: %s", type(exc).__name__, exc)
        self._runs.clear()

    def _start(self, caller: str):
        import wandb

        run = wandb.init(project=self.cfg.project, entity=self.cfg.entity or None, name=f"serve/{caller}",
                         group=caller, job_type="serve_monitor", tags=self.cfg.tags or None,
                         mode=resolve_mode(self.cfg.mode), reinit="create_new", config={"caller": caller},
                         settings=wandb.Settings(console="off"))
        self._runs[caller] = run
        return run
