"""The `gpu` extra installs: pip's own resolver, against the package registry, on what k8s/Dockerfile installs.

No table of another package's requirements is kept here: the resolver reads the published metadata, and the checks
below read the wheels' Requires-Dist from pip's installation report (`--dry-run --report`). Needs the registry
(PyPI, or the index PIP_INDEX_URL names); skipped, with the reason, where it cannot be reached. Machine-local pip
settings (find-links, extra indexes, constraints, config files) are left out so that the registry alone decides.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
# what must not reach pip: anything that adds packages or caps versions besides the registry
LOCAL_PIP_SETTINGS = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONFIG_FILE",
                      "PIP_REQUIRE_VIRTUALENV")

# the resolve: metadata of ~250 distributions and an sdist's (DeepSpeed's) build, 2-10 min on 2 busy cores
resolver = pytest.mark.slow


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def exact_pins() -> dict[str, str]:
    """name -> version of every `name==version` requirement of the dependencies and the gpu extra."""
    specs = list(project()["dependencies"]) + list(project()["optional-dependencies"]["gpu"])
    pins = {}
    for spec in specs:
        req = Requirement(spec)
        specifiers = list(req.specifier)
        if len(specifiers) == 1 and specifiers[0].operator == "==":
            pins[req.name.lower()] = specifiers[0].version
    return pins


def dockerfile_gpu_requirements() -> list[str]:
    """The requirements k8s/Dockerfile's GPU flavour hands pip, in order (torch, deepspeed, the project's extra)."""
    text = (REPO / "k8s" / "Dockerfile").read_text()
    reqs = re.findall(r"pip install (?:--no-build-isolation )?([A-Za-z0-9_.-]+==[^\s\\;]+)", text)
    assert "pip install -e '.[gpu]'" in text
    return reqs + [".[gpu]"]


def registry_problem() -> str | None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"the images are Linux x86_64; this is {platform.system()} {platform.machine()}"
    cafile = os.environ.get("PIP_CERT") or None
    try:
        with urllib.request.urlopen(f"{INDEX}/pip/", timeout=15,
                                    context=ssl.create_default_context(cafile=cafile)) as response:
            response.read(1)
    except OSError as exc:
        return f"package registry {INDEX} unreachable ({exc})"
    return None


def run_resolve(tmp: Path) -> dict:
    """pip's resolve of what k8s/Dockerfile installs, against the registry: {"skip": why} where the registry cannot be
    reached, else {"requirements", "returncode", "stderr", "report"}."""
    if problem := registry_problem():
        return {"skip": problem}
    # the project's metadata only (its dependencies and extras), built outside the checkout
    source = tmp / "quorum"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    requirements = [str(source) + r[1:] if r.startswith(".") else r for r in dockerfile_gpu_requirements()]
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_PIP_SETTINGS} | {"PIP_CONFIG_FILE": os.devnull}
    out = tmp / "report.json"
    pip = subprocess.Popen(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--index-url", INDEX, "--report", str(out), *requirements],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _background["pip"] = pip
    # started while other tests run: it takes the CPU they leave (its build subprocesses inherit the niceness); once
    # the fixture waits for it, nothing else of the suite runs and it has the CPUs to itself
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, pip.pid, 10)
    try:
        _, stderr = pip.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        pip.kill()
        _, stderr = pip.communicate()
    if pip.returncode != 0 and re.search(r"NewConnectionError|ProxyError|Max retries exceeded|timed out", stderr):
        return {"skip": f"package registry {INDEX} unreachable during the resolve: {stderr[-500:]}"}
    return {"requirements": requirements, "returncode": pip.returncode, "stderr": stderr,
            "report": json.loads(out.read_text()) if pip.returncode == 0 else None}


# The resolve takes ~40 s, much of it waiting on the registry: tests/conftest.py starts it when the session's tests are
# collected (only when a test below that reads it is selected), at a lower CPU priority, so that it overlaps the
# tests that run before this module instead of adding its time to theirs.
_background: dict = {}
BACKGROUND_FIXTURES = ("resolve",)


# Under pytest-xdist the controller process starts it (tests/conftest.py) and names, in this variable, the file its
# outcome goes to; the worker that runs this module reads that file.
OUTCOME_ENV = "QUORUM_TEST_GPU_EXTRA_OUTCOME"


def start_in_background(outcome_file: Path | None = None) -> None:
    """Start `run_resolve` in a daemon thread (once); the `resolve` fixture waits for its outcome, or, with
    `outcome_file`, the outcome (or the error's text) is written there as JSON for another process to read."""
    if "thread" in _background:
        return
    tmp = Path(tempfile.mkdtemp(prefix="gpu-extra-"))
    _background["tmp"] = tmp

    def work() -> None:
        try:
            _background["outcome"] = run_resolve(tmp)
        except Exception as exc:  # noqa: BLE001 - re-raised by the fixture, in the test that reads the resolve
            _background["error"] = exc
        if outcome_file is not None:
            published = {"error": repr(_background["error"])} if "error" in _background else _background["outcome"]
            partial = outcome_file.with_suffix(".partial")
            partial.write_text(json.dumps(published))
            partial.rename(outcome_file)  # whole or absent: the reader never sees half a file

    _background["thread"] = thread = threading.Thread(target=work, name="gpu-extra-resolve", daemon=True)
    thread.start()
    atexit.register(_stop_background)  # a session that ends before this module does not wait for pip


def _stop_background() -> None:
    if (pip := _background.get("pip")) is not None and pip.poll() is None:
        pip.kill()
        pip.wait()
    shutil.rmtree(_background["tmp"], ignore_errors=True)


@pytest.fixture(scope="module")
def resolve() -> dict:
    if published := os.environ.get(OUTCOME_ENV):  # started by the pytest-xdist controller
        outcome = _read_published(Path(published))
    else:
        start_in_background()  # started already unless this module's tests were not collected up front
        _background["thread"].join()
        if "error" in _background:
            raise _background["error"]
        outcome = _background["outcome"]
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    return outcome


def _read_published(path: Path, timeout_s: float = 1500) -> dict:
    """The controller's outcome, once its thread has written it (pip's own timeout is 1,200 s)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"no resolve outcome at {path} after {timeout_s:.0f} s"
        time.sleep(0.5)
    outcome = json.loads(path.read_text())
    if "error" in outcome:
        raise RuntimeError(f"the background resolve failed: {outcome['error']}")
    return outcome


def installed(resolve: dict) -> dict[str, dict]:
    """What the GPU image's pip would install, by name; a failed resolve fails the calling test with pip's why."""
    assert resolve["returncode"] == 0, f"pip cannot install {resolve['requirements']}:\n{resolve['stderr'][-4000:]}"
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]
            for item in resolve["report"]["install"]}


def requires(resolve: dict, metadata: dict, name: str) -> SpecifierSet:
    """The specifier `metadata`'s Requires-Dist puts on `name` in the resolve's environment (no extras)."""
    env = {**resolve["report"]["environment"], "extra": ""}
    specs = [Requirement(r) for r in metadata.get("requires_dist", [])]
    found = [r.specifier for r in specs if r.name.lower() == name and (r.marker is None or r.marker.evaluate(env))]
    assert found, f"{metadata['name']} does not require {name}"
    return found[0]


def test_the_dockerfile_installs_the_pins():
    pins = exact_pins()
    assert dockerfile_gpu_requirements() == [f"torch=={pins['torch']}", f"deepspeed=={pins['deepspeed']}", ".[gpu]"]


@resolver
def test_the_gpu_extra_resolves_to_every_pin(resolve):
    got = installed(resolve)
    for name, version in exact_pins().items():
        assert name in got, f"{name} is not installed by the GPU image's resolve"
        assert got[name]["version"] == version, (name, got[name]["version"], version)
    assert "vllm" in got and "quorum" in got


@resolver
def test_the_pin_comments_quote_vllms_own_requirements(resolve):
    """pyproject's comment on the two ranges quotes the pinned vLLM wheel's Requires-Dist, and its floors reach
    into our ranges (else the extra would not resolve, which the test above would say)."""
    text = (REPO / "pyproject.toml").read_text()
    vllm = installed(resolve)["vllm"]
    quoted = re.search(r"vLLM (\S+) requires transformers(\S+) and llguidance(\S+) \(its wheel's", text)
    assert quoted, "pyproject.toml: the comment on transformers / llguidance no longer quotes vLLM"
    version, transformers, llguidance = quoted.groups()
    assert version == vllm["version"]
    assert SpecifierSet(transformers) == requires(resolve, vllm, "transformers")
    assert SpecifierSet(llguidance) == requires(resolve, vllm, "llguidance")


@resolver
def test_the_pinned_torch_is_a_cuda_build_whose_driver_floor_is_known_and_documented(resolve):
    """The driver a node needs follows from the torch wheel's CUDA (its Requires-Dist), not from a note."""
    from train.cuda_check import DRIVER_FLOOR, format_version

    torch_meta = installed(resolve)["torch"]
    reqs = " ".join(torch_meta.get("requires_dist", []))
    majors = {int(m) for m in re.findall(r"nvidia-[a-z-]+-cu(\d+)\b", reqs)}
    toolkit = re.search(r"cuda-toolkit\[[^\]]*\]==(\d+)\.", reqs)
    majors |= {int(toolkit.group(1))} if toolkit else set()
    assert len(majors) == 1, f"torch {torch_meta['version']}: CUDA major versions {majors} in its Requires-Dist"
    (major,) = majors
    assert major in DRIVER_FLOOR, f"train.cuda_check.DRIVER_FLOOR has no driver floor for CUDA {major}"
    guide = (REPO / "docs" / "cluster.md").read_text()
    assert f"CUDA {major}" in guide and f">= {format_version(DRIVER_FLOOR[major])}" in guide
