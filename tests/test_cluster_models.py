"""The model and storage story of a cluster config (core.model_store, core.ray_env): the environment every worker
gets, the checks that refuse a config before any work, and `quorum stage-models`.

The hub is the edge of the world here: a test that downloads replaces `huggingface_hub.snapshot_download` with a
writer of the cache layout huggingface_hub itself reads back (`try_to_load_from_cache`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from core.config import ConfigError, build, load_config
from core.model_store import ModelsConfig, check_models_staged, hub_models, missing_files, unstaged
from core.ray_env import RayConfig, worker_env
from jobs.cli import job_module
from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
CLUSTER_CONFIGS = sorted((REPO / "configs").glob("*_cluster.yaml"))
SHARED = "/mnt/shared"


def stage_fake(hub_cache: Path, repo: str, files: dict[str, str], commit: str = "0" * 40) -> Path:
    """What snapshot_download leaves for `repo` in `hub_cache`: refs/main -> snapshots/<commit>/<files>."""
    root = hub_cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    for name, text in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text(text)
    return snapshot


COMPLETE = {"config.json": "{}", "model.safetensors": "w"}


# ---------------------------------------------------------------------------------------------------------------
# the environment every worker gets


def test_worker_env_follows_the_config_not_the_submitting_shell():
    cfg = RayConfig(shared_storage=SHARED, models=ModelsConfig(hub_access="offline", hf_home="/mnt/shared/hf"))
    # a shell that says otherwise (`HF_HUB_OFFLINE=0 ray job submit ...`) changes nothing: the config decides
    env = worker_env(cfg, environ={"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_HOME": "/home/me/.hf"})
    assert (env["HF_HOME"], env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"]) == ("/mnt/shared/hf", "1", "1")
    online = worker_env(RayConfig(models=ModelsConfig(hub_access="online", hf_home="/mnt/shared/hf")), environ={})
    assert (online["HF_HOME"], online["HF_HUB_OFFLINE"], online["TRANSFORMERS_OFFLINE"]) == ("/mnt/shared/hf", "0", "0")
    # one machine: no HF_HOME, so each process keeps its own default cache; offline unless the config says online
    local = worker_env(RayConfig(), environ={})
    assert "HF_HOME" not in local and local["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=lambda p: p.name)
def test_every_cluster_config_gives_its_workers_the_shared_model_cache(path):
    # the `ray` and `run` sections alone: a cluster config's data paths exist only on the cluster
    data = yaml.safe_load(path.read_text())
    ray = build(RayConfig, data["ray"], "ray")
    ray.validate("ray")
    env = worker_env(ray, environ={})
    assert ray.shared_storage == SHARED
    assert (env["HF_HOME"], env["HF_HUB_OFFLINE"]) == ("/mnt/shared/hf", "1")
    root = (data.get("run") or {}).get("root")
    assert root in (None, "/mnt/shared/quorum/runs"), root  # grm_cluster (a Serve app) has no run root


def test_the_printed_serve_config_carries_the_model_env():
    """`quorum serve --print-config` output (the RayService's serveConfigV2) gives replicas the shared cache."""
    from jobs.serve_grm import Config, serve_config

    printed = serve_config(load_config(Config, REPO / "configs" / "grm_cluster.yaml"))
    env = printed["applications"][0]["runtime_env"]["env_vars"]
    assert (env["HF_HOME"], env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"]) == ("/mnt/shared/hf", "1", "1")


# A fresh local cluster through quorum's own init_ray, in a subprocess (the session's shared Ray must not be the one
# asked): the shell says offline and names another HF_HOME; the config's online story is what the worker sees.
SCRIPT = """
import json, os, sys, ray
from core.model_store import ModelsConfig
from core.ray_env import RayConfig, init_ray
init_ray(RayConfig(num_cpus=1, models=ModelsConfig(hub_access="online", hf_home=sys.argv[1])))

@ray.remote(num_cpus=0.5)
def probe():
    return {k: os.environ.get(k) for k in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}

print("PROBE", json.dumps(ray.get(probe.remote())))
ray.shutdown()
"""


def test_a_ray_worker_gets_the_configs_model_env():
    ray_tmp = tempfile.mkdtemp(prefix="qm", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "RAY_TMPDIR": ray_tmp, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/nowhere/else"}
    try:
        out = subprocess.run([sys.executable, "-c", SCRIPT, f"{ray_tmp}/hf"], env=env, capture_output=True,
                             check=False, text=True, timeout=180, cwd=REPO)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    probe = [line for line in out.stdout.splitlines() if line.startswith("PROBE")]
    assert probe, out.stderr[-3000:]
    assert json.loads(probe[0].split(" ", 1)[1]) == {"HF_HOME": f"{ray_tmp}/hf", "HF_HUB_OFFLINE": "0",
                                                     "TRANSFORMERS_OFFLINE": "0"}


# ---------------------------------------------------------------------------------------------------------------
# refused before any work (exit 2, naming the key)


@pytest.mark.parametrize("override, key", [
    ("run.root=/tmp/quorum-runs", "run.root"),                    # a node's own disk
    ("run.root=runs", "run.root"),                                # relative: Ray's temporary working directory
    ("ray.models.hf_home=", "ray.models.hf_home"),                # offline hub models, each node its own cache
    ("ray.models.hf_home=/home/ray/hf", "ray.models.hf_home"),    # a cache off the shared storage
    ("ray.models.hub_access=sometimes", "ray.models.hub_access"),
    ("ray.env_vars={HF_HUB_OFFLINE: '0'}", "ray.env_vars.HF_HUB_OFFLINE"),  # the model story has one place
    ("ray.shared_storage=mnt/shared", "ray.shared_storage"),
])
def test_a_cluster_config_off_the_shared_storage_is_refused(override, key, capsys):
    assert cli_main(["run", str(REPO / "configs" / "craft_cluster.yaml"), override]) == 2
    assert f"{key}:" in capsys.readouterr().err


def test_trainer_checkpoints_must_be_on_the_shared_storage_too():
    path = REPO / "configs" / "policy_lexical_cluster.yaml"
    with pytest.raises(ConfigError, match=r"train\.trainer\.storage_path: '/var/ckpt' is not on ray.shared_storage"):
        load_config(job_module(str(path)).Config, path, ["train.trainer.storage_path=/var/ckpt"])
    # durable URIs are not a node's disk
    load_config(job_module(str(path)).Config, path, ["train.trainer.storage_path=s3://bucket/ckpt"])


def test_unstaged_hub_models_stop_the_job_before_any_work(tmp_path, capsys):
    hf_home, runs = tmp_path / "hf", tmp_path / "runs"
    argv = ["run", str(REPO / "configs" / "demo_scores.yaml"), "generate.0.engine.model=hf:acme/absent-1b",
            f"ray.models.hf_home={hf_home}", f"run.root={runs}"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "generate.0.engine.model: hub model 'acme/absent-1b' is not staged" in err
    assert "quorum stage-models" in err and str(REPO / "configs" / "demo_scores.yaml") in err
    assert not runs.exists()  # no run directory: nothing started


def test_a_snapshot_counts_as_staged_only_when_complete(tmp_path):
    hub = tmp_path / "hf" / "hub"
    models = ModelsConfig(hf_home=str(tmp_path / "hf"))
    config = {"a": {"model": "hf:acme/one"}, "b": [{"engine": {"model": "hf:acme/sharded"}}], "c": "smollm2-135m"}
    assert list(hub_models(config)) == [("a.model", "acme/one"), ("b.0.engine.model", "acme/sharded")]
    assert set(unstaged(config, models)) == {"acme/one", "acme/sharded"}
    stage_fake(hub, "acme/one", {"config.json": "{}"})  # an interrupted download: no weights
    index = {"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}
    snapshot = stage_fake(hub, "acme/sharded", {"config.json": "{}", "model.safetensors.index.json": json.dumps(index),
                                                "model-00001-of-00002.safetensors": "w"})
    assert missing_files(snapshot) == ["model-00002-of-00002.safetensors"]
    with pytest.raises(ConfigError, match=r"^a\.model: .*missing: model weights.*1 more hub models"):
        check_models_staged(config, models)
    stage_fake(hub, "acme/one", COMPLETE)
    (snapshot / "model-00002-of-00002.safetensors").write_text("w")
    check_models_staged(config, models)
    # online access downloads what is missing on the workers: nothing to refuse
    check_models_staged({"m": "hf:acme/elsewhere"}, ModelsConfig(hub_access="online", hf_home=str(tmp_path / "hf")))


# ---------------------------------------------------------------------------------------------------------------
# quorum stage-models


def write_config(tmp_path: Path, hf_home: Path) -> Path:
    data = yaml.safe_load((REPO / "configs" / "demo_scores.yaml").read_text())
    data["generate"][0]["engine"]["model"] = "hf:acme/gen-1b"
    data["generate"][1]["engine"]["model"] = "hf:acme/gen-1b"
    data["run"] = {"root": str(tmp_path / "runs")}
    data["ray"] = {"models": {"hub_access": "offline", "hf_home": str(hf_home)}}
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_stage_models_downloads_each_hub_model_once_into_hf_home(tmp_path, monkeypatch, capsys):
    import huggingface_hub
    from huggingface_hub import constants

    hf_home = tmp_path / "hf"
    config = write_config(tmp_path, hf_home)
    calls = []

    def fake_snapshot_download(repo_id, cache_dir, ignore_patterns):
        calls.append((repo_id, cache_dir, ignore_patterns))
        stage_fake(Path(cache_dir), repo_id, COMPLETE)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert cli_main(["stage-models", str(config), "--list"]) == 1
    assert "acme/gen-1b: missing the whole model (generate.0.engine.model, generate.1.engine.model)" in \
        capsys.readouterr().out
    assert cli_main(["stage-models", str(config)]) == 0
    assert calls == [("acme/gen-1b", str(hf_home / "hub"), ["original/*"])]
    assert cli_main(["stage-models", str(config)]) == 0 and len(calls) == 1  # staged: not downloaded again
    assert cli_main(["stage-models", str(config), "--list"]) == 0
    # and the job's own check now lets it start
    cfg = load_config(job_module(str(config)).Config, config)
    check_models_staged(dataclasses.asdict(cfg), cfg.ray.models)


def test_stage_models_refuses_to_run_offline(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert cli_main(["stage-models", str(write_config(tmp_path, tmp_path / "hf"))]) == 2
    assert "HF_HUB_OFFLINE is set in this environment" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "hf" / "hub" / "models--acme--gen-1b")
