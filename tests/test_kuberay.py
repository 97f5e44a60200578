"""k8s/ is cluster.yaml on KubeRay: k8s/raycluster.yaml has the same node types, autoscaling bounds and Ray version
(pinned in pyproject.toml); k8s/rayjob.yaml and k8s/rayservice.yaml run on that very cluster spec; every pod mounts
the one ReadWriteMany claim of k8s/shared-storage.yaml at the shared path of cluster.yaml and the cluster configs.

No maintained PyPI package ships KubeRay's CRDs (their openAPIV3Schema lives in the Go operator's repository), so
the manifests are parsed and checked field by field, with the shapes and rules of KubeRay 1.7's types and
validation (ray-operator/apis/ray/v1/*_types.go, controllers/ray/utils/validation.go): rayStartParams values are
strings; a worker group has a DNS-label name and 0 <= minReplicas <= replicas <= maxReplicas; token auth is
`authOptions: {mode: token, secretName}` (the secret's key `auth_token`); autoscaler v2 is `autoscalerOptions.version:
v2` with no RAY_enable_autoscaler_v2 env and pods whose restartPolicy is Never or unset. `test_checks_are_not_vacuous`
breaks a copy one field at a time.
"""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# cluster.yaml's node type -> KubeRay group name (a group name is part of pod names: DNS labels have no "_")
GROUPS = {"cpu_worker": "cpu-worker", "gpu_worker": "gpu-worker"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SHARED = "/mnt/shared"           # cluster.yaml's EFS mount, ray.shared_storage of configs/*_cluster.yaml
CLAIM = "quorum-shared"          # k8s/shared-storage.yaml
TOKEN_SECRET = "quorum-ray-token"
IMAGE_IN_REPO = "/home/ray/quorum"  # where k8s/Dockerfile puts the repository


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def pinned_ray() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.match(r"^ray\[[^\]]*\]==([^;\s]+)", d).group(1) for d in deps if d.startswith("ray["))


def quantity(value: str | float) -> float:
    """A Kubernetes CPU quantity ("16", "500m", 4) as a number of CPUs."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_guaranteed(container: dict, where: str) -> None:
    """requests == limits for every resource (Guaranteed QoS), both given."""
    resources = container["resources"]
    assert resources["limits"] and resources["requests"] == resources["limits"], (where, resources)


def check_cluster_spec(spec: dict, cluster: dict, ray_version: str) -> None:
    """Raise AssertionError where the RayCluster spec departs from cluster.yaml or from the CRD's shapes."""
    types = cluster["available_node_types"]
    assert spec["rayVersion"] == ray_version, spec["rayVersion"]
    assert spec.get("authOptions") == {"mode": "token", "secretName": TOKEN_SECRET}, spec.get("authOptions")
    assert spec["enableInTreeAutoscaling"] is True
    autoscaler = spec["autoscalerOptions"]
    assert autoscaler["version"] == "v2"
    assert autoscaler["idleTimeoutSeconds"] == 60 * cluster["idle_timeout_minutes"]
    assert autoscaler["upscalingMode"] in ("Default", "Aggressive", "Conservative")
    check_guaranteed(autoscaler, "autoscaler")

    groups = {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}
    assert set(groups) == {"head", *GROUPS.values()}, sorted(groups)
    for node_type, group_name in {"head": "head", **GROUPS}.items():
        group, node = groups[group_name], types[node_type]
        assert DNS_LABEL.match(group_name), group_name
        params = group["rayStartParams"]
        # the CRD's rayStartParams is map[string]string: a bare number is refused by the API server
        assert all(isinstance(v, str) for v in params.values()), (group_name, params)
        pod = group["template"]["spec"]
        assert pod.get("restartPolicy", "Never") == "Never", group_name  # autoscaler v2 (validation.go)
        (container,) = [c for c in pod["containers"] if c["name"].startswith("ray-")]
        assert all(e["name"] != "RAY_enable_autoscaler_v2" for e in container.get("env", [])), group_name
        check_guaranteed(container, group_name)
        limits = container["resources"]["limits"]
        resources = node["resources"]
        # Ray is told the CPUs the container has (the head's 0 keeps work off it), at most cluster.yaml's node's
        if node_type == "head":
            assert float(params["num-cpus"]) == resources["CPU"] == 0
        else:
            assert float(params["num-cpus"]) == quantity(limits["cpu"]) <= resources["CPU"], group_name
        assert float(params.get("num-gpus", 0)) == resources.get("GPU", 0), group_name
        assert int(limits.get("nvidia.com/gpu", 0)) == resources.get("GPU", 0), group_name
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        assert yaml.safe_load(params.get("resources", "{}")) == custom, group_name
        flavor = "gpu" if resources.get("GPU") else "cpu"
        assert container["image"] == f"quorum:{ray_version}-py311-{flavor}", container["image"]
        # the shared claim, at the shared path, in every pod
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert any(claims.get(name) == CLAIM and path == SHARED for name, path in mounts.items()), group_name
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env.get("QUORUM_HOME", "").startswith(SHARED + "/"), group_name
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


def test_the_shared_claim_is_read_write_many_and_the_one_every_pod_mounts():
    docs = list(yaml.safe_load_all((REPO / "k8s" / "shared-storage.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    claim, storage_class = by_kind["PersistentVolumeClaim"], by_kind["StorageClass"]
    assert claim["metadata"]["name"] == CLAIM
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # pods on every node read and write it at once
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    assert storage_class["reclaimPolicy"] == "Retain"
    # the access point writes as the `ray` user of the rayproject images (uid 1000, gid 100)
    params = storage_class["parameters"]
    assert (params["provisioningMode"], params["uid"], params["gid"]) == ("efs-ap", "1000", "100")


def test_rayjob_runs_quorum_on_the_same_cluster_off_the_head(cluster):
    job = load("k8s/rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    # the RayJob's cluster is the RayCluster's spec, verbatim: one place to change node types
    assert job["spec"]["rayClusterSpec"] == load("k8s/raycluster.yaml")["spec"]
    entry = job["spec"]["entrypoint"]
    # KubeRay pastes the entrypoint unquoted into the submitter's bash line (common/job.go, BuildJobSubmitCommand):
    # a top-level `&&` or `;` would run the rest in the submitter pod, not in the Ray job
    lexer = shlex.shlex(entry, posix=True, punctuation_chars=True)
    words = list(lexer)
    assert not {"&&", ";", "||", "|", "&"} & set(words), words
    assert words[:2] == ["bash", "-c"] and len(words) == 3, words
    inner = words[2]
    assert inner.startswith(f"cd {IMAGE_IN_REPO} && quorum run "), inner
    config = re.search(r"quorum run (configs/\S+\.yaml)", inner).group(1)
    assert (REPO / config).is_file(), config
    # the driver reserves CPUs, so Ray does not pin it to the 0-CPU head (job_manager.py, _get_label_selector)
    assert job["spec"]["entrypointNumCpus"] >= 1
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["QUORUM_HOME"].startswith(SHARED + "/")
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    # the submitter pod (KubeRay's default asks less than it may use) is Guaranteed too, on the head's image
    submitter = job["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["restartPolicy"] == "Never"
    (container,) = submitter["containers"]
    check_guaranteed(container, "submitter")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert container["image"] == head["image"]


def expected_serve_config() -> dict:
    """`quorum serve configs/grm_cluster.yaml --print-config` as it prints inside the image."""
    from core.config import load_config
    from jobs.serve_grm import Config, serve_config

    text = yaml.safe_dump(serve_config(load_config(Config, REPO / "configs" / "grm_cluster.yaml")), sort_keys=False)
    return yaml.safe_load(text.replace(f"{REPO}/", f"{IMAGE_IN_REPO}/"))


def test_rayservice_serves_the_printed_grm_config_on_the_same_cluster(cluster):
    service = load("k8s/rayservice.yaml")
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    spec = service["spec"]
    assert spec["rayClusterConfig"] == load("k8s/raycluster.yaml")["spec"]
    served = yaml.safe_load(spec["serveConfigV2"])
    assert served == expected_serve_config(), (
        "k8s/rayservice.yaml's serveConfigV2 is not `quorum serve configs/grm_cluster.yaml --print-config=-` as it "
        f"prints in the image: regenerate it (paths under {IMAGE_IN_REPO})")
    (app,) = served["applications"]
    # replicas load the judge from the staged cache on the shared claim, offline
    env = app["runtime_env"]["env_vars"]
    assert env["HF_HOME"].startswith(SHARED + "/") and env["HF_HUB_OFFLINE"] == "1"
    # every replica fits a gpu-worker pod, and the most replicas fit the group's most pods
    (deployment,) = app["deployments"]
    gpus = deployment["ray_actor_options"]["num_gpus"]
    group = next(g for g in spec["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "gpu-worker")
    per_pod = float(group["rayStartParams"]["num-gpus"])
    assert 0 < gpus <= per_pod
    assert deployment["autoscaling_config"]["max_replicas"] * gpus <= group["maxReplicas"] * per_pod


def break_field(spec: dict, how: str) -> dict:
    spec = copy.deepcopy(spec)
    gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-worker")
    container = gpu["template"]["spec"]["containers"][0]
    if how == "gpus":
        gpu["rayStartParams"]["num-gpus"] = "2"
    elif how == "int-param":
        gpu["rayStartParams"]["num-cpus"] = 46
    elif how == "cpus-beyond-container":
        gpu["rayStartParams"]["num-cpus"] = "48"
    elif how == "max-replicas":
        gpu["maxReplicas"] = 7
    elif how == "group-name":
        gpu["groupName"] = "gpu_worker"
    elif how == "image":
        container["image"] = "quorum:2.59.0-py311-gpu"
    elif how == "gpu-limit":
        container["resources"]["limits"]["nvidia.com/gpu"] = "2"
    elif how == "burstable":
        container["resources"]["requests"]["cpu"] = "40"
    elif how == "autoscaler-burstable":
        spec["autoscalerOptions"]["resources"]["requests"]["memory"] = "256Mi"
    elif how == "idle":
        spec["autoscalerOptions"]["idleTimeoutSeconds"] = 60
    elif how == "autoscaling":
        spec["enableInTreeAutoscaling"] = False
    elif how == "autoscaler-v1":
        spec["autoscalerOptions"]["version"] = "v1"
    elif how == "v2-env":
        container["env"].append({"name": "RAY_enable_autoscaler_v2", "value": "1"})
    elif how == "restart-always":
        gpu["template"]["spec"]["restartPolicy"] = "Always"
    elif how == "no-auth":
        del spec["authOptions"]
    elif how == "mount-path":
        container["volumeMounts"][0]["mountPath"] = "/shared"
    elif how == "claim":
        gpu["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "scratch"
    return spec


@pytest.mark.parametrize("how", ["gpus", "int-param", "cpus-beyond-container", "max-replicas", "group-name", "image",
                                 "gpu-limit", "burstable", "autoscaler-burstable", "idle", "autoscaling",
                                 "autoscaler-v1", "v2-env", "restart-always", "no-auth", "mount-path", "claim"])
def test_checks_are_not_vacuous(cluster, how):
    spec = load("k8s/raycluster.yaml")["spec"]
    check_cluster_spec(spec, cluster, pinned_ray())  # the intact copy passes...
    with pytest.raises(AssertionError):               # ...and each broken one fails
        check_cluster_spec(break_field(spec, how), cluster, pinned_ray())
