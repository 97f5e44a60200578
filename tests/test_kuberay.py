"""k8s/raycluster.yaml and k8s/rayjob.yaml are cluster.yaml on KubeRay: the same node types, Ray resources,
autoscaling bounds, and the Ray version pinned in pyproject.toml.

No maintained PyPI package ships KubeRay's CRDs (their openAPIV3Schema lives in the Go operator's repository), so
the manifests are parsed and checked field by field against cluster.yaml, with the shapes the CRD requires for the
fields quorum uses (rayStartParams values are strings; a worker group has a DNS-label name and
0 <= minReplicas <= replicas <= maxReplicas). `test_checks_are_not_vacuous` breaks a copy one field at a time.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# cluster.yaml's node type -> KubeRay group name (a group name is part of pod names: DNS labels have no "_")
GROUPS = {"cpu_worker": "cpu-worker", "gpu_worker": "gpu-worker"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def pinned_ray() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.match(r"^ray\[[^\]]*\]==([^;\s]+)", d).group(1) for d in deps if d.startswith("ray["))


def quantity(value: str | float) -> float:
    """A Kubernetes CPU quantity ("16", "500m", 4) as a number of CPUs."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_cluster_spec(spec: dict, cluster: dict, ray_version: str) -> None:
    """Raise AssertionError where the RayCluster spec departs from cluster.yaml or from the CRD's shapes."""
    types = cluster["available_node_types"]
    assert spec["rayVersion"] == ray_version, spec["rayVersion"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 60 * cluster["idle_timeout_minutes"]
    assert spec["autoscalerOptions"]["upscalingMode"] in ("Default", "Aggressive", "Conservative")

    groups = {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}
    assert set(groups) == {"head", *GROUPS.values()}, sorted(groups)
    for node_type, group_name in {"head": "head", **GROUPS}.items():
        group, node = groups[group_name], types[node_type]
        assert DNS_LABEL.match(group_name), group_name
        params = group["rayStartParams"]
        # the CRD's rayStartParams is map[string]string: a bare number is refused by the API server
        assert all(isinstance(v, str) for v in params.values()), (group_name, params)
        resources = node["resources"]
        assert float(params["num-cpus"]) == resources["CPU"], group_name
        assert float(params.get("num-gpus", 0)) == resources.get("GPU", 0), group_name
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        assert yaml.safe_load(params.get("resources", "{}")) == custom, group_name
        (container,) = [c for c in group["template"]["spec"]["containers"] if c["name"].startswith("ray-")]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        # the container may use what Ray advertises (the head's Ray CPUs are 0 on purpose: its processes still run)
        assert quantity(limits["cpu"]) >= resources["CPU"] and quantity(requests["cpu"]) <= quantity(limits["cpu"])
        assert int(limits.get("nvidia.com/gpu", 0)) == resources.get("GPU", 0), group_name
        assert limits.get("nvidia.com/gpu") == requests.get("nvidia.com/gpu"), group_name  # k8s: GPUs not overcommitted
        flavor = "gpu" if resources.get("GPU") else "cpu"
        assert container["image"].endswith(f":{ray_version}-py311-{flavor}"), container["image"]
        if node_type != "head":
            assert group["minReplicas"] == node["min_workers"] and group["maxReplicas"] == node["max_workers"]
            assert 0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], group_name
    assert sum(g["maxReplicas"] for g in spec["workerGroupSpecs"]) <= cluster["max_workers"]


@pytest.fixture(scope="module")
def cluster() -> dict:
    return load("cluster.yaml")


def test_raycluster_mirrors_cluster_yaml(cluster):
    manifest = load("k8s/raycluster.yaml")
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCluster")
    assert DNS_LABEL.match(manifest["metadata"]["name"])
    check_cluster_spec(manifest["spec"], cluster, pinned_ray())


def test_rayjob_runs_quorum_on_the_same_cluster(cluster):
    job = load("k8s/rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    # the RayJob's cluster is the RayCluster's spec, verbatim: one place to change node types
    assert job["spec"]["rayClusterSpec"] == load("k8s/raycluster.yaml")["spec"]
    entry = job["spec"]["entrypoint"]
    config = re.search(r"quorum run (configs/\S+\.yaml)", entry).group(1)
    assert (REPO / config).is_file(), config
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["QUORUM_HOME"].startswith("/mnt/shared")
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_dockerfile_builds_on_the_pinned_ray_and_installs_like_cluster_yaml(cluster):
    text = (REPO / "k8s" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{pinned_ray()}-py311-${{FLAVOR}}" in text
    # the same install commands, in the same order, as cluster.yaml's setup_commands
    steps = ["pip install torch==", "pip install --no-build-isolation deepspeed==", "pip install -e '.[gpu]'"]
    setup = "\n".join(cluster["setup_commands"])
    for step in steps:
        pinned = re.search(re.escape(step) + r"\S*", setup).group(0)
        assert pinned in text, pinned
    assert [text.index(s) for s in steps] == sorted(text.index(s) for s in steps)


def break_field(spec: dict, how: str) -> dict:
    spec = copy.deepcopy(spec)
    gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-worker")
    if how == "gpus":
        gpu["rayStartParams"]["num-gpus"] = "2"
    elif how == "int-param":
        gpu["rayStartParams"]["num-cpus"] = 48
    elif how == "max-replicas":
        gpu["maxReplicas"] = 7
    elif how == "group-name":
        gpu["groupName"] = "gpu_worker"
    elif how == "image":
        gpu["template"]["spec"]["containers"][0]["image"] = "quorum:2.59.0-py311-gpu"
    elif how == "gpu-limit":
        gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    elif how == "idle":
        spec["autoscalerOptions"]["idleTimeoutSeconds"] = 60
    elif how == "autoscaling":
        spec["enableInTreeAutoscaling"] = False
    return spec


@pytest.mark.parametrize("how", ["gpus", "int-param", "max-replicas", "group-name", "image", "gpu-limit", "idle",
                                 "autoscaling"])
def test_checks_are_not_vacuous(cluster, how):
    spec = load("k8s/raycluster.yaml")["spec"]
    check_cluster_spec(spec, cluster, pinned_ray())  # the intact copy passes...
    with pytest.raises(AssertionError):               # ...and each broken one fails
        check_cluster_spec(break_field(spec, how), cluster, pinned_ray())
