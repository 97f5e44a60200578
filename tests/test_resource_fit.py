"""The arithmetic of "can the cluster ever grant this stage's request?" (core.resource_fit), with hand-worked
numbers, and the bounded wait around it (actors.ray_capacity.ensure_fits) on a scripted cluster and clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from actors.ray_capacity import NodeRequest, ensure_all_fit, ensure_fits
from core.config import ConfigError, load_config
from core.resource_fit import OK, REFUSE, WAIT, Ask, Capacity, NodeType, units_on, verdict, verdict_all

WORKERS = ("train.trainer.num_workers", "train.trainer.cpus_per_worker")


def test_units_per_node_take_the_scarcest_resource():
    # 8 CPU / 2 = 4, 2 GPU / 1 = 2: two workers of {2 CPU, 1 GPU}
    assert units_on({"CPU": 8, "GPU": 2}, {"CPU": 2, "GPU": 1}) == 2
    # 3 × 0.1 CPU in 0.3 CPU: floating point must not lose one
    assert units_on({"CPU": 0.3}, {"CPU": 0.1}) == 3
    assert units_on({"CPU": 4}, {"CPU": 1, "gpu_slot": 1}) == 0


def test_the_issue_case_two_cpu_head_with_a_quarter_cpu_entrypoint():
    """2 CPU, 0.25 held by the entrypoint: 2 × 1 CPU needs 2 > 1.75; 1 × 1 CPU fits; 7 × 0.25 = 1.75 fits exactly."""
    cap = Capacity(nodes=({"CPU": 2.0},), held={"CPU": 0.25})
    refused = verdict(Ask("training", "workers", 2, {"CPU": 1.0}, WORKERS), cap)
    assert refused.kind == REFUSE
    assert refused.message == (
        "training: 2 workers × 1 CPU = 2 CPU, but the cluster has 2 CPU in all, 0.25 of them held by this job's "
        "driver (the entrypoint's reservation): 1.75 CPU for the stage, and no autoscaler to add nodes. Change "
        "train.trainer.num_workers or train.trainer.cpus_per_worker, or give the cluster more")
    assert verdict(Ask("training", "workers", 1, {"CPU": 1.0}), cap).kind == OK
    assert verdict(Ask("pool", "actors", 7, {"CPU": 0.25}), cap).kind == OK
    assert verdict(Ask("pool", "actors", 8, {"CPU": 0.25}), cap).kind == REFUSE


def test_units_must_sit_whole_on_one_node():
    """Two 1.5-CPU nodes: 3 CPU in all, yet three 1-CPU actors do not fit (one per node) nor one 2-CPU worker."""
    cap = Capacity(nodes=({"CPU": 1.5}, {"CPU": 1.5}))
    assert verdict(Ask("generate", "actors", 2, {"CPU": 1.5}), cap).kind == OK
    # 3 × 1 CPU = 3 CPU = the total, but each node holds only one 1-CPU actor: 2 in all
    packed = verdict(Ask("generate", "actors", 3, {"CPU": 1.0}, ("pool.concurrency",)), cap)
    assert packed.kind == REFUSE
    assert "must sit whole on one node and the nodes ({1.5 CPU}, {1.5 CPU}) hold only 2" in packed.message
    whole = verdict(Ask("training", "workers", 1, {"CPU": 2.0}), cap)
    assert whole.kind == REFUSE and "no node can hold one of them" in whole.message


def test_gpu_and_custom_resources_count_like_cpus():
    cap = Capacity(nodes=({"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 4}))
    # 8 workers × {4 CPU, 1 GPU}: 32 CPU, 8 GPU = exactly the two nodes (4 workers each)
    assert verdict(Ask("training", "workers", 8, {"CPU": 4, "GPU": 1}), cap).kind == OK
    # 9 of them: 9 GPU > 8
    message = verdict(Ask("training", "workers", 9, {"CPU": 1, "GPU": 1}), cap).message
    assert "9 workers × {1 CPU, 1 GPU} = 9 CPU, 9 GPU, but the cluster has 8 GPU in all" in message


def test_autoscaler_node_types_turn_a_refusal_into_a_wait_up_to_their_limit():
    """Head of 2 CPU (no GPU); a gpu type of {8 CPU, 1 GPU} up to 2 nodes: 2 GPU workers wait, 3 never fit."""
    cap = Capacity(nodes=({"CPU": 2.0},), node_types=(NodeType("gpu_worker", {"CPU": 8, "GPU": 1}, 2),))
    assert verdict(Ask("training", "workers", 2, {"CPU": 1, "GPU": 1}), cap).kind == WAIT
    never = verdict(Ask("training", "workers", 3, {"CPU": 1, "GPU": 1}, WORKERS), cap)
    assert never.kind == REFUSE
    assert "even grown to its autoscaler's limits (gpu_worker: up to 2 × {8 CPU, 1 GPU})" in never.message
    unlimited = Capacity(nodes=({"CPU": 2.0},), node_types=(NodeType("cpu", {"CPU": 4}, -1),))
    assert verdict(Ask("generate", "actors", 100, {"CPU": 4}), unlimited).kind == WAIT
    assert verdict(Ask("generate", "actors", 1, {"CPU": 5}), unlimited).kind == REFUSE  # no node type that big


def test_an_autoscaler_without_node_types_means_wait():
    cap = Capacity(nodes=({"CPU": 1.0},), autoscaler_unknown=True)
    assert verdict(Ask("training", "workers", 2, {"CPU": 1.0}), cap).kind == WAIT


class Script:
    """A cluster read and a clock for ensure_fits: each read returns the next capacity; sleeping advances time."""

    def __init__(self, *caps: Capacity):
        self.caps, self.now, self.reads, self.demands = list(caps), 0.0, 0, []

    def read(self) -> Capacity:
        self.reads += 1
        return self.caps[min(self.reads, len(self.caps)) - 1]

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def demand(self, bundles: list) -> None:
        self.demands.append(bundles)


def test_ensure_fits_waits_for_the_autoscaler_then_goes_on():
    small = Capacity(nodes=({"CPU": 1.0},), node_types=(NodeType("cpu", {"CPU": 1}, 3),))
    grown = Capacity(nodes=({"CPU": 1.0}, {"CPU": 1.0}), node_types=small.node_types)
    script = Script(small, small, small, grown)
    result = ensure_fits(Ask("training", "workers", 2, {"CPU": 1.0, "GPU": 0.0}), read=script.read, limit_s=60,
                         clock=lambda: script.now, sleep=script.sleep, demand=script.demand)
    assert result.kind == OK and script.reads == 4 and script.now == 6.0  # three 2 s polls
    # the autoscaler was asked for the room while waiting (renewed at each poll that found none), and the request
    # withdrawn once there
    assert script.demands == [[{"CPU": 1.0}, {"CPU": 1.0}]] * 3 + [[]]


def test_ensure_fits_gives_up_after_the_limit_naming_the_keys():
    small = Capacity(nodes=({"CPU": 1.0},), autoscaler_unknown=True)
    script = Script(small)
    with pytest.raises(ConfigError, match=r"training: 2 workers × 1 CPU = 2 CPU: .*after 10 s the cluster still has "
                                          r"no room \(QUORUM_AUTOSCALE_WAIT_S sets the wait\)\. Change "
                                          r"train\.trainer\.num_workers"):
        ensure_fits(Ask("training", "workers", 2, {"CPU": 1.0}, WORKERS), read=script.read, limit_s=10,
                    clock=lambda: script.now, sleep=script.sleep, demand=script.demand)
    assert script.now == 10.0 and script.demands[-1] == []


def test_ensure_fits_refuses_at_once_without_waiting():
    script = Script(Capacity(nodes=({"CPU": 2.0},)))
    with pytest.raises(ConfigError, match="no autoscaler"):
        ensure_fits(Ask("training", "workers", 3, {"CPU": 1.0}), read=script.read, limit_s=600,
                    clock=lambda: script.now, sleep=script.sleep, demand=script.demand)
    assert script.now == 0.0 and script.demands == []


# --- everything a job must hold at once (issue 39, item 8) --------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def cluster_yaml_types(**max_workers: int) -> tuple[NodeType, ...]:
    """cluster.yaml's worker node types as the autoscaler reports them (resources, max_workers), with overrides."""
    types = yaml.safe_load((REPO / "cluster.yaml").read_text())["available_node_types"]
    return tuple(NodeType(name, {k: float(v) for k, v in t["resources"].items()}, max_workers.get(name, t["max_workers"]))
                 for name, t in types.items() if name != "head")


def test_policy_grpo_s_training_and_reward_service_are_summed_not_checked_one_by_one():
    """configs/policy_grpo_cluster.yaml needs 8 training GPUs and >= 1 reward-service GPU at once. On a cluster of
    two 4-GPU nodes each fits alone (what 1761e29 checked: the replicas when the app deployed, the workers when
    training started, each against the whole cluster), so the job deployed its judge and then waited for ever for
    the workers. Their sum is refused with the numbers."""
    import jobs.policy.grpo as job

    cfg = load_config(job.Config, REPO / "configs" / "policy_grpo_cluster.yaml")
    training, serve = job.placement(cfg)
    two_by_four = Capacity(nodes=({"CPU": 0.0},), node_types=cluster_yaml_types(gpu_worker=2, cpu_worker=0))
    assert verdict(training, two_by_four).kind == WAIT and verdict(serve, two_by_four).kind == WAIT  # one by one
    refused = verdict_all([training, serve], two_by_four)
    assert refused.kind == REFUSE
    assert refused.message.startswith(
        "training: 8 workers × {4 CPU, 1 GPU} = 32 CPU, 8 GPU + serve: 1 replica × {4 CPU, 1 GPU} = 4 CPU, 1 GPU: "
        "36 CPU, 9 GPU at once, but the cluster holds at most 8 GPU (the 1 nodes there are and its autoscaler's "
        "limits: ")
    assert "gpu_worker: up to 2 × {48 CPU, 4 GPU}" in refused.message
    assert refused.message.endswith(
        "Change grpo.num_workers or grpo.cpus_per_worker or grpo.use_gpu or grm.overrides: autoscaling.min_replicas "
        "or grm.overrides: resources.num_cpus or grm.overrides: resources.num_gpus, or give the cluster more")
    # cluster.yaml as shipped (up to 6 gpu_worker nodes): the autoscaler can make room, so the job waits for it
    shipped = Capacity(nodes=({"CPU": 0.0},), node_types=cluster_yaml_types())
    assert verdict_all([training, serve], shipped).kind == WAIT
    # and on nodes that are there: the 9th GPU must be on a third node
    three = Capacity(nodes=({"CPU": 48, "GPU": 4},) * 3)
    assert verdict_all([training, serve], three).kind == OK
    assert verdict_all([training, serve], Capacity(nodes=({"CPU": 48, "GPU": 4},) * 2)).kind == REFUSE


def test_the_sum_is_refused_only_when_certain():
    """Units sit whole on one node: totals that fit while no placement is found are not refused (the check refuses
    only what cannot fit even on the cluster grown to its autoscaler's limits); with an autoscaler they wait."""
    asks = [Ask("a", "workers", 2, {"CPU": 2}), Ask("b", "replicas", 1, {"CPU": 2})]
    assert verdict_all(asks, Capacity(nodes=({"CPU": 4}, {"CPU": 2}))).kind == OK  # {a, a} + {b}
    assert verdict_all(asks, Capacity(nodes=({"CPU": 3}, {"CPU": 3}))).kind == OK  # 6 CPU: not ruled out
    assert verdict_all(asks, Capacity(nodes=({"CPU": 3}, {"CPU": 3}), node_types=(
        NodeType("cpu", {"CPU": 4}, 1),))).kind == WAIT
    assert verdict_all(asks, Capacity(nodes=({"CPU": 2},), node_types=(NodeType("cpu", {"CPU": 2}, 2),))).kind == WAIT
    refused = verdict_all(asks, Capacity(nodes=({"CPU": 2},), node_types=(NodeType("cpu", {"CPU": 2}, 1),)))
    assert refused.kind == REFUSE and "6 CPU at once, but the cluster holds at most 4 CPU" in refused.message
    # a single ask is verdict's own answer
    assert verdict_all(asks[:1], Capacity(nodes=({"CPU": 1},))) == verdict(asks[0], Capacity(nodes=({"CPU": 1},)))


def test_ensure_all_fit_refuses_the_sum_and_waits_for_the_autoscaler():
    asks = [Ask("training", "workers", 2, {"CPU": 1}, ("grpo.num_workers",)),
            Ask("serve", "replicas", 1, {"CPU": 1}, ("grm.overrides: autoscaling.min_replicas",))]
    with pytest.raises(ConfigError, match=r"3 CPU at once, but the cluster holds at most 2 CPU .*Change "
                                          r"grpo\.num_workers or grm\.overrides: autoscaling\.min_replicas"):
        ensure_all_fit(asks, read=lambda: Capacity(nodes=({"CPU": 2.0},)), demand=lambda bundles: None)
    # an autoscaler that can add a node: the whole demand is asked for at once, then the job goes on
    reads = iter([Capacity(nodes=({"CPU": 2.0},), node_types=(NodeType("cpu", {"CPU": 2}, 1),)),
                  Capacity(nodes=({"CPU": 2.0}, {"CPU": 2.0}))])
    demanded = []
    ticks = iter(range(100))
    assert ensure_all_fit(asks, read=lambda: next(reads), limit_s=60, clock=lambda: next(ticks),
                          sleep=lambda s: None, demand=demanded.append).kind == OK
    assert demanded == [[{"CPU": 1}, {"CPU": 1}, {"CPU": 1}], []]


def test_the_cluster_guide_s_table_is_what_the_check_computes(monkeypatch):
    """docs/cluster.md's "GPUs each shipped cluster config needs at once" is jobs.placement's output for every
    configs/*_cluster.yaml, and every shipped config fits cluster.yaml grown to its limits."""
    from jobs.placement import groups
    from jobs.plan import load_unchecked, markdown_table

    monkeypatch.chdir(REPO)  # the configs name their files relative to the repository
    paths = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*_cluster.yaml"))
    doc = (REPO / "docs" / "cluster.md").read_text()
    assert markdown_table(paths) in doc
    shipped = Capacity(nodes=({"CPU": 0.0},), node_types=cluster_yaml_types())
    for path in paths:
        for group in groups(load_unchecked(str(REPO / path))):
            assert verdict_all(group, shipped).kind != REFUSE, (path, group)


def test_the_policy_job_refuses_before_any_work_what_it_cannot_hold_at_once(ray_local, tmp_path, capsys):
    """A local 2-CPU Ray: the demo's 2 training workers (1 CPU each) fit, a GRM replica of 1 CPU fits, both at once
    do not. 1761e29 deployed the judge and then waited for ever for the workers; now: exit 2, no run directory."""
    from jobs.cli import main as cli_main

    root = tmp_path / "runs"
    code = cli_main(["run", str(REPO / "configs" / "policy_grpo_demo.yaml"), f"run.root={root}",
                     "grm.overrides=[serve.app_name=grm-fit-test, serve.route_prefix=/grm, resources.num_cpus=1]"])
    assert code == 2 and not root.exists()
    assert ("training: 2 workers × 1 CPU = 2 CPU + serve: 1 replica × 1 CPU = 1 CPU: 3 CPU at once, but the cluster "
            "holds at most 2 CPU") in capsys.readouterr().err


def test_the_request_for_nodes_survives_ray_data_s_coordinator(ray_local):
    """The autoscaler reads one request slot (v1: a GCS KV key; last writer wins), and Ray Data's
    AutoscalingCoordinator rewrites it with its requesters' merged requests whenever one starts or ends (a
    dataset's execution) and every 20 s. Control: a bare `request_resources` beside it is erased by a dataset
    ending, as in a fake-cluster run where a job waited 8 minutes for a node the autoscaler never saw asked for.
    quorum's `NodeRequest` is one of the coordinator's requesters: in every write until withdrawn."""
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.autoscaler.sdk import request_resources
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        DefaultAutoscalingCoordinator,
    )
    from ray.experimental.internal_kv import _internal_kv_get


    data = DefaultAutoscalingCoordinator("data-test-execution")  # what a Ray Data execution registers as

    def slot_after_a_dataset() -> list:
        """A dataset starts and ends (the coordinator writes the slot twice), then the slot as the autoscaler reads
        it; the coordinator handles calls in order, so a reply to a later one means both writes are done."""
        data.request_resources([{"CPU": 1}], expire_after_s=60)
        data.cancel_request()
        ray_local.get(data._autoscaling_coordinator.get_reserved_resources.remote("data-test-execution"))
        return json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL) or b"[]")

    bundles = [{"CPU": 1.0, "gpu_slot": 1.0}, {"CPU": 1.0, "gpu_slot": 1.0}]
    request_resources(bundles=bundles)
    assert json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == bundles
    assert slot_after_a_dataset() == []  # the control: erased

    request = NodeRequest()
    try:
        request(bundles)
        assert slot_after_a_dataset() == bundles
        request(bundles)  # a renewal (each poll of ensure_all_fit): still there, once
        assert slot_after_a_dataset() == bundles
    finally:
        request([])
    assert slot_after_a_dataset() == []  # withdrawn
