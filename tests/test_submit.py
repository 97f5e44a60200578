"""`quorum submit`'s plan, without a cluster: the entrypoint, runtime env, driver resources, run directory, secret
names and token header it would hand Ray's JobSubmissionClient, and the errors it stops on (exit 2, before any
upload). The submission itself runs against a real head in tests/test_job_submit.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from core.config import ConfigError
from jobs.cli import job_module
from jobs.cli import main as cli_main
from jobs.submit import auth_headers, parse_args
from jobs.submit import plan as submit_plan

REPO = Path(__file__).resolve().parents[1]


def plan(sub):
    return submit_plan(sub, job_module)


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("QUORUM_HOME", raising=False)


def test_plan_builds_the_runtime_env_the_driver_resources_and_the_run_directory(in_repo, tmp_path):
    sub = parse_args(["configs/demo_scores.yaml", "data.limit=4", "run.id=r1", "--home", str(tmp_path),
                      "--entrypoint-num-cpus=0.5", "--entrypoint-memory", "2000000000", "--env", "OMP_NUM_THREADS=2",
                      "--no-resume", "--follow"])
    p = plan(sub)
    assert p.job == "policy_simplify" and sub.follow
    assert shlex.split(p.entrypoint) == ["quorum", "run", "configs/demo_scores.yaml", "data.limit=4", "run.id=r1",
                                         "run.resume=false"]
    assert p.runtime_env["working_dir"] == str(REPO)
    assert p.runtime_env["env_vars"] == {"OMP_NUM_THREADS": "2", "QUORUM_HOME": str(tmp_path)}
    assert {"*.whl", "runs/", ".venv/", "wandb/", ".git/", ".env"} <= set(p.runtime_env["excludes"])
    assert (p.num_cpus, p.memory) == (0.5, 2_000_000_000)
    assert p.run_dir == f"{tmp_path}/runs/policy_simplify/r1"


def test_run_directory_defaults_to_the_config_name_under_quorum_home_and_keeps_absolute_roots(in_repo, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("QUORUM_HOME", str(tmp_path))
    assert plan(parse_args(["configs/demo_scores.yaml"])).run_dir == f"{tmp_path}/runs/policy_simplify/demo_scores"
    p = plan(parse_args(["configs/demo_scores.yaml", "run.root=s3://bucket/runs", "--no-check"]))
    assert p.run_dir == "s3://bucket/runs/policy_simplify/demo_scores"
    # a run root inside the uploaded directory is not uploaded with it
    inside = plan(parse_args(["configs/demo_scores.yaml", f"run.root={REPO}/scratch-runs"]))
    assert "/scratch-runs/" in inside.runtime_env["excludes"]


def test_secrets_travel_by_name_only(in_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("QUORUM_TEST_SERVE_TOKEN", "tok-should-never-travel")
    p = plan(parse_args(["configs/policy_grpo_demo.yaml", "reward.url=http://grm:8000",
                         "reward.token_env=QUORUM_TEST_SERVE_TOKEN", "--home", str(tmp_path)]))
    assert "QUORUM_TEST_SERVE_TOKEN" in p.secrets
    assert "tok-should-never-travel" not in repr(p)
    with pytest.raises(ConfigError, match="--env.OPENAI_API_KEY: looks like a secret"):
        parse_args(["configs/demo_scores.yaml", "--env", "OPENAI_API_KEY=sk-1"])


def test_the_token_comes_from_the_environment_or_its_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc123\n")
    assert auth_headers({"RAY_AUTH_TOKEN_PATH": str(token)}) == {"Authorization": "Bearer abc123"}
    assert auth_headers({"RAY_AUTH_TOKEN": "xyz", "RAY_AUTH_TOKEN_PATH": str(token)}) == {
        "Authorization": "Bearer xyz"}
    assert auth_headers({}) == {}  # Ray's own lookup (RAY_AUTH_MODE=token: ~/.ray/auth_token)
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN_PATH"):
        auth_headers({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})


@pytest.mark.parametrize(("argv", "message"), [
    (["configs/demo_scores.yaml", "data.nope=1"], "data.nope"),
    (["configs/missing.yaml"], "no such config file"),
    (["configs/demo_scores.yaml", "--entrypoint-num-cpus", "-1"], "--entrypoint-num-cpus"),
    (["configs/demo_scores.yaml", "--bogus"], "unrecognized arguments: --bogus"),
    (["configs/demo_scores.yaml", "--working-dir", "/nonexistent-dir"], "--working-dir"),
    (["--follow"], "the following arguments are required: CONFIG.yaml"),
])
def test_bad_submissions_stop_before_anything_is_uploaded(in_repo, argv, message, capsys):
    assert cli_main(["submit", *argv, "--address", "http://127.0.0.1:1"]) == 2
    assert message in capsys.readouterr().err


def test_a_config_outside_the_working_directory_is_refused(in_repo, tmp_path):
    outside = tmp_path / "mine.yaml"
    outside.write_text((REPO / "configs" / "demo_scores.yaml").read_text())
    with pytest.raises(ConfigError, match="outside the uploaded working directory"):
        plan(parse_args([str(outside)]))
