"""Defects a rehearsal exists to catch, seeded one by one into real runs (the plan-side ones: tests/test_plan.py).

- A Serve app name already taken: a live driver holds the app of run id `held` in a running Ray cluster; `quorum
  rehearse` of policy GRPO with that run id, pointed at the cluster, stops before any work (exit 2, no run
  directory) naming the app and `run.id`.
- A collective on a CPU tensor that the cluster's NCCL group would refuse: gloo, which the rehearsal's CPU workers
  run, serves it, so the rehearsal marks the trainers whose production backend is NCCL
  (`train.collectives.REHEARSAL_BACKEND_ENV`) and their workers check each collective
  (`train.collectives.guard_for_rehearsal`). A direct `torch.distributed.all_reduce` of a CPU tensor, seeded into
  the GRPO loop by a `sitecustomize` on the workers' PYTHONPATH (tests/plugins/cpu_collective), stops the run naming
  the collective, the device and the caller; the same run without it passes, DeepSpeed's ZeRO-3 collectives on CPU
  included.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from core.config import load_config, read_yaml
from jobs.entry import job_module
from jobs.rehearse import nested_configs
from jobs.rehearse_overrides import rehearsal_overrides
from train import collectives
from train.collectives import GUARDED, REHEARSAL_BACKEND_ENV, guard_for_rehearsal

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "plugins" / "cpu_collective"
NCCL = {REHEARSAL_BACKEND_ENV: "nccl"}


def rehearsal_of(path: str):
    data = read_yaml(REPO / path)
    return load_config(job_module(path).Config, path, rehearsal_overrides(data, nested_configs(data)))


# ---------------------------------------------------------------------------------------------------------------
# A Serve app name already taken


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rehearsal_whose_serve_app_a_live_driver_holds_stops_before_any_work(ray_local, tmp_path):
    import ray

    from core.config import ConfigError
    from jobs.serve_grm import app_owner, check_app_free, claim_app, release_app

    held = "grm-policy-grpo-held"  # serve.app_name (policy_grpo_demo's grm.overrides) + the run id
    owner = claim_app(held)
    released = False
    try:
        address = ray.get_runtime_context().gcs_address
        done = subprocess.run(
            [sys.executable, "-m", "jobs.cli", "rehearse", "configs/policy_grpo_demo.yaml", f"ray.address={address}",
             "run.id=held", f"run.root={tmp_path}"],
            cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        out = done.stdout + done.stderr
        assert done.returncode == 2, out[-3000:]
        assert (f"run.id: the Serve app '{held}' of this run id is held by a running job (Ray job "
                f"{ray.get_runtime_context().get_job_id()})") in out, out[-3000:]
        # before any work: no run directory, no judge deployed, no training; the holder's app is still its own
        assert not list(tmp_path.iterdir())
        assert "quorum rehearse: configs/policy_grpo_demo.yaml exit 2" in out and "running at" not in out
        assert ray.get(owner.job_id.remote()) == ray.get_runtime_context().get_job_id()
        # the control: the check the job made refuses while the driver holds the app, and passes once it lets go
        with pytest.raises(ConfigError, match="run.id: the Serve app 'grm-policy-grpo-held'"):
            check_app_free(held)
        release_app(owner)
        released = True
        deadline = time.monotonic() + 60
        while app_owner(held) is not None and time.monotonic() < deadline:  # ray.kill is asynchronous
            time.sleep(0.2)
        check_app_free(held)
    finally:
        if not released:
            release_app(owner)


# ---------------------------------------------------------------------------------------------------------------
# A collective on a CPU tensor under the cluster's NCCL group


def test_the_rehearsal_marks_every_gpu_trainer_with_its_production_backend():
    for path, section in (("configs/policy_grpo_cluster.yaml", "grpo"), ("configs/judge_grpo_cluster.yaml", "grpo")):
        trainer = getattr(rehearsal_of(path), section)
        assert not trainer.use_gpu and trainer.env_vars[REHEARSAL_BACKEND_ENV] == "nccl", path
    craft = rehearsal_of("configs/craft_selftrain_cluster.yaml")
    assert craft.rounds.trainer.env_vars[REHEARSAL_BACKEND_ENV] == craft.sft.trainer.env_vars[REHEARSAL_BACKEND_ENV]
    # a CPU trainer (the demo's) keeps gloo on the cluster too: nothing to check, nothing set
    demo = load_config(job_module("configs/policy_grpo_demo.yaml").Config, "configs/policy_grpo_demo.yaml",
                       rehearsal_overrides(read_yaml(REPO / "configs/policy_grpo_demo.yaml")))
    assert REHEARSAL_BACKEND_ENV not in demo.grpo.env_vars


@pytest.fixture
def one_rank(tmp_path, monkeypatch):
    """A one-rank gloo world; torch.distributed's collectives as they were after the test (the guard replaces them)."""
    for namespace in (dist, dist.distributed_c10d):
        for name in GUARDED:
            if hasattr(namespace, name):
                monkeypatch.setattr(namespace, name, getattr(namespace, name))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_outside_a_rehearsal_nothing_is_installed(one_rank):
    before = {name: getattr(dist, name) for name in GUARDED if hasattr(dist, name)}
    assert guard_for_rehearsal({}) is False
    assert guard_for_rehearsal({REHEARSAL_BACKEND_ENV: "gloo"}) is False  # gloo serves the CPU on the cluster too
    assert {name: getattr(dist, name) for name in before} == before
    with pytest.raises(RuntimeError, match=r"QUORUM_REHEARSAL_BACKEND='nccI': expected one of"):
        guard_for_rehearsal({REHEARSAL_BACKEND_ENV: "nccI"})


def test_the_guard_refuses_quorum_s_direct_cpu_collectives_and_passes_the_rest(one_rank):
    tensor = torch.ones(2)
    # control: unguarded, gloo runs the direct call the cluster's NCCL would refuse
    dist.all_reduce(tensor)
    assert guard_for_rehearsal(NCCL) is True
    with pytest.raises(RuntimeError) as caught:
        dist.all_reduce(tensor)  # quorum's code (this file), not through train.collectives
    message = str(caught.value)
    assert "torch.distributed.all_reduce on a cpu tensor" in message and "without train.collectives" in message
    assert "tests/test_rehearsal_defects.py:" in message and "this group is nccl, which serves only ['cuda']" in message
    with pytest.raises(RuntimeError, match=r"torch\.distributed\.broadcast on a cpu tensor"):
        dist.distributed_c10d.broadcast(tensor, src=0)
    with pytest.raises(RuntimeError, match=r"torch\.distributed\.all_gather on a cpu tensor"):
        dist.all_gather([torch.zeros(2)], tensor)
    # passed: train.collectives (its device rule), torch's own object collectives, a library's call, no tensor
    assert collectives.all_reduce_values([1.0, 2.0]) == [1.0, 2.0]
    assert collectives.all_reduce_(torch.ones(1)).tolist() == [1.0]
    assert collectives.any_rank(True) and collectives.gather_objects({"r": 0}) == [{"r": 0}]
    got = [None]
    dist.all_gather_object(got, "x")
    assert got == ["x"]
    # a library's own dist.all_reduce (torch.distributed.nn's autograd all-reduce: its frame is torch's file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the module for _functional_collectives
        from torch.distributed.nn import functional as dist_nn
        assert dist_nn.all_reduce(tensor.clone()).tolist() == [1.0, 1.0]
    dist.barrier()


def test_a_direct_call_through_deepspeed_s_comm_layer_is_refused_too(one_rank, monkeypatch):
    """DeepSpeed's comm layer only passes a call on: quorum's code calling it directly is the caller."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.comm as ds_comm
    from deepspeed.comm import comm as ds_state

    from train.engine import skip_cpu_shm_allreduce

    monkeypatch.setattr(ds_state, "cdb", None)  # DeepSpeed's backend over this test's group, gone after it
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    skip_cpu_shm_allreduce()
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the group, as a training worker's build_engine does
    ds_comm.all_reduce(torch.ones(1))  # control: unguarded, it runs
    assert guard_for_rehearsal(NCCL)
    with pytest.raises(RuntimeError, match=r"torch\.distributed\.all_reduce on a cpu tensor, called by "
                                           r"tests/test_rehearsal_defects\.py:\d+ \(test_a_direct_call_through"):
        ds_comm.all_reduce(torch.ones(1))


def small_grpo(tiny_model_dir: str, env_vars: dict):
    """The smallest GRPO run of the judge reward (no service): 2 workers, ZeRO-3 as the cluster configs, 1 step."""
    from train.config import GRPOConfig
    from train.config_sections import DeepSpeedSection

    return GRPOConfig(model=tiny_model_dir, num_workers=2, group_size=2, prompts_per_step=2, micro_batch_size=2,
                      max_steps=1, max_prompt_length=48, max_completion_length=4, checkpoint_every=1,
                      system_instruction="Judge.", deepspeed=DeepSpeedSection(zero_stage=3), env_vars=env_vars)


ROWS = [{"id": f"r{i}", "prompt_messages": [{"role": "user", "content": f"Compare answers {i} and {i + 1}."}],
         "gold_a": 4, "gold_b": 2} for i in range(2)]


def marks() -> dict:
    """What the rehearsal of a cluster config sets in its GPU trainer's env_vars."""
    return dict(rehearsal_of("configs/judge_grpo_cluster.yaml").grpo.env_vars)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_direct_cpu_collective_in_the_loop_stops_the_rehearsal_s_training_naming_it(ray_local, tiny_model_dir,
                                                                                      tmp_path):
    from train.grpo.trainer import run_grpo

    seeded = {**marks(), "PYTHONPATH": str(PLUGIN)}
    with pytest.raises(Exception) as caught:
        run_grpo(small_grpo(tiny_model_dir, seeded), ROWS, {"kind": "judge", "config": {}},
                 run_dir=str(tmp_path / "run"))
    message = str(caught.value)
    assert "torch.distributed.all_reduce on a cpu tensor, called by " \
           "tests/plugins/cpu_collective/sitecustomize.py:" in message and "(seeded_any_worker)" in message, message
    assert "this group is nccl, which serves only ['cuda']" in message


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_seeded_defect_the_same_run_passes_the_guard(ray_local, tiny_model_dir, tmp_path):
    """The control: the rehearsal's mark alone, DeepSpeed's ZeRO-3 gathers and reductions on CPU included."""
    from train.grpo.trainer import run_grpo

    cfg = small_grpo(tiny_model_dir, marks())
    result = run_grpo(cfg, ROWS, {"kind": "judge", "config": {}}, run_dir=str(tmp_path / "run"))
    assert result.metrics["step"] == 1 and result.adapter_dir
    assert dataclasses.asdict(cfg)["env_vars"] == NCCL
