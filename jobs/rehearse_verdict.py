"""What a finished rehearsal's run directory says beyond its exit code: the failures a job counts and goes on from
(rows that failed, rewards that never came back, a self-training round with nothing to train on), which a rehearsal
that is to show the cluster job works must not accept, and the vLLM engines its log shows starting."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

# vLLM's line when an engine starts (vllm/v1/engine/core.py and llm_engine.py: "Initializing a V1 LLM engine
# (v0.32.0) with config: ...")
ENGINE_LINE = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)")
_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) \[")
# a stage summary's counters of rows that failed (actors.generate, the juries, CRAFT's runs)
FAILED_COUNTERS = ("engine_errors", "failed")


def _stages(run_dir: str) -> dict:
    path = Path(run_dir) / "manifest.json"
    return json.loads(path.read_text()).get("stages", {}) if path.is_file() else {}


def failed_stages(run_dir: str) -> list[str]:
    """Stages of the run whose every row failed: an engine error (an engine that died or never answered) or a row the
    stage counts `failed` (CRAFT's runs: a scorer that could not load failed every system of every row). The job
    counts them and goes on; a rehearsal that is to show the job works must not."""
    stages = _stages(run_dir)
    out = []
    for name, entry in stages.items():
        summary = entry.get("summary") or {}
        for counter in FAILED_COUNTERS:
            if entry.get("rows") and summary.get(counter, 0) >= entry["rows"]:
                out.append(f"{name} ({summary[counter]} of {entry['rows']} rows {counter.replace('_', ' ')})")
                break
    return out


def rewardless_stages(run_dir: str) -> list[str]:
    """GRPO stages that never got a reward: every group's reward failed, so no update ran (the job counts the failed
    groups and goes on; a rehearsal that is to show the reward path works must not)."""
    stages = _stages(run_dir)
    return [f"{name} ({entry['summary']['groups_failed']:.0f} reward groups failed, none answered)"
            for name, entry in stages.items()
            if (entry.get("summary") or {}).get("groups_failed") and entry["summary"].get("reward_mean") is None]


def untrained_rounds(run_dir: str) -> list[str]:
    """Self-training rounds (CRAFT's r<k>_pairs) that formed no preference pair, so the round's trainer never ran:
    the job stops there by design (it says why in stop_reason); a rehearsal that is to show the round's training
    runs must not call that a success."""
    stages = _stages(run_dir)
    return [f"{name} (0 pairs: {', '.join(f'{k}={v}' for k, v in entry['summary'].items() if k.startswith('dropped_'))})"
            for name, entry in stages.items()
            if re.fullmatch(r"r\d+_pairs", name) and not (entry.get("summary") or {}).get("pairs")
            and name.replace("_pairs", "_train") not in stages]


def started_vllm_engines(run_dir: str, since: float = 0.0) -> list[str]:
    """The vLLM versions of the engines whose start-up lines the run's log holds (one per engine), from `since` (a
    time.time()) on: a run directory resumed after a failed attempt appends to the same log. vLLM stamps its lines
    with the local month, day and time ("INFO 12-07 17:11:21 [core.py:133] Initializing ...")."""
    log = Path(run_dir) / "logs" / "driver.log"
    if not log.is_file():
        return []
    start = time.strftime("%m-%d %H:%M:%S", time.localtime(since)) if since else ""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        engine = ENGINE_LINE.search(line)
        if engine:
            stamp = _STAMP.search(line[:engine.start()])
            if not start or not stamp or stamp.group(1) >= start:
                found.append(engine.group(1))
    return found
