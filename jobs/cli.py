"""The `quorum` command: one table of subcommands (`COMMANDS`), each an argparse parser of its own.

    quorum run CONFIG.yaml [key=value ...] [--no-resume]    run the job named by the config's `job:` key
    quorum run CONFIG.yaml --help                            its usage and every key of that job's config
    quorum submit CONFIG.yaml [key=value ...] [--address URL] [--follow]   run it on a Ray cluster (jobs/submit.py)
    quorum COMMAND --help                                    any command's usage (exit 0)

`quorum --help` lists the commands. Every command parses its arguments with argparse: `--help` / `-h` prints its
usage and exits 0; an unknown flag or a missing argument prints the usage line and exits 2. No shell completion is
installed (argparse has none of its own).

Exit codes: 0 success, 2 bad config or bad input (the message names the key, file or line), 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from core.config import ConfigError
from jobs.entry import INPUT_ERRORS, JOBS, job_module, run_job  # noqa: F401 (JOBS: callers of jobs.cli)

USAGE = __doc__


@dataclass(frozen=True)
class Command:
    """A subcommand: `entry` ("module:function") is imported only when the command runs and is called with the
    arguments after the command word; it returns the exit code (argparse's own exits are turned into codes here)."""

    entry: str
    summary: str


# one entry per subcommand; the --help test (tests/test_cli_help.py) runs every command listed here
COMMANDS: dict[str, Command] = {
    "run": Command("jobs.cli:run_main", "run the job named by CONFIG's `job:` key (CONFIG --help: its keys)"),
    "submit": Command("jobs.submit:main", "run a job on a Ray cluster through the Job Submission API"),
    "rehearse": Command("jobs.rehearse:main", "run a cluster config whole on this machine at toy scale (vLLM's CPU "
                        "build where it names vLLM) before the cluster"),
    "plan": Command("jobs.plan:main", "what a cluster config takes on the cluster it names (nodes, GPU memory per "
                    "GPU, timeouts, storage) and whether it fits; no Ray, no GPU"),
    "serve": Command("jobs.serve_grm:main", "start, update or describe the reward-model Serve app"),
    "eval": Command("eval.cli:main", "corpus metrics of system outputs (SARI, BLEU, FKGL, ...), like easse"),
    "human": Command("jobs.human_cli:main", "blind human-rating sheet out of a run (export), ratings in (import)"),
    "curve": Command("jobs.curve_cli:main", "SARI against training rows over finished runs (paper 000 Fig. 3)"),
    "simplify-doc": Command("jobs.simplify_doc_cli:main", "one document through one AgentSimp configuration"),
    "stage-models": Command("jobs.stage_models:main", "download a config's hf: models into its shared cache"),
    "data": Command("jobs.data_cli:main", "the corpora the jobs read: list them, get and verify one, mirror them"),
}


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="quorum", formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        description="Distributed training and evaluation jobs on Ray for LLM judges, juries and the models they "
                    "train.", epilog=f"commands:\n{listing}\n\n`quorum COMMAND --help` gives a command's usage.")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's arguments")
    return parser


def exit_code(stop: SystemExit) -> int:
    """argparse exits with 0 (--help) or 2 (usage error); anything else a command passed to sys.exit."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
        module_name, _, function = COMMANDS[args.command].entry.partition(":")
        return getattr(importlib.import_module(module_name), function)(args.args)
    except SystemExit as stop:
        return exit_code(stop)
    except ConfigError as exc:
        print(f"quorum: error: {exc}", file=sys.stderr)
        return 2
    except INPUT_ERRORS as exc:
        print(f"quorum: input error: {exc}", file=sys.stderr)
        return 2


# -- quorum run -------------------------------------------------------------------------------------------------


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quorum run", add_help=False, allow_abbrev=False,
        description="Run the job named by CONFIG's `job:` key: CONFIG plus dotted overrides, validated before any "
                    "work; a finished stage with the same config is reused (resume).")
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="the job's YAML config")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides of the config's keys (list items by index: generate.0.sampling.seed=3)")
    parser.add_argument("--no-resume", action="store_true", help="re-run every stage (run.resume=false)")
    parser.add_argument("--resume", action="store_true", help="reuse finished stages (the default)")
    parser.add_argument("--verbose", action="store_true", help="Ray's and the workers' output on the terminal too")
    parser.add_argument("-h", "--help", action="store_true",
                        help="this usage; with CONFIG, also every key of its job's config")
    return parser


def run_main(argv: list[str]) -> int:
    parser = run_parser()
    args = parser.parse_intermixed_args(argv)
    if args.help:
        print(parser.format_help())
        if args.config:
            from jobs.config_help import print_config_keys

            print_config_keys(args.config)
        return 0
    if args.config is None:
        parser.error("the following arguments are required: CONFIG.yaml")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"an override is key=value, got {bad[0]!r}")
    flags = [f for f, on in (("--no-resume", args.no_resume), ("--resume", args.resume), ("--verbose", args.verbose))
             if on]
    return run_job(job_module(args.config), [args.config, *args.overrides, *flags])


if __name__ == "__main__":
    sys.exit(main())
