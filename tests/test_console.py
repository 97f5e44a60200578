"""The terminal of a CLI job: stage lines only; everything the process writes otherwise lands in the run's log."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import logging, os, sys, warnings
    from core import console

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    log_path = sys.argv[1]
    logging.getLogger().addHandler(logging.FileHandler(log_path))
    console.capture(log_path)                      # not enabled: a library caller keeps its output
    print("visible before enable", flush=True)
    console.enable()
    console.capture(log_path)
    print("python stdout noise", flush=True)
    print("python stderr noise", file=sys.stderr, flush=True)
    os.write(2, b"fd-2 noise, as Ray's C++ core writes it\\n")
    warnings.warn("a deprecation warning")
    logging.getLogger("ray.train").warning("Failed to query Ray Train Controller actor state.")
    console.stage_started("jury")
    console.stage_finished("jury", 80, 57.25, {"judgments": 80, "parse_failures": 0, "note": "x" * 100,
                                                "a": 1, "b": 2, "c": 3})
    console.stage_finished("sources", 40, 0.0, {}, reused=True)
    console.release()
    console.release()
    console.capture(log_path)                      # released: a later library call keeps its output
    print("quorum: run directory: somewhere", flush=True)
""")


def test_the_terminal_gets_stage_lines_and_the_log_gets_everything(tmp_path):
    log_path = tmp_path / "driver.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "visible before enable",
        f"quorum: the full log (Ray, workers, W&B): {log_path}",
        "quorum: jury: running",
        "quorum: jury: done in 57.2 s, 80 rows (judgments=80, parse_failures=0, note=" + "x" * 39 + "…, a=1, "
        "… 2 more in manifest.json)",
        "quorum: sources: reused the finished output (40 rows)",
        "quorum: run directory: somewhere",
    ]
    assert proc.stderr == ""
    logged = log_path.read_text()
    for noise in ("python stdout noise", "python stderr noise", "fd-2 noise", "a deprecation warning",
                  "Failed to query Ray Train Controller actor state", "jury: running", "jury: done in 57.2 s"):
        assert noise in logged, noise
    # each record once: the console handler, pointed at the log by the redirect, was quiet meanwhile
    assert logged.count("Failed to query Ray Train Controller actor state") == 1
