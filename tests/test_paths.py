"""Where relative config paths point in a submitted Ray job (QUORUM_HOME), worked by hand; and the CLI's exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import ConfigError, apply_override
from core.paths import SUBMITTED_JOB_ENV, as_overrides, resolve_paths
from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
JOB = {SUBMITTED_JOB_ENV: "{}"}


@pytest.fixture
def upload(tmp_path) -> Path:
    """What `--working-dir .` uploads: configs/data is there, ../shared is not."""
    (tmp_path / "pkg" / "configs" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "configs" / "data" / "corpus.jsonl").write_text("{}\n")
    return tmp_path / "pkg"


def config(**evaluate) -> dict:
    return {"run": {"root": "runs", "id": ""}, "data": {"path": "configs/data/corpus.jsonl"},
            "evaluate": {"path": "../shared/data/turkcorpus", "extra_adapters": {"sft": "runs/sft/adapter"},
                         "rejudge": [{"engine": {"adapter": "", "model": "smollm2-135m"}}], **evaluate},
            "ray": {"env_vars": {"HF_HOME_path": "x"}}}


def test_with_home_relative_paths_mean_what_they_mean_in_home(upload):
    changes = resolve_paths(config(), {**JOB, "QUORUM_HOME": "/srv/q"}, cwd=str(upload))
    assert changes == {
        "run.root": "/srv/q/runs",
        "evaluate.path": "/srv/shared/data/turkcorpus",  # /srv/q/../shared/..., normalised
        "evaluate.extra_adapters.sft": "/srv/q/runs/sft/adapter",
    }  # data.path is in the upload and stays; model names, empty paths and env_vars are no paths


def test_submitted_job_without_home_refuses_a_relative_root(upload):
    with pytest.raises(ConfigError, match=r"^run\.root: 'runs' is relative.*submitted Ray job.*QUORUM_HOME"):
        resolve_paths(config(), JOB, cwd=str(upload))


def test_submitted_job_without_home_refuses_a_path_outside_the_upload(upload):
    data = config()
    data["run"]["root"] = "s3://bucket/runs"
    with pytest.raises(ConfigError, match=r"^evaluate\.path: '\.\./shared/data/turkcorpus' is outside the job's "
                                          r"working directory.*QUORUM_HOME"):
        resolve_paths(data, JOB, cwd=str(upload))
    data["evaluate"]["path"] = "/mnt/shared/turkcorpus"
    assert resolve_paths(data, JOB, cwd=str(upload)) == {}  # absolute and URIs as they are


def test_outside_a_job_nothing_changes_without_home(upload):
    assert resolve_paths(config(), {}, cwd=str(upload)) == {}


def test_overrides_round_trip_any_path_text():
    data = {"run": {"root": "runs"}}
    (override,) = as_overrides({"run.root": "/tmp/it's: a {path}"})
    apply_override(data, override)
    assert data["run"]["root"] == "/tmp/it's: a {path}"


def test_cli_in_a_submitted_job_without_home_exits_2_naming_run_root(monkeypatch, capsys):
    monkeypatch.setenv(SUBMITTED_JOB_ENV, "{}")
    monkeypatch.delenv("QUORUM_HOME", raising=False)
    monkeypatch.chdir(REPO)
    assert cli_main(["run", "configs/demo_scores.yaml"]) == 2
    assert "run.root: 'runs' is relative" in capsys.readouterr().err


def test_cli_resolves_against_home(monkeypatch, tmp_path):
    """Config loading (validation included) sees the resolved paths: a data file only under QUORUM_HOME is found."""
    from core.config import load_config
    from core.paths import path_overrides
    from jobs.cli import job_module

    (tmp_path / "mine.jsonl").write_text('{"id": "a", "text": "x"}\n')
    monkeypatch.setenv(SUBMITTED_JOB_ENV, "{}")
    monkeypatch.setenv("QUORUM_HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    module = job_module("configs/demo_scores.yaml")
    overrides = ["data.path=mine.jsonl"]
    cfg = load_config(module.Config, "configs/demo_scores.yaml",
                      overrides + path_overrides(module.Config, "configs/demo_scores.yaml", overrides))
    assert cfg.run.root == f"{tmp_path}/runs" and cfg.data.path == f"{tmp_path}/mine.jsonl"


def test_every_documented_submit_uses_the_tested_runtime_env():
    """The submit examples the tests cannot run (GPU cluster, every job page) carry the same flags and excludes as
    the one they do (the cluster guide's local-head block, tests/ray_head.py). Paper pages point at these."""
    import json
    import re

    from tests.ray_head import command

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "jobs").glob("*.md"))]
    # the commands of the pages' code blocks (prose may name a flag alone: `ray job submit --entrypoint-num-cpus`)
    blocks = [b for p in pages for b in re.findall(r"```[a-z]*\n(.*?)```", p.read_text(encoding="utf-8"), re.DOTALL)]
    text = "\n".join(blocks).replace("\\\n", " ")
    tested = command("export RUNTIME_ENV=")
    excludes = json.loads(re.search(r'"excludes": (\[[^]]*\])', tested).group(1))
    assert {"*.whl", "runs/", ".venv/", "wandb/"} <= set(excludes)
    for line in re.findall(r"export RUNTIME_ENV=.*", text):
        assert json.loads(re.search(r'"excludes": (\[[^]]*\])', line).group(1)) == excludes, line
    submits = re.findall(r"^\s*(ray job submit [^\n]*)", text, re.MULTILINE)
    assert len(submits) >= 10
    for submit in submits:
        assert '--working-dir . --runtime-env-json "$RUNTIME_ENV"' in submit and "--entrypoint-num-cpus" in submit
