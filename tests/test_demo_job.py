"""The main job end to end on real Ray with a tiny model: outputs, W&B offline files, secrets, resume speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from jobs.cli import main as cli_main
from tests.fake_openai_server import FakeOpenAIServer
from tests.wandb_reader import find_run_files, read_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-quorum-test-5f3b9c2a7d"


def tiny_overrides(model_dir: str, root: Path, server_url: str) -> list[str]:
    """The demo config, shrunk: tiny model everywhere, 4 sources, short outputs, plus a hosted-API judge."""
    overrides = [f"run.root={root}", "wandb.mode=offline", "data.limit=4"]
    for i in range(2):
        overrides += [f"generate.{i}.engine.model={model_dir}", f"generate.{i}.sampling.max_tokens=8",
                      f"generate.{i}.pool.num_cpus=0.5"]
        overrides += [f"jury.judges.{i}.engine.model={model_dir}", f"jury.judges.{i}.sampling.max_tokens=6",
                      f"jury.judges.{i}.pool.num_cpus=0.5", f"jury.judges.{i}.max_parse_retries=0"]
    # a third judge behind an OpenAI-compatible endpoint whose key lives only in the environment
    overrides.append(
        "jury.judges=[{name: judge-greedy, engine: {kind: hf, model: %s, num_threads: 1}, "
        "sampling: {max_tokens: 6}, pool: {num_cpus: 0.5, batch_size: 16}, max_parse_retries: 0}, "
        "{name: judge-api, engine: {kind: openai, model: remote-judge, base_url: '%s', "
        "api_key_env: QUORUM_TEST_JUDGE_KEY, max_concurrency: 4}, sampling: {max_tokens: 6}, "
        "pool: {num_cpus: 0.25, batch_size: 16}, max_parse_retries: 1}]" % (model_dir, server_url))
    return overrides


def test_demo_job_end_to_end_then_resumes_fast(ray_local, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("QUORUM_TEST_JUDGE_KEY", SECRET)
    with FakeOpenAIServer(api_key=SECRET) as server:
        args = ["run", str(REPO / "configs" / "demo.yaml"), *tiny_overrides(tiny_model_dir, tmp_path, server.base_url)]
        started = time.time()
        assert cli_main(args) == 0
        first = time.time() - started
        assert server.calls, "the hosted judge was never asked"
        assert all(c.headers.get("authorization") == f"Bearer {SECRET}" for c in server.calls)

    run_dir = tmp_path / "policy_simplify" / "demo"
    manifest = (run_dir / "manifest.json").read_text()
    for stage in ("sources", "generate", "jury"):
        assert (run_dir / stage).is_dir()
    candidates = pd.read_parquet(run_dir / "generate")
    judgments = pd.read_parquet(run_dir / "jury")
    assert len(candidates) == 4 * 2 * 2  # sources x policies x generators
    usable = int((candidates["generation_error"] == "").sum())
    assert len(judgments) == usable * 2  # every usable candidate judged by both judges, none dropped
    # the echo server never answers "Answer: [k]": its judgments are kept, retried once, and counted
    api = judgments[judgments["judge"] == "judge-api"]
    assert (api["parse_error"] != "").all() and (api["attempts"] == 2).all()
    summary = (run_dir / "summary.md").read_text()
    assert "lexical" in summary and "smollm2-greedy" in summary and "jury_mean" in summary

    # W&B offline files hold the resolved config and the stage summaries
    wandb_runs = find_run_files(run_dir)
    assert wandb_runs
    logged = read_run(wandb_runs[-1])
    assert logged["config"]["data"]["limit"] == 4
    assert logged["summary"]["generate/rows_out"] == 16
    assert "jury/parse_failures" in logged["summary"]

    # the key was used, but it is nowhere in what the run wrote: config, manifest, logs, W&B
    assert "QUORUM_TEST_JUDGE_KEY" in (run_dir / "config.yaml").read_text()
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"secret leaked into {path}"
    assert SECRET not in manifest

    started = time.time()
    assert cli_main(args) == 0  # same config: the (now closed) endpoint must not be needed
    second = time.time() - started

    stages = json.loads((run_dir / "manifest.json").read_text())["stages"]
    assert all(s["status"] == "complete" for s in stages.values())
    assert second < 0.1 * first, f"resumed run took {second:.1f}s vs first {first:.1f}s"
