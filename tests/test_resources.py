"""Custom Ray resources for placement ({gpu_slot: 1}): actor pools (`pool.resources`) and Ray Train workers
(`trainer.resources_per_worker`) validate them with errors naming the dotted key, and hand them to Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.stage_config import PoolConfig
from core.config import ConfigError
from jobs.cli import main as cli_main
from train.config import TrainConfig
from train.trainer import build_trainer, worker_resources

REPO = Path(__file__).resolve().parents[1]


def test_pool_resources_reach_map_batches(monkeypatch):
    # the arguments only: whether a cluster can hold the pool (this session's Ray has no gpu_slot) is checked in
    # tests/test_bad_input.py
    monkeypatch.setattr("actors.ray_capacity.ensure_fits", lambda ask: None)
    kwargs = PoolConfig(num_cpus=0.5, resources={"gpu_slot": 1}).map_batches_kwargs()
    assert kwargs["resources"] == {"gpu_slot": 1.0} and kwargs["num_cpus"] == 0.5
    assert "resources" not in PoolConfig().map_batches_kwargs()  # none asked: Ray's default placement


@pytest.mark.parametrize("resources, named", [
    ({"": 1}, "generate.models.0.pool.resources: resource names must be non-empty"),
    ({"gpu_slot": -1}, "generate.models.0.pool.resources.gpu_slot: must be"),
    ({"gpu_slot": "one"}, "generate.models.0.pool.resources.gpu_slot: must be a finite number"),
    ({"GPU": 1}, "generate.models.0.pool.resources.GPU: GPU is not a custom resource"),
])
def test_pool_resources_errors_name_the_key(resources, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        PoolConfig(resources=resources).validate("generate.models.0.pool")


def test_pool_resources_from_a_job_config_and_override(capsys):
    """Through `quorum run`: a bad amount in a dotted override is refused (exit 2) naming the key."""
    assert cli_main(["run", str(REPO / "configs" / "demo.yaml"), "generate.0.pool.resources={gpu_slot: -2}"]) == 2
    assert "generate.0.pool.resources.gpu_slot: must be" in capsys.readouterr().err


def test_train_workers_get_resources_per_worker():
    cfg = TrainConfig(cpus_per_worker=2, resources_per_worker={"gpu_slot": 1})
    assert worker_resources(cfg) == {"CPU": 2, "gpu_slot": 1.0}
    trainer = build_trainer(cfg, {}, storage_path="/tmp/unused", loop=lambda config: None)
    assert trainer.scaling_config.resources_per_worker == {"CPU": 2, "gpu_slot": 1.0}
    assert worker_resources(TrainConfig()) == {"CPU": 1}


@pytest.mark.parametrize("resources, named", [
    ({"gpu_slot": -0.5}, "trainer.resources_per_worker.gpu_slot: must be"),
    ({" ": 1}, "trainer.resources_per_worker: resource names must be non-empty"),
    ({"CPU": 4}, "trainer.resources_per_worker.CPU: CPU is not a custom resource"),
])
def test_train_resources_errors_name_the_key(resources, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        TrainConfig(resources_per_worker=resources).validate("trainer")
