"""The main job end to end on real Ray with a tiny model: a driver SIGKILLed mid-job (with its own local cluster), then
the run finished from its manifest; outputs, W&B offline files, secrets in no file the run or either Ray cluster
wrote, resume speed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from jobs.cli import main as cli_main
from tests.fake_openai_server import FakeOpenAIServer
from tests.wandb_reader import find_run_files, read_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-quorum-test-5f3b9c2a7d"
WANDB_KEY = "wandbkey0123456789abcdef0123456789abcdef"


def scripted_judge(prompt: str) -> str | None:
    """The hosted judge follows the output formats (a tiny random model never does), so pairs get made."""
    if prompt.startswith("Source sentence:"):  # judge_policy: best/worst per aspect
        return "\n".join(f"Aspect: {aspect}, Best: 0, Worst: 1" for aspect in ("Lexical", "Structural", "Overall"))
    if prompt.startswith("[Original Sentence]"):  # jury_pairwise: A graded above B
        return ("<think>A is plainer.</think><final_grade_A> FINAL GRADE: 4 - GOOD </final_grade_A>"
                "<final_grade_B> FINAL GRADE: 2 - POOR </final_grade_B>")
    return None


def tiny_overrides(model_dir: str, root: Path, server_url: str, turk_dir: Path) -> list[str]:
    """The demo config, shrunk: tiny model everywhere, 4 sources, 3 eval sentences, 1 training step, plus a
    hosted-API judge whose key lives only in the environment."""
    overrides = [f"run.root={root}", "wandb.mode=offline", "data.limit=4", "pairs.dev_fraction=0.0",
                 "features.align.enabled=true"]
    for i in range(4):
        overrides += [f"generate.{i}.engine.model={model_dir}", f"generate.{i}.engine.num_threads=1",
                      f"generate.{i}.sampling.max_tokens=8", f"generate.{i}.pool.num_cpus=0.5"]
    api = (f"engine: {{kind: openai, model: remote-judge, base_url: '{server_url}', "
           "api_key_env: QUORUM_TEST_JUDGE_KEY, max_concurrency: 4, structured_outputs: true}, "
           "pool: {num_cpus: 0.25, batch_size: 16}, max_parse_retries: 1")
    local = f"engine: {{kind: hf, model: {model_dir}, num_threads: 1}}, pool: {{num_cpus: 0.5, batch_size: 16}}"
    overrides.append(f"jury.judges=[{{name: judge-tiny, template: judge_policy_brief, format: best_worst, {local}, "
                     "sampling: {max_tokens: 48}, max_parse_retries: 0}, "
                     "{name: judge-api, template: judge_policy_brief, "
                     f"format: best_worst, {api}}}]")
    # one training worker: 2-worker ZeRO-2 is tests/test_train_ray.py's; here the stage's wiring is what is tested
    overrides += [f"train.trainer.model={model_dir}", "train.trainer.num_workers=1", "train.trainer.max_steps=1",
                  "train.trainer.micro_batch_size=1",
                  "train.trainer.checkpoint_every=1", "train.trainer.lora.r=4", "train.trainer.lora.alpha=8",
                  "train.trainer.max_prompt_length=48", "train.trainer.max_completion_length=16"]
    overrides += [f"evaluate.path={turk_dir}", "evaluate.limit=3", f"evaluate.engine.model={model_dir}",
                  "evaluate.sampling.max_tokens=8", "evaluate.pool.num_cpus=0.5", "evaluate.n_boot=100",
                  "evaluate.rejudge_limit=3",
                  # paper 000's GPT-4o row: a baseline system with its own (hosted) engine
                  f"evaluate.extra_systems=[{{name: api-baseline, {api.split(', pool:')[0]}, pool: {{num_cpus: 0.25}}}}]",
                  f"evaluate.rejudge=[{{name: judge-api, template: jury_pairwise, format: pairwise, {api}}}]"]
    return overrides


def stages_of(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "manifest.json").read_text()).get("stages", {})
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or caught mid-rename
        return {}


def kill_driver_during(stage: str, args: list[str], run_dir: Path, log: Path, ray_tmp: Path) -> dict:
    """Run the job as `quorum run` does, in its own process with its own local Ray cluster (under `ray_tmp`), and
    SIGKILL the driver once `stage` is running: no handler, no cleanup, what a lost head node or an OOM kill does;
    the cluster goes with it (Ray's kernel fate-sharing). Returns the manifest as the driver left it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(ray_tmp), "WANDB_MODE": "offline"}
    env.pop("RAY_ADDRESS", None)
    with log.open("w") as out:
        # W&B off here: a SIGKILLed W&B run leaves a truncated offline file; the resumed run below logs with the key set
        driver = subprocess.Popen([sys.executable, "-m", "jobs.cli", *args, "wandb.enabled=false"], cwd=REPO,
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 300
            while stages_of(run_dir).get(stage, {}).get("status") != "running":
                assert driver.poll() is None, f"the driver exited ({driver.returncode}):\n{log.read_text()[-3000:]}"
                assert time.time() < deadline, f"stage {stage} never started:\n{log.read_text()[-3000:]}"
                time.sleep(0.1)
            driver.send_signal(signal.SIGKILL)
        finally:
            driver.kill()
            driver.wait(timeout=60)
    deadline = time.time() + 60  # its cluster's processes (raylet, GCS, the actors) die with it: no orphans
    while left := [p for p in psutil.process_iter(["cmdline"]) if str(ray_tmp) in " ".join(p.info["cmdline"] or [])]:
        assert time.time() < deadline, f"processes of the killed driver's cluster left: {left}"
        time.sleep(0.1)
    return stages_of(run_dir)


def files_holding(secrets: list[str], *roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and not path.is_socket():
                data = path.read_bytes()
                found += [f"{path}: {secret[:6]}..." for secret in secrets if secret.encode() in data]
    return found


def test_demo_job_killed_driver_then_resumed_end_to_end_then_resumes_fast(ray_local, tiny_model_dir, shared_data,
                                                                           tmp_path, monkeypatch):
    monkeypatch.setenv("QUORUM_TEST_JUDGE_KEY", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)  # W&B offline still sees a key: it must not write it anywhere
    run_dir = tmp_path / "policy_simplify" / "demo"
    ray_tmp = Path(tempfile.mkdtemp(prefix="qd", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    with FakeOpenAIServer(api_key=SECRET, reply=scripted_judge) as server:
        args = ["run", str(REPO / "configs" / "demo.yaml"),
                *tiny_overrides(tiny_model_dir, tmp_path, server.base_url, shared_data / "turkcorpus")]
        killed = kill_driver_during("jury", args, run_dir, tmp_path / "killed-driver.log", ray_tmp)
        # the killed driver's finished stages are on record; the interrupted one never looks finished
        assert {name: s["status"] for name, s in killed.items()} == {
            "sources": "complete", "generate": "complete", "features": "complete", "jury": "running"}
        assert not (run_dir / "jury").exists()
        assert "finished_at" not in json.loads((run_dir / "manifest.json").read_text())

        started = time.time()
        assert cli_main(args) == 0  # the same command again finishes the run
        first = time.time() - started
        assert server.calls, "the hosted judge was never asked"
        assert all(c.headers.get("authorization") == f"Bearer {SECRET}" for c in server.calls)

    resumed = stages_of(run_dir)
    for name in ("sources", "generate", "features"):  # reused, not redone
        assert resumed[name]["finished_at"] == killed[name]["finished_at"], name
    assert resumed["jury"]["status"] == "complete"  # redone whole from its input
    assert not list(run_dir.glob(".*.tmp-*")), "the killed attempt's partial output was left behind"
    manifest = (run_dir / "manifest.json").read_text()
    for stage in ("sources", "generate", "features", "jury", "judge_signal", "pairs", "train", "eval_set",
                  "eval_generate", "rejudge", "results"):
        assert (run_dir / stage).is_dir(), stage
    candidates = pd.read_parquet(run_dir / "generate")
    assert len(candidates) == 4 * 2 * 4  # sources x policies x generators
    features = pd.read_parquet(run_dir / "features")
    usable = features[features["generation_error"] == ""]
    assert (usable["alignment_json"] != "").all()
    judgments = pd.read_parquet(run_dir / "jury")
    sets = usable.groupby(["id", "policy"]).ngroups
    assert len(judgments) == sets * 2  # every candidate set judged by both judges, none dropped or duplicated
    assert not judgments.duplicated(["id", "policy", "judge"]).any()
    assert len(candidates) == 32 and not candidates.duplicated(["id", "policy", "model"]).any()
    # a tiny random model never writes the format by itself; decoded under the best/worst grammar (on by default) every
    # verdict parses, and the constraint is in the cached request; the hosted judge writes it anyway
    tiny = judgments[judgments["judge"] == "judge-tiny"]
    assert (tiny["parse_error"] == "").all() and (tiny["finish_reason"] == "stop").all()
    assert all("Aspect: Lexical" in json.loads(s)["grammar"] for s in tiny["sampling_json"])
    assert (judgments.loc[judgments["judge"] == "judge-api", "parse_error"] == "").all()
    assert all(c.body["structured_outputs"]["grammar"] for c in server.calls if "Source sentence" in str(c.body))

    pairs = pd.read_parquet(run_dir / "pairs")
    assert len(pairs) > 0 and set(pairs["policy"]) <= {"lexical", "overall"}
    assert (pairs["chosen"] != pairs["rejected"]).all()
    adapter = run_dir / "train" / "run" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    outputs = pd.read_parquet(run_dir / "eval_generate")
    assert sorted(outputs["model"].unique()) == ["api-baseline", "trained", "vanilla"] and len(outputs) == 3 * 3
    results = pd.read_parquet(run_dir / "results").set_index("system")
    assert set(results.index) == {"vanilla", "trained", "api-baseline"}
    for system in results.index:
        row = results.loc[system]
        assert row["sari_lo"] <= row["sari"] <= row["sari_hi"] and row["n"] == 3
    # 3 re-judged sources x 3 system pairs x both orders; the scripted judge grades position A higher, so in each
    # pair each system wins once
    assert len(pd.read_parquet(run_dir / "rejudge")) == 3 * 3 * 2
    assert results.loc["trained", "vs_vanilla_win_rate"] == pytest.approx(0.5)
    assert results.loc["api-baseline", "vs_vanilla_win_rate"] == pytest.approx(0.5)
    summary = (run_dir / "summary.md").read_text()
    signal = pd.read_parquet(run_dir / "judge_signal")  # the demo references rank the candidates
    assert len(signal) == sets and signal["chance_best"].notna().any()
    for title in ("paper 000 Table 3", "Judge signal", "Oracle Table 3", "vanilla vs trained", "Cost per stage"):
        assert title in summary

    # W&B offline files hold the resolved config and the stage summaries
    runs = [read_run(path) for path in find_run_files(run_dir)]
    # both in the run directory's wandb/, where `wandb sync` (as W&B printed it) finds them: the trainer's used to
    # be written under the training stage's temporary folder, renamed when the stage finished
    assert {path.parents[1] for path in find_run_files(run_dir)} == {run_dir / "wandb"}
    # the job's run, and the trainer's rank-0 run under train/
    assert len(runs) == 2 and any("loss" in row for r in runs for row in r["history"])
    logged = next(r for r in runs if "data" in r["config"])
    assert logged["config"]["data"]["limit"] == 4
    assert logged["summary"]["generate/rows_out"] == 32
    assert "jury/parse_failures" in logged["summary"] and "train/loss" in logged["summary"]
    assert "judge_signal/lexical_best_agreement" in logged["summary"]

    # the keys were used, but they are nowhere in what the run wrote (config, manifest, logs, W&B files) nor in
    # anything the killed driver's own Ray cluster wrote (session logs, runtime_env_agent.log)
    assert "QUORUM_TEST_JUDGE_KEY" in (run_dir / "config.yaml").read_text()
    assert list(ray_tmp.rglob("runtime_env_agent.log")), "no Ray session was written where expected"
    assert files_holding([SECRET, WANDB_KEY], run_dir, ray_tmp, tmp_path / "killed-driver.log") == []
    assert SECRET not in manifest
    shutil.rmtree(ray_tmp, ignore_errors=True)

    started = time.time()
    assert cli_main(args) == 0  # same config: the (now closed) endpoint must not be needed
    second = time.time() - started

    stages = json.loads((run_dir / "manifest.json").read_text())["stages"]
    assert all(s["status"] == "complete" for s in stages.values())
    assert second < 0.1 * first, f"resumed run took {second:.1f}s vs first {first:.1f}s"
