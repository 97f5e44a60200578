"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own JSON schema and validation), has the three node
types with sane autoscaling bounds, runs the quorum image (k8s/Dockerfile: the pins of pyproject.toml, installed
once into the image, never at a node's boot), and mounts one shared filesystem at the path every cluster config
and every KubeRay pod uses."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[1]
# where every node mounts the shared filesystem, and the image every node runs (k8s/Dockerfile)
SHARED = "/mnt/shared"
IMAGE = "quorum"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def pins() -> dict[str, str]:
    """Exact `name==version` pins from pyproject's dependencies and extras (extras markers stripped)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [s for extra in project["optional-dependencies"].values() for s in extra]
    found = (re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", s) for s in specs)
    return {m.group(1).lower(): m.group(2) for m in found if m}


def test_matches_rays_json_schema(cluster):
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(cluster, json.loads(schema_path.read_text()))


def test_passes_rays_own_validation_after_defaults(cluster):
    # What `ray up` does: merge the AWS provider defaults, then validate (schema + cross-field checks).
    prepared = prepare_config(copy.deepcopy(cluster))
    validate_config(prepared)
    assert prepared["available_node_types"]["head"]["max_workers"] == 0


def test_schema_check_is_not_vacuous(cluster):
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_node_types_and_autoscaling_bounds(cluster):
    types = cluster["available_node_types"]
    assert set(types) == {"head", "cpu_worker", "gpu_worker"}
    assert cluster["head_node_type"] == "head"
    assert types["head"]["resources"] == {"CPU": 0}
    for name in ("cpu_worker", "gpu_worker"):
        node = types[name]
        assert 0 <= node["min_workers"] <= node["max_workers"] <= cluster["max_workers"], name
    assert types["cpu_worker"]["resources"].get("GPU", 0) == 0
    assert types["gpu_worker"]["resources"]["GPU"] >= 1
    assert types["gpu_worker"]["node_config"]["InstanceType"].startswith(("g5.", "g6.", "g6e."))
    assert cluster["idle_timeout_minutes"] > 0


def test_nodes_boot_from_the_image_not_from_pip(cluster, pins):
    """Dependencies are baked into the image: setup installs nothing heavy; the Dockerfile installs the pins."""
    setup = "\n".join(cluster["setup_commands"])
    for heavy in ("torch", "deepspeed", "vllm", "'.[gpu]'"):
        assert heavy not in setup, heavy
    assert cluster["setup_commands"] == ["cd ~/quorum && pip install --no-deps -e ."]
    assert "~/quorum" in cluster["file_mounts"] and cluster["file_mounts"]["~/quorum"] == "."
    dockerfile = (REPO / "k8s" / "Dockerfile").read_text()
    # the image's editable install is where file_mounts puts the checkout (~ is /home/ray in Ray's images)
    assert "COPY --chown=ray:users . /home/ray/quorum" in dockerfile
    steps = [f"pip install torch=={pins['torch']}", f"pip install --no-build-isolation deepspeed=={pins['deepspeed']}",
             "pip install -e '.[gpu]'"]
    at = [dockerfile.index(step) for step in steps]  # each step present...
    # ...in working order: deepspeed's setup.py imports torch, so torch first and build isolation off
    assert at == sorted(at)


def test_gpu_nodes_check_cuda_before_ray_starts_and_boot_an_ami_with_a_current_driver(cluster):
    """The image's torch is a CUDA build (tests/test_gpu_extra.py reads which from the wheel): a GPU node boots an
    AMI whose driver runs it, and its setup (which runs before `ray start`) stops with one clear line when it
    cannot (train/cuda_check.py)."""
    gpu = cluster["available_node_types"]["gpu_worker"]
    # the last setup step (tests/test_cluster_launch.py: the commands before it are the global setup_commands)
    assert gpu["worker_setup_commands"][-1] == "cd ~/quorum && python -m train.cuda_check"
    ami = gpu["node_config"]["ImageId"]
    # EC2 resolves a public SSM parameter at launch; Ray's launcher passes ImageId through unchanged
    assert ami.startswith("resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-"), ami
    # the CPU node types keep Ray's default AMI: their containers run no CUDA
    for name in ("head", "cpu_worker"):
        assert "ImageId" not in cluster["available_node_types"][name]["node_config"], name
    prepared = prepare_config(copy.deepcopy(cluster))
    assert prepared["available_node_types"]["gpu_worker"]["node_config"]["ImageId"] == ami


def test_images_are_the_quorum_image_on_the_pinned_ray_and_python(cluster, pins):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, minor = re.search(r">=(\d+)\.(\d+)", project["requires-python"]).groups()
    py = f"py{major}{minor}"
    docker = cluster["docker"]
    cpu_image = cluster["available_node_types"]["cpu_worker"]["docker"]["worker_image"]
    assert docker["image"] == f"{IMAGE}:{pins['ray']}-{py}-gpu"
    assert docker["head_image"] == cpu_image == f"{IMAGE}:{pins['ray']}-{py}-cpu"
    assert f"FROM rayproject/ray:{pins['ray']}-{py}-${{FLAVOR}}" in (REPO / "k8s" / "Dockerfile").read_text()


def test_every_node_mounts_the_shared_storage_at_one_path(cluster):
    """EFS on each host (initialization_commands), bind-mounted into the container at the same path; the path every
    cluster config names as ray.shared_storage and every KubeRay pod mounts its claim at."""
    (mount,) = cluster["initialization_commands"]
    assert f' "$QUORUM_EFS:/" {SHARED}' in mount and "mount -t nfs4 -o nfsvers=4.1," in mount
    assert f"--volume {SHARED}:{SHARED}" in cluster["docker"]["run_options"]
    for path in sorted((REPO / "configs").glob("*_cluster.yaml")):
        assert yaml.safe_load(path.read_text())["ray"]["shared_storage"] == SHARED, path.name
    for manifest in ("raycluster.yaml", "rayjob.yaml", "rayservice.yaml"):
        mounts = re.findall(r"\{name: shared, mountPath: (\S+)\}", (REPO / "k8s" / manifest).read_text())
        assert mounts and set(mounts) == {SHARED}, manifest


def run_mount(command: str) -> subprocess.CompletedProcess:
    """The host command with sudo, mountpoint and the NFS client check stubbed to print what they would do."""
    stubs = 'sudo() { echo "sudo $*"; }; mountpoint() { return 1; }; command() { return 0; }; '
    return subprocess.run(["bash", "-c", stubs + command], capture_output=True, text=True, timeout=30, check=False)


def test_the_mount_command_mounts_efs_and_refuses_the_placeholder(cluster):
    (mount,) = cluster["initialization_commands"]
    refused = run_mount(mount)
    assert refused.returncode == 1 and "set QUORUM_EFS" in refused.stderr
    assert "sudo" not in refused.stdout  # nothing touched before the file system is named
    efs = "fs-0a1b2c3d.efs.us-west-2.amazonaws.com"
    done = run_mount(mount.replace("fs-REPLACE-ME.efs.us-west-2.amazonaws.com", efs))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"sudo mkdir -p {SHARED}",
        ("sudo mount -t nfs4 -o nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport "
         f"{efs}:/ {SHARED}"),
        f"sudo chown 1000:100 {SHARED}"]


def test_secrets_reach_every_ray_process_by_environment_not_runtime_env(cluster):
    """API keys live in one local file mounted on every node and exported into `ray start`'s environment, which
    every raylet, actor, job supervisor and driver of the node inherits; never in a runtime env (Ray logs those)."""
    secrets = "~/.quorum/secrets.env"
    assert cluster["file_mounts"][secrets] == secrets
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in cluster[key] if "ray start" in c)
        assert f"set -a; . {secrets}; set +a;" in start, key
        assert start.index(secrets) < start.index("ray start"), key
        assert "RAY_AUTH_MODE=token" in start, key
    header = (REPO / "cluster.yaml").read_text().split("\n\n", 1)[0]
    assert f"chmod 600 {secrets}" in header


def test_header_documents_launch_and_submit():
    header = (REPO / "cluster.yaml").read_text().split("\n\n", 1)[0]
    assert "ray up cluster.yaml" in header
    assert re.search(r'ray job submit --address \S+ --working-dir \. --runtime-env-json "\$RUNTIME_ENV"', header)
    assert "-- quorum run configs/" in header
    # the guide it points at exists and walks through this file
    assert "docs/cluster.md" in header
    guide = (REPO / "docs" / "cluster.md").read_text()
    assert guide.startswith("# ") and "cluster.yaml" in guide and "ray up cluster.yaml" in guide
