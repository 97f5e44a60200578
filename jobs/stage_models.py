"""`quorum stage-models`: put a config's hub models into the shared Hugging Face cache its workers load from.

    quorum stage-models configs/policy_grpo_cluster.yaml            download every hf:<repo> the config names
    quorum stage-models configs/policy_grpo_cluster.yaml --list     say which are staged (exit 1 if any is not)

Run it once per config (and again after changing a model) on a machine that mounts the shared storage and reaches
the hub: the cluster's head (`ray attach cluster.yaml`), a pod with the shared claim (`kubectl exec`), or any machine
with the filesystem mounted at the same path. It downloads with huggingface_hub's `snapshot_download` into
`<ray.models.hf_home>/hub` (the cache layout every worker reads with HF_HOME=<hf_home> and HF_HUB_OFFLINE=1), skips
models already complete there, and leaves out Meta's `original/` consolidated checkpoints, which neither transformers
nor vLLM reads. Gated repos (meta-llama/...) need an accepted licence and HF_TOKEN in this shell's environment; the
token is never written to the cache, the config or a log. Jobs refuse to start while a model they name is missing
(core.model_store.check_models_staged). Exit codes: 0 all staged, 1 --list found missing models or a download
failed, 2 bad config or a repo the hub refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from core.config import ConfigError, load_config
from core.model_store import STAGE_IGNORE, missing_files, models_by_repo, snapshot_dir, unstaged
from core.paths import path_overrides


def build_parser() -> argparse.ArgumentParser:
    head, usage, details = __doc__.split("\n\n", 2)
    parser = argparse.ArgumentParser(prog="quorum stage-models", allow_abbrev=False,
                                     description=head.split(": ", 1)[1], epilog=f"examples:\n{usage}\n\n{details}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", metavar="CONFIG.yaml", help="the job config whose hf:<repo> models to stage")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the config's keys")
    parser.add_argument("--list", action="store_true", help="say which are staged (exit 1 if any is not)")
    return parser


def main(argv: list[str], job_module: Callable[[str], Any] | None = None) -> int:
    """`quorum stage-models CONFIG [key=value ...] [--list]`; `job_module` maps a config to its job's module
    (default: `jobs.entry.job_module`)."""
    if job_module is None:
        from jobs.entry import job_module
    args = build_parser().parse_intermixed_args(argv)
    config_path, overrides = args.config, list(args.overrides)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"quorum stage-models: an override is key=value, got {bad[0]!r}")
    module = job_module(config_path)
    cfg = load_config(module.Config, config_path, overrides + path_overrides(module.Config, config_path, overrides))
    config = dataclasses.asdict(cfg)
    models = cfg.ray.models
    repos = models_by_repo({k: v for k, v in config.items() if k != "ray"})
    cache = models.hub_cache()
    if not repos:
        print(f"quorum stage-models: {config_path} names no hf:<repo> models; nothing to stage")
        return 0
    missing = unstaged(config, models)
    for repo, keys in repos.items():
        state = f"missing {missing[repo][1]}" if repo in missing else "staged"
        print(f"quorum stage-models: {repo}: {state} ({', '.join(keys)})")
    if args.list:
        print(f"quorum stage-models: {len(repos) - len(missing)} of {len(repos)} staged in {cache}")
        return 1 if missing else 0
    failed = [repo for repo in missing if not download(repo, cache, missing[repo][0][0])]
    if failed:
        return 1
    print(f"quorum stage-models: {len(repos)} models staged in {cache} ({len(missing)} downloaded)", flush=True)
    return 0


def download(repo: str, cache: str, key: str) -> bool:
    """snapshot_download `repo` into `cache`; whether the snapshot is then complete. Errors name the config key."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        raise ConfigError("HF_HUB_OFFLINE is set in this environment: staging downloads from the hub, so unset it "
                          "here (the workers' offline mode comes from ray.models.hub_access, not from this shell)")
    print(f"quorum stage-models: downloading {repo} into {cache}", flush=True)
    try:
        snapshot_download(repo, cache_dir=cache, ignore_patterns=list(STAGE_IGNORE))
    except GatedRepoError as exc:
        raise ConfigError(f"{key}: {repo} is gated: accept its licence on the hub and export HF_TOKEN "
                          f"({type(exc).__name__})") from None
    except RepositoryNotFoundError as exc:
        raise ConfigError(f"{key}: no hub repo {repo!r} (or it is private and HF_TOKEN is not set) "
                          f"({type(exc).__name__})") from None
    snapshot = snapshot_dir(repo, cache)
    lacking = ["the whole model"] if snapshot is None else missing_files(snapshot)
    if lacking:
        print(f"quorum stage-models: {repo}: downloaded, but still missing {', '.join(lacking)}", file=sys.stderr)
    return not lacking
