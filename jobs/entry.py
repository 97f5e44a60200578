"""Running one job: its name -> its module, CONFIG + overrides -> a validated config -> `main`, and the last lines
that say where the run is. Shared by `quorum run` (jobs.cli) and each job module's `python -m jobs.<package>.<job>`
(`entry`), which import it, so that a job module never imports the CLI that dispatches to it."""

from __future__ import annotations

import dataclasses
import importlib
import sys

from core import console
from core.config import ConfigError, load_config, read_yaml, split_command
from core.errors import CorpusError
from core.model_store import check_models_staged
from core.paths import path_overrides
from eval.judging.menlo_data import MenloDataError
from eval.prompts import PromptError

# bad input files: each message names the file and line; exit 2 like a config error
INPUT_ERRORS = (CorpusError, MenloDataError, PromptError)

# job name (the YAML `job:` key) -> entry module exposing `Config` and `main(cfg, config_path)`
JOBS = {
    "policy_simplify": "jobs.policy.simplify",
    "jury_eval": "jobs.jury.evaluate",
    "judge_eval": "jobs.judge.evaluate",
    "serve_grm": "jobs.serve_grm",
    "judge_grpo": "jobs.judge.grpo",
    "judge_sft": "jobs.judge.sft",
    "policy_grpo": "jobs.policy.grpo",
    "craft": "jobs.craft.revise",
    "craft_selftrain": "jobs.craft.selftrain",
    "agentsimp": "jobs.agentsimp.simplify",
}

# what a finished job's run directory holds for people to read first, by job
REPORT_FILES = ("summary.md", "report.md", "metrics.md", "report.html")


def job_module(config_path: str):
    data = read_yaml(config_path)
    name = data.get("job")
    if not isinstance(name, str) or name not in JOBS:
        raise ConfigError(f"{config_path}: key 'job' must be one of {sorted(JOBS)}, got {name!r}")
    return importlib.import_module(JOBS[name])


def run_job(module, argv: list[str]) -> int:
    """Shared by `quorum run` and `python -m jobs.<name>`: parse CONFIG + overrides, validate, run."""
    if not argv or argv[0] in ("-h", "--help"):
        print(module.__doc__ or "usage: quorum run CONFIG.yaml [key=value ...] [--no-resume]")
        return 0 if argv else 2
    config_path, overrides, flags = split_command(argv)
    verbose = False
    for flag in flags:
        if flag == "--no-resume":
            overrides.append("run.resume=false")
        elif flag == "--verbose":
            verbose = True  # everything on the terminal too (e.g. `ray job logs` of a submitted job)
        elif flag != "--resume":
            raise ConfigError(f"unknown flag {flag!r} (known: --resume, --no-resume, --verbose)")
    overrides += path_overrides(module.Config, config_path, overrides)
    cfg = load_config(module.Config, config_path, overrides)
    # a cluster config that cannot run on the cluster it is written for stops here (`quorum plan`'s check)
    from jobs.plan_check import preflight

    preflight(cfg)
    # offline hub models must be staged before any work (core.model_store)
    check_models_staged(dataclasses.asdict(cfg), cfg.ray.models, config_path)
    if not verbose:
        console.enable()  # the run's log takes Ray's and the workers' output; the terminal keeps the stage lines
    try:
        module.main(cfg, config_path)
    except BaseException:
        console.release()
        print_run_locations(failed=True)
        raise
    console.release()
    print_run_locations(failed=False)
    return 0


def print_run_locations(failed: bool) -> None:
    """The job's last lines (`ray job logs` shows them): where its run directory and summary are."""
    from core.jobrun import OPENED

    for run in OPENED:
        where = run.location
        if failed:
            print(f"quorum: run directory (incomplete; finished stages are reused by the next run): {where}",
                  flush=True)
            continue
        print(f"quorum: run directory: {where}", flush=True)
        for name in run.store.existing(REPORT_FILES):
            print(f"quorum: summary: {where}/{name}", flush=True)
        for path in run.offline_wandb_runs():
            print(f"quorum: W&B offline run: wandb sync {path}", flush=True)
    OPENED.clear()


def entry(module_name: str) -> None:
    """`python -m jobs.<name> CONFIG [overrides]` entry used by each job module."""
    module = importlib.import_module(module_name)
    try:
        code = run_job(module, sys.argv[1:])
    except (ConfigError, *INPUT_ERRORS) as exc:
        print(f"quorum: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
