"""What a job shows on the terminal: per stage, one line when it starts and one with its result.

Everything else a job's process writes goes to the run's `logs/driver.log`: Ray's start-up lines and its token
banner, the lines Ray forwards from every worker and actor (Ray Train's controller warnings among them), W&B's
banner, warnings, progress bars. Ray forwards worker output to the driver's `sys.stdout` / `sys.stderr`, its C++
core writes to file descriptor 2 directly, and W&B holds its own stream objects, so no logging filter reaches all of
them; redirecting file descriptors 1 and 2 does, and loses nothing: the same lines are in the log file, in order.

Only the `quorum` CLI turns this on (`enable`), and only for a run directory on the local filesystem (the log file
must be a file): a job called as a library, or writing to `s3://`, keeps its output where it was. `release` puts
the descriptors back, so errors and the CLI's closing lines ("quorum: run directory: ...") reach the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import ClassVar, TextIO

log = logging.getLogger("quorum.progress")

# summary values shown on a stage's result line; the whole summary is in manifest.json and the log
RESULT_ITEMS = 4
RESULT_VALUE_CHARS = 40


class _State:
    enabled = False
    saved: tuple[int, int] | None = None
    terminal: TextIO | None = None
    muted: ClassVar[list[tuple[logging.Handler, int]]] = []


def enable() -> None:
    """Called by the CLI: the job's run directory, once opened, takes the process's output."""
    _State.enabled = True


def capturing() -> bool:
    return _State.saved is not None


def capture(log_path: str) -> None:
    """Send file descriptors 1 and 2 to `log_path` (appending), keeping the terminal for `say`."""
    if not _State.enabled or capturing():
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    _State.saved = saved
    _State.terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    # the root logger's console handlers would now write each record a second time into the same file (the run's
    # file handler already has it): quiet them until `release`
    for handler in logging.getLogger().handlers:
        if _writes_to_terminal(handler):
            _State.muted.append((handler, handler.level))
            handler.setLevel(logging.CRITICAL + 1)
    say(f"the full log (Ray, workers, W&B): {log_path}")


def _writes_to_terminal(handler: logging.Handler) -> bool:
    """A console handler: its stream is file descriptor 1 or 2 (not a file, not a test's in-memory capture)."""
    if isinstance(handler, logging.FileHandler):
        return False
    try:
        return handler.stream.fileno() in (1, 2)
    except (AttributeError, OSError, ValueError):
        return False


def release() -> None:
    """Give file descriptors 1 and 2 back to the terminal (idempotent); the next job capture needs `enable` again."""
    _State.enabled = False
    if not capturing():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    out, err = _State.saved
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    _State.saved = None
    if _State.terminal is not None:
        _State.terminal.close()
        _State.terminal = None
    for handler, level in _State.muted:
        handler.setLevel(level)
    _State.muted = []


def say(line: str) -> None:
    """One line for the person at the terminal, also in the log."""
    log.info(line)
    if _State.terminal is not None:
        _State.terminal.write(f"quorum: {line}\n")


def stage_started(name: str) -> None:
    say(f"{name}: running")


def stage_finished(name: str, rows: int, seconds: float, summary: dict, reused: bool = False) -> None:
    if reused:
        say(f"{name}: reused the finished output ({_rows(rows)})")
        return
    say(f"{name}: done in {seconds:.1f} s, {_rows(rows)}{_brief(summary)}")


def _rows(n: int) -> str:
    return "1 row" if n == 1 else f"{n} rows"


def _brief(summary: dict) -> str:
    items = [(k, v) for k, v in summary.items() if isinstance(v, (int, float, str, bool)) and k not in ("rows_out",)]
    shown = []
    for key, value in items[:RESULT_ITEMS]:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        if len(text) > RESULT_VALUE_CHARS:
            text = text[:RESULT_VALUE_CHARS - 1] + "…"
        shown.append(f"{key}={text}")
    more = f", … {len(items) - RESULT_ITEMS} more in manifest.json" if len(items) > RESULT_ITEMS else ""
    return f" ({', '.join(shown)}{more})" if shown else ""
