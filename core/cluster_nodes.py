"""The node types of the cluster a config is written for, read from its file (pure: no Ray).

Two kinds of file name them:

- Ray's cluster launcher config (`cluster.yaml`): `available_node_types`, each with its `resources` (CPU, GPU) and
  `max_workers`, and its EC2 `node_config.InstanceType`;
- a KubeRay manifest (`k8s/raycluster.yaml`, or the cluster inside `k8s/rayjob.yaml` / `k8s/rayservice.yaml`): the
  head group and `workerGroupSpecs`, each with `rayStartParams` (num-cpus, num-gpus), `maxReplicas` and the
  instance type its pods are scheduled on (`nodeSelector: {node.kubernetes.io/instance-type: ...}`).

The GPU model of a node type comes from its instance type's family (`GPU_OF_FAMILY`), under the names
`train.memory_budget.GPU_MEMORY_MIB` records memory for; a type whose family is not listed has an unknown GPU model
("") and its GPUs' memory is not checked.

    node_types("cluster.yaml")   # [ClusterNode(name="gpu_worker", instance_type="g5.12xlarge", gpu_model="A10G", ...)]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config import ConfigError, read_yaml

# EC2 instance family -> the GPU model its instances carry (AWS's accelerated-computing instance pages)
GPU_OF_FAMILY = {"g5": "A10G", "g6": "L4", "p4d": "A100-40G", "p4de": "A100-80G", "p5": "H100", "p5e": "H200",
                 "p5en": "H200"}
INSTANCE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class ClusterNode:
    """One node type: what Ray advertises on one node, at most `max_count` of them (-1 = no limit)."""

    name: str
    instance_type: str
    cpus: float
    gpus: int
    gpu_model: str
    max_count: int
    head: bool = False

    @property
    def resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": float(self.gpus)}


def gpu_model(instance_type: str) -> str:
    """The GPU model of an EC2 instance type, "" when unknown.

    >>> gpu_model("g5.12xlarge"), gpu_model("p4de.24xlarge"), gpu_model("m5.4xlarge")
    ('A10G', 'A100-80G', '')
    """
    return GPU_OF_FAMILY.get(instance_type.split(".", 1)[0], "")


def _from_launcher(data: dict, path: str) -> list[ClusterNode]:
    types = data.get("available_node_types") or {}
    head = data.get("head_node_type", "")
    out = []
    for name, spec in types.items():
        resources = spec.get("resources") or {}
        instance = str((spec.get("node_config") or {}).get("InstanceType", ""))
        gpus = int(resources.get("GPU", 0))
        out.append(ClusterNode(name, instance, float(resources.get("CPU", 0)), gpus, gpu_model(instance) if gpus else "",
                               1 if name == head else int(spec.get("max_workers", data.get("max_workers", -1))),
                               head=name == head))
    if not out:
        raise ConfigError(f"{path}: no available_node_types (not a Ray cluster launcher config)")
    return out


def _group(name: str, group: dict, max_count: int, head: bool) -> ClusterNode:
    params = group.get("rayStartParams") or {}
    pod = (group.get("template") or {}).get("spec") or {}
    instance = str((pod.get("nodeSelector") or {}).get(INSTANCE_LABEL, ""))
    limits = [(c.get("resources") or {}).get("limits") or {} for c in pod.get("containers") or []]
    gpus = int(params.get("num-gpus") or sum(int(lim.get("nvidia.com/gpu", 0)) for lim in limits))
    cpus = float(params.get("num-cpus") or 0)
    return ClusterNode(name, instance, cpus, gpus, gpu_model(instance) if gpus else "", max_count, head=head)


def _from_kuberay(data: dict, path: str) -> list[ClusterNode]:
    spec = data.get("spec") or {}
    spec = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or spec
    if "headGroupSpec" not in spec:
        raise ConfigError(f"{path}: no headGroupSpec (not a KubeRay RayCluster, RayJob or RayService)")
    out = [_group("head", spec["headGroupSpec"], 1, head=True)]
    for group in spec.get("workerGroupSpecs") or []:
        out.append(_group(group.get("groupName", "?"), group, int(group.get("maxReplicas", -1)), head=False))
    return out


def node_types(path: str | Path) -> list[ClusterNode]:
    """The node types of a cluster launcher config or KubeRay manifest; ConfigError (exit 2) for anything else."""
    if not Path(path).is_file():
        raise ConfigError(f"cluster file not found: {path}")
    data = read_yaml(path)
    return _from_kuberay(data, str(path)) if "apiVersion" in data else _from_launcher(data, str(path))
