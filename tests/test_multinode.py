"""A quorum job on a local autoscaling multi-node cluster (cluster.yaml's node types on Ray's fake provider).

The jury_eval job's judge pool asks for `pool.resources: {gpu_slot: 1}`; only a gpu_worker node advertises
`gpu_slot` (standing in for cluster.yaml's GPUs), and the cluster starts with the head alone, so the autoscaler must
launch a gpu_worker for the jury stage. Mid-stage (some judgments done, not all) the test SIGKILLs that node's raylet:
Ray marks the node dead, Ray Data restarts the actor (max_restarts=-1) and retries its in-flight batch, and the
autoscaler replaces the unhealthy node. The stage must complete with every pair judged exactly once and the job's
outputs equal to a one-node run's (the session's `ray_local`, same config without the resource); then the idle
gpu_worker is removed. Then Ray Train placement on the same cluster: judge_sft's one training worker asks for
`train.resources_per_worker: {gpu_slot: 1}`, the autoscaler launches a gpu_worker for its placement group, the worker
trains there (the run's recorded `worker_nodes` and Ray's actor table; the Train controller stays on the head) and
the idle node is removed. Each job runs as `python -m jobs.cli run ... ray.address=...`, its own driver process: this
process keeps its own `ray.init` (the session's `ray_local`) untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from jobs.cli import main as cli_main
from tests.fake_cluster import FakeCluster, mirrored_node_types

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PAIRS = 8
# Waits that turn a hang into a failure, not speed checks, so sized for the slowest 2-core CPU the suite runs on
# with room to spare: on a Xeon without bf16 (float32 engine and training, issue 43) the judge_sft driver took over
# the 150 s it was once given. The test's own pytest timeout (900 s) still bounds the whole.
NODE_WAIT_S = 180  # a gpu_worker launched or replaced
# a first judgment in after the node is up (the judge actor's start-up and model load on the new node): a fresh-clone
# CI run saw none within 180 s
FIRST_JUDGMENT_WAIT_S = 420
DRIVER_WAIT_S = 480  # a job's driver process to exit once its node is up
# what a judgment's content is (not when or where it ran): compared with the one-node run
JUDGMENT = ["id", "model", "judge", "completion", "score", "parse_error", "prompt_tokens", "completion_tokens"]


def job_config(tmp_path: Path, model_dir: str, shared_data: Path) -> Path:
    judge = {"name": "judge", "engine": {"kind": "hf", "model": model_dir, "num_threads": 1, "max_batch_size": 2},
             "sampling": {"temperature": 0.0, "max_tokens": 8}, "max_parse_retries": 0, "constrained": False,
             # batches of one row: a stage of 8 batches, so there is a "mid-stage" to kill the node in
             # the whole CPU of its gpu_worker, so Ray Data's light tasks stay on the head
             "pool": {"concurrency": 1, "num_cpus": 1, "batch_size": 1, "resources": {"gpu_slot": 1}}}
    config = {
        "job": "jury_eval", "wandb": {"enabled": False},  # W&B start-up is seconds per run; not what is tested
        "synth": {"enabled": False}, "asset": {"enabled": False},
        "simpeval": {"path": str(shared_data / "simpeval" / "simpeval_2022.csv"), "limit": PAIRS},
        "jury": {"judges": [judge]},
        "report": {"metrics": ["fkgl", "compression_ratio"], "n_boot": 20},
    }
    path = tmp_path / "multinode.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def cluster(tmp_path):
    # cluster.yaml's worker types (node CPUs scaled down to 1; a gpu_worker's GPUs become gpu_slot); a head with
    # one CPU for Ray Data's light tasks (cluster.yaml's has none: they would all wait for a cpu_worker)
    types = mirrored_node_types(cpus=1)
    # one cpu_worker at most (cluster.yaml: 4): Ray Data's light tasks may ask for one beyond the head's CPU, and
    # every extra raylet costs this 2-core machine
    types["cpu_worker"]["max_workers"] = 1
    fake = FakeCluster(types, head_cpus=1, idle_timeout_minutes=0.05)  # 3 s idle, then the node goes
    try:
        fake.start()
        yield fake
    finally:
        fake.keep_logs(tmp_path / "cluster-logs")  # pytest keeps tmp_path of its last runs: read a failure there
        fake.stop()


def node_processes(cluster: FakeCluster, node: dict, missing_ok: bool = False) -> list[psutil.Process]:
    """A worker node's processes: its raylet (under the cluster's temp dir, listening on the node's manager port)
    and everything under it (its workers, the judge actor among them, and its agents). By port, not by `gpu_slot`
    in the command line: on a loaded machine the autoscaler may have launched a second gpu_worker by now."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not (cmd and cmd[0].endswith("/raylet") and any(cluster.temp_dir in a for a in cmd)):
            continue
        try:
            if any(c.laddr.port == node["manager_port"] and c.status == psutil.CONN_LISTEN
                   for c in proc.net_connections("tcp")):
                return [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    if missing_ok:  # one of several gpu_workers, retired as idle since it was listed
        return []
    raise AssertionError(f"no raylet listens on {node['manager_port']} (node {node['node_id']})")


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            continue


def cache_entries(root: Path) -> int:
    return len(list((root / "_cache" / "requests").glob("*/*.json")))


def train_job_args(root: Path, model_dir: str) -> list[str]:
    """judge_sft through its own trainer path (rows stage -> `train.preference.trainer.train_stage` -> Ray Train + DeepSpeed +
    LoRA): the tiny random model, one worker, one step on 2 MENLO pairs in both orders; the worker asks for
    `gpu_slot` beside its CPU, as a GPU job's would ask for a GPU."""
    return ["run", str(REPO / "configs" / "judge_sft_demo.yaml"), f"run.root={root}", "run.id=t",
            "wandb.enabled=false", "data.limit=2", "data.val_splits=[]", f"train.model={model_dir}",
            "train.num_workers=1", "train.micro_batch_size=2", "train.max_steps=1", "train.checkpoint_every=1",
            "train.resources_per_worker={gpu_slot: 1}"]


def start_driver(cluster: FakeCluster, args: list[str]) -> subprocess.Popen:
    """`quorum run ARGS ray.address=<head>`: the job's own driver process on the fake cluster."""
    env = dict(cluster.env, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "jobs.cli", *args, f"ray.address={cluster.gcs_address}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(driver: subprocess.Popen) -> None:
    """Kill a driver still running (a failed wait or assertion) and show its output."""
    if driver.poll() is None:
        driver.kill()
        print(f"driver output:\n{driver.communicate()[0][-5000:]}", file=sys.stderr)


def finish(cluster: FakeCluster, driver: subprocess.Popen, what: str) -> str:
    """The driver's output once it exits; past DRIVER_WAIT_S a failure showing its output, the nodes and what the
    autoscaler did meanwhile."""
    try:
        return driver.communicate(timeout=DRIVER_WAIT_S)[0]
    except subprocess.TimeoutExpired:
        driver.kill()
        out = driver.communicate()[0]
        raise AssertionError(f"{what}: the driver still ran after {DRIVER_WAIT_S} s; nodes (dead too): "
                             f"{cluster.nodes(dead_too=True)}\ndriver output:\n{out[-4000:]}\n"
                             f"autoscaler log:\n{cluster.monitor_log(8000)}") from None


def test_job_scales_up_survives_node_kill_and_scales_down(cluster, ray_local, tiny_model_dir, shared_data,
                                                          tmp_path):
    started = time.monotonic()
    cfg = job_config(tmp_path, tiny_model_dir, shared_data)
    root = tmp_path / "multi"
    (head,) = cluster.nodes()  # the head alone: nothing advertises gpu_slot yet
    assert head["head"]

    driver = start_driver(cluster, ["run", str(cfg), f"run.root={root}", "run.id=t"])
    try:
        # scale up: the judge pool's gpu_slot demand makes the autoscaler launch a gpu_worker
        cluster.wait_for(lambda: cluster.gpu_nodes(), "a gpu_worker node for the judge pool", NODE_WAIT_S)
        first = cluster.gpu_nodes()
        assert len(first) == 1 and first[0]["resources"]["gpu_slot"] == 4
        counts = {"start": 1, "scaled up": len(cluster.nodes())}
        phases = {"gpu_worker up": time.monotonic() - started}
        # mid-stage: as soon as a first judgment is in the request cache, freeze the node (SIGSTOP: nothing more
        # happens on it), check the stage is unfinished, then kill every process of it, as a crashed machine
        deadline = time.monotonic() + FIRST_JUDGMENT_WAIT_S
        while cache_entries(root) < 1 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # the gpu_worker nodes alive now: on a loaded machine the autoscaler can have launched a second one and
        # retired the first as idle before the judge actor started, so the actor's node is not always `first`
        victims = cluster.gpu_nodes()
        procs = [p for n in victims for p in node_processes(cluster, n, missing_ok=len(victims) > 1)]
        signal_all(procs, signal.SIGSTOP)
        done_before_kill = cache_entries(root)
        signal_all(procs, signal.SIGKILL)
        assert driver.poll() is None and 1 <= done_before_kill < PAIRS, \
            f"not mid-stage: {done_before_kill} of {PAIRS} judged when the node was killed"
        # the autoscaler replaces the dead node: a new gpu_worker for the restarted actor
        killed = {n["node_id"] for n in victims}
        cluster.wait_for(lambda: any(n["node_id"] not in killed for n in cluster.gpu_nodes())
                         or driver.poll() is not None, "a replacement gpu_worker", NODE_WAIT_S)
        counts["after the kill"] = len(cluster.nodes())
        phases["replaced"] = time.monotonic() - started
        out = finish(cluster, driver, "the jury_eval job")
    finally:
        stop(driver)
    assert driver.returncode == 0, out[-5000:]
    # scale down: after the job the gpu_worker idles past idle_timeout_minutes and the autoscaler removes it
    phases["job done"] = time.monotonic() - started
    down_after = cluster.wait_for(lambda: not cluster.gpu_nodes(), "idle gpu_worker removed", 60)
    # and any cpu_worker Ray Data's light tasks asked for: the head alone again
    cluster.wait_for(lambda: len(cluster.nodes()) == 1, "idle workers removed", 60)
    counts["end"] = 1
    phases["head alone"] = time.monotonic() - started

    # Ray Train placement: judge_sft's training worker asks for gpu_slot, which no node has now, so its worker
    # group's placement group makes the autoscaler launch a gpu_worker again. Started now, it mostly waits for that
    # node while this process checks the jury run and makes its one-node reference run (2 cores: the overlap is
    # what keeps the training run from adding its whole time to the test's).
    jury_gpu_nodes = {n["node_id"] for n in cluster.nodes(dead_too=True) if n["resources"].get("gpu_slot")}
    train_root = tmp_path / "train"
    trainer = start_driver(cluster, train_job_args(train_root, tiny_model_dir))
    try:
        run = root / "jury_eval" / "t"
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["stages"]["jury"]["status"] == "complete"
        judged = pd.read_parquet(run / "jury")
        pairs = pd.read_parquet(run / "pairs")
        # every pair judged exactly once: no row lost to the dead node, none duplicated by the retried batch
        assert len(judged) == len(pairs) == PAIRS
        # a pair is (source id, simplifying system): SimpEval rates several systems' outputs of one source
        judged_keys = list(zip(judged["id"], judged["model"]))
        assert sorted(judged_keys) == sorted(zip(pairs["id"], pairs["model"])) and len(set(judged_keys)) == PAIRS
        summary = manifest["stages"]["jury"]["summary"]
        assert summary["rows_out"] == PAIRS
        # the restart is counted (Ray's actor table: the judge actor came back on the new node)
        assert summary["actor_restarts"] >= 1, summary

        # the same job on one node (the session's local Ray, no custom resource): the same judgments and scores
        one = tmp_path / "one"
        assert cli_main(["run", str(cfg), f"run.root={one}", "run.id=t", "jury.judges.0.pool.resources={}"]) == 0
        ref = one / "jury_eval" / "t"
        phases["one-node run"] = time.monotonic() - started
        key = ["id", "model", "judge"]
        assert_frame_equal(judged[JUDGMENT].sort_values(key, ignore_index=True),
                           pd.read_parquet(ref / "jury")[JUDGMENT].sort_values(key, ignore_index=True))
        assert_frame_equal(pd.read_parquet(run / "scores").sort_values(["id", "model"], ignore_index=True),
                           pd.read_parquet(ref / "scores").sort_values(["id", "model"], ignore_index=True))
        out = finish(cluster, trainer, "the judge_sft job")
    finally:
        stop(trainer)
    assert trainer.returncode == 0, out[-5000:]
    phases["training done"] = time.monotonic() - started
    train = json.loads((train_root / "judge_sft" / "t" / "manifest.json").read_text())["stages"]["train"]
    assert train["status"] == "complete" and train["summary"]["steps"] == 1
    # where the worker ran, as the run records it: a gpu_worker the autoscaler launched for the training run
    # (not the head, not one of the jury's), its gpu_slot the worker's
    (worker,) = train["summary"]["worker_nodes"]
    launched = {n["node_id"]: n for n in cluster.nodes(dead_too=True)}[worker]
    assert not launched["head"] and launched["resources"]["gpu_slot"] == 4 and worker not in jury_gpu_nodes
    # and as Ray's actor table has it; the Train controller and its synchronization actor ask for no CPU and no
    # gpu_slot and stay on the driver's node, the head
    assert cluster.actor_nodes("RayTrainWorker") == [worker]
    assert cluster.actor_nodes("TrainController") == cluster.actor_nodes("SynchronizationActor") == [head["node_id"]]
    # scale down again: the idle training node goes, the head is alone
    train_down_after = cluster.wait_for(lambda: len(cluster.nodes()) == 1, "idle training gpu_worker removed", 60)
    phases["head alone again"] = time.monotonic() - started
    print(f"multinode: nodes {counts}; gpu_worker killed after {done_before_kill}/{PAIRS} judgments, replaced; "
          f"idle gpu_worker gone {down_after:.1f} s after the job; actor_restarts {summary['actor_restarts']}; "
          f"training worker on a new gpu_worker, gone {train_down_after:.1f} s after the training job; "
          f"at seconds {({k: round(v, 1) for k, v in phases.items()})}", file=sys.stderr)


def assert_frame_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_mirrored_node_types_follow_cluster_yaml():
    """The fake cluster's worker types are cluster.yaml's, with gpu_slot per GPU (hand-checked: 4 A10G per node)."""
    types = mirrored_node_types(cpus=1)
    assert set(types) == {"cpu_worker", "gpu_worker"}
    assert types["gpu_worker"]["resources"] == {"CPU": 1, "gpu_slot": 4}
    assert types["cpu_worker"]["resources"] == {"CPU": 1}
    assert (types["cpu_worker"]["max_workers"], types["gpu_worker"]["max_workers"]) == (4, 6)
    assert os.path.exists(REPO / "cluster.yaml")
