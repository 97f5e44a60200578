"""`quorum submit`: run a job's driver on a Ray cluster through Ray's Job Submission API, in one command.

    quorum submit CONFIG.yaml [key=value ...] [--address URL] [--home DIR] [--follow] [--no-resume]
                  [--entrypoint-num-cpus N] [--entrypoint-memory BYTES] [--working-dir DIR] [--env NAME=VALUE]
                  [--no-check]

What it does (what `ray job submit` needs five settings for):

- checks the config here first, as the job will read it (unknown keys, types, missing files: exit 2 before
  anything is uploaded; `--no-check` skips this when the files exist only on the cluster);
- uploads `--working-dir` (default: the current directory, which must hold CONFIG) without wheels, runs, virtual
  environments, W&B folders, git history, `.env` files and anything `.gitignore` names;
- gives the job `QUORUM_HOME` = `--home` (default: `$QUORUM_HOME`, else the current directory), so a relative
  `run.root` and relative data paths mean what they mean here; on a cluster that is the shared filesystem;
- reserves the driver's CPUs (`--entrypoint-num-cpus`, default 1) and optional memory, so Ray places it where they
  are free (on `cluster.yaml` the head has no CPUs: the driver goes to a worker);
- passes secrets by name only: the values the job reads (`*_env` keys of the config, `WANDB_API_KEY`) must be set
  in the cluster's environment; `--env` refuses a secret-looking name, because Ray writes runtime-env variables
  to its logs in clear text;
- authenticates to a token-auth cluster with the token from `RAY_AUTH_TOKEN` or the file `RAY_AUTH_TOKEN_PATH`
  (else Ray's own lookup when `RAY_AUTH_MODE=token`); the token is sent as a header and never printed;
- prints the submission id and the run directory; `--follow` tails the job's logs until it ends and exits 0 only
  when it succeeded (Ctrl-C stops following, not the job).

The address is `--address`, else `RAY_ADDRESS`, else http://127.0.0.1:8265 (the dashboard's default port).
Exit codes: 0 submitted (or, with --follow, succeeded), 2 bad config or arguments, 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from core.config import ConfigError, apply_override, check_env_vars, load_config, read_yaml, with_defaults
from core.paths import HOME_ENV, as_overrides, resolve_paths
from core.tracking import secret_env_names

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# never worth uploading (`.gitignore`d files are skipped by Ray as well)
EXCLUDES = ["*.whl", "runs/", ".venv/", "wandb/", ".git/", ".env", "__pycache__/", ".pytest_cache/"]
VALUE_FLAGS = ("--address", "--home", "--entrypoint-num-cpus", "--entrypoint-memory", "--working-dir", "--env")


@dataclass
class Submission:
    config: str
    overrides: list[str] = field(default_factory=list)
    address: str = ""
    home: str = ""
    working_dir: str = "."
    num_cpus: float = 1.0
    memory: int = 0
    env: dict[str, str] = field(default_factory=dict)
    follow: bool = False
    check_config: bool = True


def build_parser() -> argparse.ArgumentParser:
    head, _usage, details = __doc__.split("\n\n", 2)
    parser = argparse.ArgumentParser(prog="quorum submit", allow_abbrev=False, description=head.split(": ", 1)[1],
                                     epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", metavar="CONFIG.yaml", help="the job's YAML config (inside --working-dir)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the config's keys")
    parser.add_argument("--address", help=f"the Ray dashboard (default: RAY_ADDRESS, else {DEFAULT_ADDRESS})")
    parser.add_argument("--home", help="QUORUM_HOME of the job (default: $QUORUM_HOME, else the current directory)")
    parser.add_argument("--entrypoint-num-cpus", metavar="N", help="CPUs reserved for the driver (default 1)")
    parser.add_argument("--entrypoint-memory", metavar="BYTES", help="memory reserved for the driver")
    parser.add_argument("--working-dir", metavar="DIR", help="the directory uploaded (default: .)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable of the job's runtime env (never a secret: Ray logs them)")
    parser.add_argument("--follow", action="store_true", help="tail the job's logs; exit 0 only if it succeeded")
    parser.add_argument("--no-resume", action="store_true", help="re-run every stage (run.resume=false)")
    parser.add_argument("--resume", action="store_true", help="reuse finished stages (the default)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip checking the config here (its files exist only on the cluster)")
    return parser


def parse_args(argv: list[str]) -> Submission:
    """`CONFIG [key=value ...] [flags]` (flags anywhere after CONFIG); argparse exits 2 on an unknown flag."""
    args = build_parser().parse_intermixed_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise ConfigError(f"quorum submit: an override is key=value, got {bad[0]!r}")
    sub = Submission(config=args.config, overrides=list(args.overrides), follow=args.follow,
                     check_config=not args.no_check)
    if args.no_resume:
        sub.overrides.append("run.resume=false")
    for flag in VALUE_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                _set(sub, flag, item)
    return sub


def _set(sub: Submission, flag: str, value: str) -> None:
    if flag in ("--entrypoint-num-cpus", "--entrypoint-memory"):
        try:
            number = float(value) if flag == "--entrypoint-num-cpus" else int(value)
        except ValueError:
            number = -1
        if number < 0:
            raise ConfigError(f"quorum submit: {flag}: expected a number >= 0, got {value!r}")
        if flag == "--entrypoint-num-cpus":
            sub.num_cpus = number
        else:
            sub.memory = number
    elif flag == "--env":
        name, eq, val = value.partition("=")
        if not eq or not name:
            raise ConfigError(f"quorum submit: --env expects NAME=VALUE, got {value!r}")
        check_env_vars({name: val}, "--env")
        sub.env[name] = val
    else:
        setattr(sub, {"--address": "address", "--home": "home", "--working-dir": "working_dir"}[flag], value)


@dataclass
class Plan:
    """What is submitted: the entrypoint, the runtime env, the driver's resources, and where the run lands."""

    job: str
    entrypoint: str
    runtime_env: dict
    run_dir: str
    secrets: list[str]
    num_cpus: float
    memory: int


def plan(sub: Submission, job_module: Callable[[str], ModuleType], environ: dict | None = None) -> Plan:
    """Everything but the HTTP call (no Ray). `job_module(config_path)` is `jobs.cli.job_module` (passed in: the
    CLI imports this module). Raises ConfigError naming the flag, file or key."""
    environ = os.environ if environ is None else environ
    workdir = Path(sub.working_dir).resolve()
    if not workdir.is_dir():
        raise ConfigError(f"--working-dir: {sub.working_dir!r} is not a directory")
    config = Path(sub.config).resolve()
    if not config.is_file():
        raise ConfigError(f"{sub.config}: no such config file")
    if not config.is_relative_to(workdir):
        raise ConfigError(f"{sub.config}: outside the uploaded working directory {workdir}; run from a directory "
                          f"that holds it or pass --working-dir")
    home = str(Path(sub.home or environ.get(HOME_ENV) or os.getcwd()).resolve())
    module = job_module(str(config))
    data = read_yaml(config)
    job = data.pop("job")
    data = with_defaults(module.Config, data)
    for override in sub.overrides:
        apply_override(data, override)
    # as the job will see them: relative paths against the home unless the upload holds them
    changes = resolve_paths(data, {HOME_ENV: home}, cwd=str(workdir))
    if sub.check_config:
        try:
            with contextlib.chdir(workdir):
                cfg = load_config(module.Config, str(config), [*sub.overrides, *as_overrides(changes)])
        except ConfigError as exc:
            raise ConfigError(f"{exc} (checked here before submitting; --no-check skips this when the files exist "
                              f"only on the cluster)") from None
        # what cannot run on the cluster it is written for is refused before the upload (`quorum plan`'s check)
        from jobs.plan_check import preflight

        preflight(cfg)
    run = data.get("run") or {}
    root = changes.get("run.root") or run.get("root") or "runs"
    run_dir = f"{root.rstrip('/')}/{job}/{run.get('id') or config.stem}"
    excludes = list(EXCLUDES)
    if "://" not in root and Path(root).resolve().is_relative_to(workdir) and Path(root).resolve() != workdir:
        excludes.append(f"/{Path(root).resolve().relative_to(workdir)}/")  # earlier runs' outputs stay here
    entrypoint = shlex.join(["quorum", "run", str(config.relative_to(workdir)), *sub.overrides])
    runtime_env = {"working_dir": str(workdir), "excludes": excludes, "env_vars": {**sub.env, HOME_ENV: home}}
    return Plan(job, entrypoint, runtime_env, run_dir, secret_names(data), sub.num_cpus, sub.memory)


def secret_names(data: dict) -> list[str]:
    """The variables the job reads secrets from: the config's `*_env` values, and the W&B key when W&B is on."""
    names = secret_env_names(data, well_known=False)
    if (data.get("wandb") or {}).get("enabled"):
        names.add("WANDB_API_KEY")
    return sorted(names)


def auth_headers(environ: dict | None = None) -> dict[str, str]:
    """The bearer header for a token-auth cluster from RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH; {} lets
    Ray's client decide (it sends ~/.ray/auth_token when RAY_AUTH_MODE=token)."""
    environ = os.environ if environ is None else environ
    token = environ.get("RAY_AUTH_TOKEN", "").strip()
    path = environ.get("RAY_AUTH_TOKEN_PATH", "")
    if not token and path:
        try:
            token = Path(path).expanduser().read_text().strip()
        except OSError as exc:
            raise ConfigError(f"RAY_AUTH_TOKEN_PATH: cannot read the token file {path} ({exc.strerror})") from None
    return {"Authorization": f"Bearer {token}"} if token else {}


def client(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=auth_headers())
    except (ConnectionError, RuntimeError, ValueError) as exc:
        # Ray's messages name the address and, for 401/403, the token variables; never the token itself
        raise SubmitError(f"cannot reach the Ray Jobs API at {address}: {exc}") from None


class SubmitError(RuntimeError):
    """The cluster refused or could not be reached (exit 1)."""


def main(argv: list[str], job_module: Callable[[str], ModuleType] | None = None) -> int:
    """`quorum submit ...`; `job_module` maps a config to its job's module (default: `jobs.entry.job_module`)."""
    if job_module is None:
        from jobs.entry import job_module
    sub = parse_args(argv)
    p = plan(sub, job_module)
    address = sub.address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    try:
        jobs = client(address)
        submission = jobs.submit_job(entrypoint=p.entrypoint, runtime_env=p.runtime_env,
                                     entrypoint_num_cpus=p.num_cpus, entrypoint_memory=p.memory or None,
                                     metadata={"quorum_job": p.job, "quorum_run_dir": p.run_dir})
    except (SubmitError, RuntimeError, ConnectionError) as exc:
        print(f"quorum submit: error: {exc}", file=sys.stderr)
        return 1
    print(f"quorum: submission id: {submission}", flush=True)
    print(f"quorum: run directory: {p.run_dir}", flush=True)
    if p.secrets:
        print(f"quorum: the job reads these secrets from the cluster's environment, by name: {', '.join(p.secrets)}",
              flush=True)
    if not sub.follow:
        print(f"quorum: follow with: ray job logs --address {address} --follow {submission}", flush=True)
        return 0
    return follow(jobs, submission)


def follow(jobs, submission: str) -> int:
    """Print the job's logs as they come until it ends; 0 when it succeeded."""
    async def tail() -> None:
        async for lines in jobs.tail_job_logs(submission):
            print(lines, end="", flush=True)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        print(f"\nquorum: stopped following; the job keeps running (ray job stop {submission} stops it)", flush=True)
        return 130
    status = str(jobs.get_job_status(submission)).rsplit(".", 1)[-1]
    print(f"quorum: job {submission} {status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1
