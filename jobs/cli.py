"""The `quorum` command.

    quorum run CONFIG.yaml [key=value ...] [--no-resume]    run the job named by the config's `job:` key
    quorum submit CONFIG.yaml [key=value ...] [--address URL] [--follow]   run it on a Ray cluster (jobs/submit.py)
    quorum eval --metrics sari,bleu --orig O --sys S --refs R1 R2 ...   corpus metrics (see eval/cli.py)
    quorum serve CONFIG.yaml [key=value ...]                 start / update the reward-model Serve app
    quorum human export RUN_DIR --out DIR | import DIR A.csv ...   blind human-rating sheet out, ratings in
    quorum curve RUN_DIR ... --out DIR                        SARI vs training rows over runs (paper 000 Fig. 3)
    quorum simplify-doc FILE [--configuration C] [--html OUT] [key=value ...]   one document through AgentSimp
    quorum stage-models CONFIG.yaml [key=value ...] [--list]  download the config's hf: models into ray.models.hf_home

Exit codes: 0 success, 2 bad config or bad input (the message names the key, file or line), 1 anything else.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

from core import console
from core.config import ConfigError, load_config, read_yaml, split_command
from core.errors import CorpusError
from core.model_store import check_models_staged
from core.paths import path_overrides
from eval.menlo_data import MenloDataError
from eval.prompts import PromptError

# bad input files: each message names the file and line; exit 2 like a config error
INPUT_ERRORS = (CorpusError, MenloDataError, PromptError)

# job name (the YAML `job:` key) -> entry module exposing `Config` and `main(cfg, config_path)`
JOBS = {
    "policy_simplify": "jobs.policy_simplify",
    "jury_eval": "jobs.jury_eval",
    "judge_eval": "jobs.judge_eval",
    "serve_grm": "jobs.serve_grm",
    "judge_grpo": "jobs.judge_grpo",
    "judge_sft": "jobs.judge_sft",
    "policy_grpo": "jobs.policy_grpo",
    "craft": "jobs.craft",
    "craft_selftrain": "jobs.craft_selftrain",
    "agentsimp": "jobs.agentsimp",
}

USAGE = __doc__
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
        print(module.__doc__ or USAGE)
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "run":
            if not rest:
                raise ConfigError("quorum run: missing CONFIG.yaml")
            return run_job(job_module(rest[0]), rest)
        if command == "eval":
            from eval.cli import main as eval_main

            return eval_main(rest)
        if command == "curve":
            from jobs.curve_cli import main as curve_main

            return curve_main(rest)
        if command == "human":
            from jobs.human_cli import main as human_main

            return human_main(rest)
        if command == "simplify-doc":
            from jobs.agentsimp_cli import main as simplify_doc_main

            return simplify_doc_main(rest)
        if command == "serve":
            from jobs.serve_grm import main as serve_main

            return serve_main(rest)
        if command == "submit":
            from jobs.submit import main as submit_main

            return submit_main(rest, job_module)
        if command == "stage-models":
            from jobs.stage_models import main as stage_models_main

            return stage_models_main(rest, job_module)
        raise ConfigError(f"unknown command {command!r}; expected run, eval, human, curve, simplify-doc, serve, submit or stage-models")
    except ConfigError as exc:
        print(f"quorum: error: {exc}", file=sys.stderr)
        return 2
    except INPUT_ERRORS as exc:
        print(f"quorum: input error: {exc}", file=sys.stderr)
        return 2


def entry(module_name: str) -> None:
    """`python -m jobs.<name> CONFIG [overrides]` entry used by each job module."""
    module = importlib.import_module(module_name)
    try:
        code = run_job(module, sys.argv[1:])
    except (ConfigError, *INPUT_ERRORS) as exc:
        print(f"quorum: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main())
