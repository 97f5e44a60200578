"""W&B of the training workers: online when the job's run is, in the job run's group, with the job's entity and
tags, and the key handed over by name (actors.secrets), never in a config, a runtime env or the init arguments."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from core.config import ConfigError
from core.tracking import (
    WandbConfig,
    job_run_name,
    resolve_mode,
    trainer_tracking,
    wandb_secret_names,
    worker_wandb_init,
)
from train.config import GRPOConfig, TrainConfig
from train.trainer import worker_env, worker_secrets

KEY = "wandb-secret-value-0123456789"
TEAM = WandbConfig(project="menlo", entity="lab", tags=["paper-003", "judge-grpo"])


def trainer_cfg(environ: dict, wandb_cfg: WandbConfig = TEAM) -> GRPOConfig:
    """What `jobs.grpo_stages.stage_train` hands `run_grpo` for run `r1` of judge_grpo."""
    return dataclasses.replace(GRPOConfig(), run_name="grpo-judge_grpo",
                               **trainer_tracking(wandb_cfg, "judge_grpo", "r1", environ))


def init_kwargs(cfg, rank: int, environ: dict) -> dict | None:
    return worker_wandb_init(enabled=cfg.wandb, project=cfg.wandb_project, entity=cfg.wandb_entity,
                             mode=cfg.wandb_mode, group=cfg.wandb_group, tags=cfg.wandb_tags, run_name=cfg.run_name,
                             run_id="abc123", local_dir="/runs/x", config={"lr": 1e-6}, rank=rank, environ=environ)


def test_the_worker_run_is_online_when_the_driver_s_is():
    driver_env = {"WANDB_API_KEY": KEY}
    assert resolve_mode("auto", driver_env) == "online"
    cfg = trainer_cfg(driver_env)
    # the worker's own environment holds no key until the secrets are installed; the mode is the driver's
    kwargs = init_kwargs(cfg, 0, environ={})
    assert kwargs == {
        "project": "menlo", "entity": "lab", "group": "judge_grpo/r1", "tags": ["paper-003", "judge-grpo"],
        "job_type": "train", "name": "judge_grpo/r1/grpo-judge_grpo", "id": "abc123", "resume": "allow",
        "dir": "/runs/x", "mode": "online", "config": {"lr": 1e-6}}
    assert kwargs["group"] == job_run_name("judge_grpo", "r1")  # the job run's name is its own group too
    assert init_kwargs(cfg, 1, environ={}) is None  # rank 0 logs the reduced metrics
    assert KEY not in repr(kwargs) and KEY not in repr(dataclasses.asdict(cfg))


def test_the_key_travels_by_name_in_the_loop_config_never_in_the_runtime_env(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    cfg = trainer_cfg({"WANDB_API_KEY": KEY})
    secrets = worker_secrets(cfg, {"QUORUM_SERVE_TOKEN": "unused"})
    assert "WANDB_API_KEY" in secrets.names and KEY not in repr(secrets)
    assert KEY not in repr(worker_env(cfg)) and "WANDB_API_KEY" not in worker_env(cfg)
    # what a worker does with it: install, then wandb reads the variable
    monkeypatch.delenv("WANDB_API_KEY")
    pickle.loads(pickle.dumps(secrets)).install()
    import os

    assert os.environ["WANDB_API_KEY"] == KEY


def test_offline_and_disabled_jobs_send_no_key():
    offline = trainer_cfg({})  # no key on the driver: auto -> offline, for the workers too
    assert offline.wandb_mode == "offline" and init_kwargs(offline, 0, {"WANDB_API_KEY": KEY})["mode"] == "offline"
    assert wandb_secret_names(offline.wandb_mode) == [] and not worker_secrets(offline).names
    disabled = trainer_cfg({"WANDB_API_KEY": KEY}, WandbConfig(enabled=False))
    assert not disabled.wandb and init_kwargs(disabled, 0, {}) is None and not worker_secrets(disabled).names
    explicit = trainer_cfg({"WANDB_API_KEY": KEY}, WandbConfig(mode="offline"))
    assert explicit.wandb_mode == "offline"
    # W&B's own WANDB_MODE decides `auto` where it is set (the test suite keeps every run offline that way)
    assert trainer_cfg({"WANDB_API_KEY": KEY, "WANDB_MODE": "offline"}).wandb_mode == "offline"


def test_online_without_a_key_to_hand_over_is_refused():
    with pytest.raises(ConfigError, match="wandb.mode: online needs WANDB_API_KEY"):
        trainer_tracking(WandbConfig(mode="online"), "judge_grpo", "r1", {})


def test_a_trainer_without_a_job_resolves_auto_on_the_worker():
    cfg = TrainConfig(wandb=True)  # the Python API: run_training(cfg, ...) with no job around it
    assert init_kwargs(cfg, 0, {"WANDB_API_KEY": KEY})["mode"] == "online"
    assert init_kwargs(cfg, 0, {})["mode"] == "offline"
    assert init_kwargs(cfg, 0, {"WANDB_MODE": "disabled"})["mode"] == "disabled"
    assert init_kwargs(cfg, 0, {})["group"] is None and init_kwargs(cfg, 0, {})["entity"] is None
    with pytest.raises(ConfigError, match="wandb_mode"):
        GRPOConfig(wandb_mode="live").check("grpo")


def test_wandb_takes_the_worker_settings(tmp_path):
    """The settings through the real `wandb.init` (offline): the run file records the group, tags and job type."""
    from wandb_reader import find_run_files, read_run

    from core.tracking import start_worker_run

    cfg = dataclasses.replace(trainer_cfg({}), wandb_mode="offline")
    assert start_worker_run(cfg, run_id="w1", local_dir=str(tmp_path), config={"lr": 1e-6}, rank=1) is None
    run = start_worker_run(cfg, run_id="w1", local_dir=str(tmp_path), config={"lr": 1e-6}, rank=0)
    run.log({"reward/mean": 0.5}, step=1)
    run.finish()
    # `finish` returns once the W&B service has the run's exit; its writer may still hold the file's buffered block
    # (under load the file was read with only its header). Stopping the service closes the file.
    import wandb

    wandb.teardown()
    (record,) = [read_run(f) for f in find_run_files(tmp_path)]
    assert record["run"]["group"] == "judge_grpo/r1" and record["run"]["job_type"] == "train"
    assert record["run"]["tags"] == ["paper-003", "judge-grpo"] and record["run"]["project"] == "menlo"
    assert record["history"][0]["reward/mean"] == 0.5
