"""`quorum serve`: start, update or describe the generative reward model (GRM) Serve app.

    quorum serve configs/grm.yaml [key=value ...]            start (a local Ray unless ray.address / RAY_ADDRESS
                                                             names one); blocks, Ctrl-C stops the app
    quorum serve configs/grm.yaml ray.address=auto judge.adapter=runs/r2/adapter --detach
                                                             update the running app in place and return
    quorum serve configs/grm.yaml --print-config[=out.yaml]  write a Serve config for `serve run` / `serve deploy`

Re-running against a live app (same `serve.app_name`) is a rolling update: Serve starts the new replica (new
adapter, new batching, ...) before it stops the old one, so the endpoint stays up. With a config file from
`--print-config`, editing `deployments[0].user_config` and `serve deploy`-ing it again reconfigures the replicas in
place without restarting them.

`--detach` needs a running Ray cluster named by `ray.address` or RAY_ADDRESS (`ray.address=auto` joins the local
cluster a blocking `quorum serve` started): a local cluster started by this process would die with it. No cluster
is ever joined unless named, so a shared machine's other clusters are left alone.
Exit codes: 0 success, 2 bad config or arguments, 1 anything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from core.config import ConfigError, load_config
from core.model_store import check_models_staged
from core.ray_env import RayConfig, init_ray, worker_env
from core.tracking import install_redaction, secret_env_names
from serve.config import ServeConfig

# `quorum run` / tests/test_config.py find a job's config class under this name
Config = ServeConfig

log = logging.getLogger("quorum.serve")
_POLL_S = 5.0
_READY_TIMEOUT_S = 600.0


def build_parser() -> argparse.ArgumentParser:
    head, usage, details = __doc__.split("\n\n", 2)
    parser = argparse.ArgumentParser(prog="quorum serve", allow_abbrev=False, description=head.split(": ", 1)[1],
                                     epilog=f"examples:\n{usage}\n\n{details}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", metavar="CONFIG.yaml", help="the Serve app's YAML config (configs/grm.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the config's keys")
    parser.add_argument("--detach", action="store_true",
                        help="update the app on the running cluster named by ray.address / RAY_ADDRESS and return")
    parser.add_argument("--print-config", nargs="?", const="-", metavar="PATH",
                        help="write a Serve config for `serve run` / `serve deploy` to PATH (default: stdout)")
    return parser


def main(argv: list[str] | ServeConfig, config_path: str | None = None) -> int:
    """`quorum serve CONFIG [key=value ...] [flags]`; `quorum run CONFIG` passes the loaded config instead."""
    if isinstance(argv, ServeConfig):
        return run(argv, detach=False)
    args = build_parser().parse_intermixed_args(argv)
    config_path, overrides, detach, print_to = args.config, list(args.overrides), args.detach, args.print_config
    if print_to is not None and "=" in print_to and not print_to.endswith((".yaml", ".yml", ".json")):
        overrides.append(print_to)  # `--print-config key=value`: the override argparse took as the flag's value
        print_to = "-"
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"quorum serve: an override is key=value, got {bad[0]!r}")
    cfg = load_config(ServeConfig, config_path, overrides)
    install_redaction(secret_env_names(dataclasses.asdict(cfg)))
    if print_to is not None:
        write_serve_config(cfg, print_to)
        return 0
    return run(cfg, detach)


def run(cfg: ServeConfig, detach: bool) -> int:
    from ray import serve

    from serve.app import check_replicas_fit, make_app

    log.info("resolved config: %s", json.dumps(dataclasses.asdict(cfg), sort_keys=True))
    check_models_staged(dataclasses.asdict(cfg), cfg.ray.models)
    token_env = cfg.serve.auth_token_env
    if token_env and not os.environ.get(token_env):
        log.warning("serve.auth_token_env=%s is not set here; replicas without it serve WITHOUT auth", token_env)
    started_local = connect_ray(cfg.ray, detach)
    try:
        serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
        check_replicas_fit(cfg)
        serve.run(make_app(cfg), name=cfg.serve.app_name, route_prefix=cfg.serve.route_prefix,
                  blocking=False)
        wait_until_running(cfg.serve.app_name, _READY_TIMEOUT_S)
        base = f"http://{cfg.serve.host}:{cfg.serve.port}{cfg.serve.route_prefix.rstrip('/')}"
        print(f"quorum serve: app {cfg.serve.app_name!r} running at {base} "
              "(/v1/chat/completions /score /compare /reward/group /openrlhf /health /ready /stats)", flush=True)
        if detach:
            return 0
        print("quorum serve: Ctrl-C to stop", flush=True)
        # a process manager's SIGTERM stops the app as cleanly as Ctrl-C
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while True:
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            print("quorum serve: stopping", flush=True)
            # the app goes first, on a local cluster too: its replicas stop gracefully (their judge engines closed,
            # the monitors' W&B runs finished and written) before the cluster that ran them does
            serve.delete(cfg.serve.app_name)
        return 0
    finally:
        if started_local:
            import ray

            ray.shutdown()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def connect_ray(cfg: RayConfig, detach: bool) -> bool:
    """Join the cluster at `ray.address` / RAY_ADDRESS, else start a local one (not with --detach).

    Never joins a cluster that was not named: on a shared machine "auto" could be somebody else's. Returns True
    when the cluster was started here (and so stops when this process exits).
    """
    import ray

    if ray.is_initialized():
        return False
    address = cfg.address or os.environ.get("RAY_ADDRESS", "")
    if detach and not address:
        raise ConfigError("--detach needs a running Ray cluster: set ray.address (`auto` for the local one a "
                          "blocking `quorum serve` started) or RAY_ADDRESS; a local cluster started here would stop "
                          "on exit")
    init_ray(cfg)
    if not address:
        # `auto` finds the newest local cluster (with its auth token); a bare GCS address would need the token too
        print(f"quorum serve: started a local Ray cluster at {ray.get_runtime_context().gcs_address}; update this app "
              "from another shell with `quorum serve CONFIG ray.address=auto ... --detach`", flush=True)
    return not address


def wait_until_running(app_name: str, timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(app_name)
        if app is not None and app.status == "RUNNING":
            return
        if (app is not None and app.status == "DEPLOY_FAILED") or time.monotonic() > deadline:
            raise RuntimeError(f"Serve app {app_name!r} did not start: {app}")
        time.sleep(1.0)


# ---------------------------------------------------------------------------------------------------------------
# One app per run (policy GRPO deploys its judge as `serve.config.run_app_name(app_name, run id)`)

# the namespace of the actors that say which run holds which app (any job of the cluster can look them up there)
OWNER_NAMESPACE = "quorum-serve-apps"


def app_owner(app: str):
    """The live owner actor of `app` (another driver holds it), or None."""
    import ray

    try:
        return ray.get_actor(app, namespace=OWNER_NAMESPACE)
    except ValueError:
        return None


def _clash(app: str, owner) -> ConfigError:
    import ray

    try:
        job = ray.get(owner.job_id.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - the owner just went away: still a clash at the moment we looked
        job = "unknown"
    return ConfigError(
        f"run.id: the Serve app {app!r} of this run id is held by a running job (Ray job {job}); a second run "
        "would replace its judge and delete it when it ends. Give this run its own run.id, or stop that job first")


def check_app_free(app: str) -> None:
    """Refuse (ConfigError, exit 2) before any work when a live driver holds `app` (`claim_app`)."""
    owner = app_owner(app)
    if owner is not None:
        raise _clash(app, owner)


def claim_app(app: str):
    """Hold `app` for this driver: a named actor in `OWNER_NAMESPACE`, created atomically (a second driver's create
    fails while it lives) and fate-shared with this driver, so a driver that dies releases it. Returns the actor;
    `release_app` ends it. Raises ConfigError when another live driver holds the name."""
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class AppOwner:
        def job_id(self) -> str:
            return ray.get_runtime_context().get_job_id()

    try:
        owner = AppOwner.options(name=app, namespace=OWNER_NAMESPACE).remote()
        ray.get(owner.job_id.remote(), timeout=60)
    except ValueError:  # the name is taken: Ray refuses a second actor of one name in a namespace
        raise _clash(app, app_owner(app)) from None
    return owner


def release_app(owner) -> None:
    import ray

    ray.kill(owner, no_restart=True)


def existing_app(app: str):
    """Serve's status of `app` in the connected cluster, or None."""
    from ray import serve

    return serve.status().applications.get(app)


# ---------------------------------------------------------------------------------------------------------------
# --print-config


def serve_config(cfg: ServeConfig) -> dict:
    """A Serve config file (`serve run` / `serve deploy`) equivalent to `quorum serve` with this config."""
    from serve.app import DEPLOYMENT_NAME, deployment_options

    env_vars = worker_env(cfg.ray, environ={})  # the config's own worker env, not this shell's
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": cfg.serve.host, "port": cfg.serve.port},
        "applications": [{
            "name": cfg.serve.app_name,
            "route_prefix": cfg.serve.route_prefix,
            "import_path": "serve.app:build_app",
            "runtime_env": {"env_vars": env_vars},
            "args": app_args(cfg),
            "deployments": [{"name": DEPLOYMENT_NAME, **deployment_options(cfg)}],
        }],
    }


def app_args(cfg: ServeConfig) -> dict:
    """The config as `build_app` args: everything but the Ray connection, with local paths made absolute."""
    args = dataclasses.asdict(cfg)
    args.pop("ray")
    user = cfg.user_config()
    args["judge"], args["prompts"] = user["judge"], user["prompts"]
    return args


def write_serve_config(cfg: ServeConfig, target: str) -> None:
    header = (
        "# Generated by `quorum serve ... --print-config`. Deploy: serve deploy THIS.yaml (or serve run THIS.yaml).\n"
        "# Edit deployments[0].user_config (judge.adapter, batching, ...) and deploy again to reconfigure the\n"
        "# replicas in place; a change under `args` restarts them (rolling). No secrets are written here:\n"
        "# user_config.auth_token_env only names the variable that replicas read the token from.\n"
    )
    text = header + yaml.safe_dump(serve_config(cfg), sort_keys=False)
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text)
        print(f"quorum serve: wrote {target}", file=sys.stderr)
