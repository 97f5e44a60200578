"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own JSON schema and validation), has the three node
types with sane autoscaling bounds, and installs the same pins as pyproject.toml."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[1]


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


def test_setup_installs_pyproject_pins_in_working_order(cluster, pins):
    commands = cluster["setup_commands"]
    joined = "\n".join(commands)
    torch_at = next(i for i, c in enumerate(commands) if f"torch=={pins['torch']}" in c)
    deepspeed_at = next(i for i, c in enumerate(commands) if f"deepspeed=={pins['deepspeed']}" in c)
    project_at = next(i for i, c in enumerate(commands) if "pip install -e '.[gpu]'" in c)
    # deepspeed's setup.py imports torch: torch must already be installed and build isolation off.
    assert torch_at < deepspeed_at < project_at
    assert "--no-build-isolation" in commands[deepspeed_at]
    assert "~/quorum" in cluster["file_mounts"] and cluster["file_mounts"]["~/quorum"] == "."
    assert "cd ~/quorum" in joined


# vLLM 0.33.0's own requirements (its wheel's METADATA, 2026-11-26) on packages quorum constrains too, and the
# version of each that `pip install -e '.[gpu]'` can then get
VLLM_REQUIRES = {"torch": ("==2.13.0", "2.13.0"), "transformers": (">=5.16.1,<5.20.0", "5.19.0"),
                 "llguidance": (">=1.7.0,<1.8.0", "1.7.6"), "fastapi": (">=0.133.0,<0.137.0", "0.136.0")}


def test_gpu_extra_resolves_with_vllms_requirements(pins):
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ours = {Requirement(s).name.lower(): Requirement(s).specifier for s in project["dependencies"]}
    assert pins["vllm"] == "0.33.0", "VLLM_REQUIRES is vLLM 0.33.0's: refresh it with the vllm pin"
    for name, (theirs, version) in VLLM_REQUIRES.items():
        assert version in SpecifierSet(theirs) and version in ours[name], (name, str(ours[name]), theirs)
    # the CPU install (no vLLM) resolves the ranges to the versions CI tests, their upper bounds
    assert "5.23.0" in ours["transformers"] and "5.23.1" not in ours["transformers"]
    assert "1.9.1" in ours["llguidance"] and "1.9.2" not in ours["llguidance"]


def test_ray_image_matches_pinned_ray_and_python(cluster, pins):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, minor = re.search(r">=(\d+)\.(\d+)", project["requires-python"]).groups()
    py = f"py{major}{minor}"
    images = [cluster["docker"]["image"], cluster["docker"]["head_image"]]
    images.append(cluster["available_node_types"]["cpu_worker"]["docker"]["worker_image"])
    for image in images:
        assert image.startswith(f"rayproject/ray:{pins['ray']}-{py}-"), image


def test_header_documents_launch_and_submit():
    header = (REPO / "cluster.yaml").read_text().split("\n\n", 1)[0]
    assert "ray up cluster.yaml" in header
    assert re.search(r'ray job submit --address \S+ --working-dir \. --runtime-env-json "\$RUNTIME_ENV"', header)
    assert "-- quorum run configs/" in header and 'README "Running on a cluster"' in header
