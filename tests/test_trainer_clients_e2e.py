"""quorum_clients installed with pip into each trainer's own environment and called there through the trainer's own
code path (clients/build_trainer_envs.sh builds the environments under ~/.cache/quorum/trainers; a test whose
environment is absent skips, saying which command builds it):

- TRL 1.16: a GRPOTrainer run on 2 CPU processes (`accelerate launch`) against a live `quorum serve`; every prompt's
  group is judged whole (the service's record: one group per prompt with all its completions, also for the group
  that straddles the two processes) and the rewards land on their rows; with the judge down, training stops within
  the fail-fast window naming the service's error.
- OpenRLHF 0.11.2: its SingleTurnAgentExecutor and samples generator with the reward_func file, the service
  answering 401, 503 or nothing: the step gets the fallback reward and a counted failure, no TypeError.
- verl 0.9.1: a group scheme through QuorumRewardManager as verl resolves it, on data shaped like verl's RLHF example.

The service is tests/test_trainer_rewards.py's (`quorum serve` with a scripted judge, real HTTP); the failure modes
come from tests/reward_stub.py, at the world's edge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from quorum_clients.text import prompt_text, response_text

from tests.test_serve_app import free_port
from tests.test_trainer_rewards import CONTEXT, caller_stats, scripted_service

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENVS = Path(os.environ.get("QUORUM_TRAINER_ENVS", Path.home() / ".cache/quorum/trainers"))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with scripted_service(tmp_path_factory) as running:
        yield running


def trainer_env(name: str) -> Path:
    bin_dir = ENVS / name / "bin"
    if not (bin_dir / "python").exists():
        pytest.skip(f"the {name} environment is not built: bash clients/build_trainer_envs.sh {name}")
    return bin_dir


def run_in(bin_dir: Path, args: list[str], timeout: float, **env) -> subprocess.CompletedProcess:
    """A command of the trainer's environment, with none of quorum on its path (PYTHONPATH cleared)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ.update(PATH=f"{bin_dir}:{environ.get('PATH', '')}", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   **env)
    return subprocess.run(args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout, check=False)


class StubProcess:
    """tests/reward_stub.py in a process of its own (the trainer's processes reach it over HTTP)."""

    def __init__(self, mode: str):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests/reward_stub.py"), str(self.port), mode],
                                     stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def rejudge(service, prompt, completions) -> list[float | None]:
    """The scripted judge is deterministic and the service caches nothing: the same group judged again, by no
    caller, gives the rewards the trainer's call got for it (own grade)."""
    body = {"prompt": prompt_text(prompt), "responses": [response_text(c) for c in completions], "scheme": "all_pairs",
            **CONTEXT}
    out = httpx.post(f"{service.url}/reward/group", json=body, timeout=120).json()
    return [item["mean_grade"] for item in out["items"]]


# ---------------------------------------------------------------------------------------------------------------
# TRL


TRL_LAUNCH = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "tests/trainer_envs/trl_grpo.py"]


def read_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for rank in (0, 1) for line in (out / f"rows-{rank}.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["step"], r["rank"], r["row"]))  # the global batch's order


def test_trl_two_processes_judge_whole_groups_and_rewards_land_on_their_rows(service, tiny_model_dir, tmp_path):
    bin_dir = trainer_env("trl")
    run = run_in(bin_dir, [*TRL_LAUNCH, service.url, tiny_model_dir, str(tmp_path), "2"], timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    rows = read_rows(tmp_path)
    assert len(rows) == 12 and {r["rank"] for r in rows} == {0, 1}  # 2 steps x 2 processes x 3 rows
    record = caller_stats(service, "trl-2proc")["record"]
    for step in (0, 1):
        mine = [r for r in rows if r["step"] == step]
        groups = [mine[k:k + 2] for k in range(0, 6, 2)]
        # TRL's sampler: rows 2 and 3 of the global batch (process 0's last, process 1's first) are one prompt's
        assert groups[1][0]["rank"] == 0 and groups[1][1]["rank"] == 1
        assert all(g[0]["prompt"] == g[1]["prompt"] for g in groups)
        recorded = sorted(tuple(g["rewards"]) for g in record if g["step"] == step)
        # one request per group, holding all its completions: 3 groups of 2, each with both rewards
        assert recorded == sorted(tuple(r["reward"] for r in g) for g in groups)
        for group in groups:
            assert [r["reward"] for r in group] == rejudge(service, group[0]["prompt"], [r["completion"] for r in group])


def test_trl_with_the_judge_down_stops_within_the_window_naming_the_error(tiny_model_dir, tmp_path):
    bin_dir = trainer_env("trl")
    with StubProcess("503") as stub:
        run = run_in(bin_dir, [*TRL_LAUNCH, stub.url, tiny_model_dir, str(tmp_path), "6"], timeout=1200)
    assert run.returncode != 0
    assert "RewardServiceFailure" in run.stderr and "over the last 2 calls" in run.stderr, run.stderr[-5000:]
    assert "http_503: judge engine unavailable: no replica is ready" in run.stderr
    # the window is 2 calls: the first call's rows came back (as None), the second raised on both processes
    rows = read_rows(tmp_path)
    assert {r["step"] for r in rows} == {0} and all(r["reward"] is None for r in rows) and len(rows) == 6


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF


@pytest.mark.parametrize("mode", ["401", "503", "timeout"])
def test_openrlhf_executor_completes_the_step_with_the_fallback(mode, smollm2_dir):
    bin_dir = trainer_env("openrlhf")
    with StubProcess(mode) as stub:
        run = run_in(bin_dir, ["python", "tests/trainer_envs/openrlhf_executor.py", smollm2_dir], timeout=600,
                     QUORUM_REWARD_URL=f"{stub.url}/openrlhf?retries=1&backoff_s=0.1&timeout_s=2&caller=orl")
    assert run.returncode == 0, run.stderr[-5000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["reward"] == [[3.0], [3.0]] and out["rewards"] == [3.0, 3.0]  # "neutral": the middle of 1-5 grades
    assert out["extra_logs"] == [{"quorum_failed": [1.0]}] * 2 and out["failed"] == [[1.0], [1.0]]
    assert "TypeError" not in run.stderr
    expected = {"401": "answered 401 (missing or wrong bearer token)", "503": "http_503: judge engine unavailable",
                "timeout": "timeout: no answer"}[mode]
    assert expected in run.stderr


def test_openrlhf_executor_gets_the_live_services_reward(service, smollm2_dir):
    """The control: the same path against the live service moves the reward off the fallback."""
    bin_dir = trainer_env("openrlhf")
    run = run_in(bin_dir, ["python", "tests/trainer_envs/openrlhf_executor.py", smollm2_dir], timeout=600,
                 QUORUM_REWARD_URL=f"{service.url}/openrlhf?caller=orl-live&dimension=fluency&locale=en_US")
    assert run.returncode == 0, run.stderr[-5000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    expected = float(min(5, 1 + len(["Rivers", "carry", "water", "from", "the", "hills", "down", "to", "the", "sea", "every", "single", "day."]) // 3))
    assert out["rewards"] == [expected, expected] and out["failed"] == [[0.0], [0.0]]
    assert caller_stats(service, "orl-live")["rollouts"] == 2


def test_openrlhf_control_a_reward_func_that_raises_breaks_the_batch(smollm2_dir):
    """What the file prevents, through the same code: a reward_func that raises (as it did on a failed request)
    leaves the rollout's reward None, and OpenRLHF's batching of the step dies with a TypeError."""
    bin_dir = trainer_env("openrlhf")
    with StubProcess("ok") as stub:
        run = run_in(bin_dir, ["python", "tests/trainer_envs/openrlhf_executor.py", smollm2_dir, "--control"],
                     timeout=600, QUORUM_REWARD_URL=stub.url)
    assert run.returncode != 0 and "TypeError: expected Tensor as element 1" in run.stderr, run.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# verl


@pytest.mark.parametrize("paths", ["pkg", "files"])
def test_verl_group_scheme_through_the_manager_verl_resolves(paths, service, smollm2_dir, tmp_path):
    """verl resolves the manager and the function by name from `pkg://` modules, or from the installed package's
    files given by path (spec_from_file_location: they import only the installed quorum_clients)."""
    import pandas as pd

    bin_dir = trainer_env("verl")
    # examples/data_preprocess/full_hh_rlhf.py's rows
    questions = ["Describe a river.", "Describe a lantern.", "Describe a harbor."]
    pd.DataFrame([{"data_source": "Dahoas/full-hh-rlhf", "prompt": [{"role": "user", "content": q}],
                   "ability": "alignment", "reward_model": {"style": "model", "ground_truth": "unused"},
                   "extra_info": {"split": "train", "index": i}} for i, q in enumerate(questions)]
                 ).to_parquet(tmp_path / "train.parquet")
    run = run_in(bin_dir, ["python", "tests/trainer_envs/verl_manager.py", service.url, smollm2_dir,
                           str(tmp_path / "train.parquet"), *(["--file-paths"] if paths == "files" else [])],
                 timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    lines = [json.loads(line) for line in run.stdout.strip().splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert summary["manager"] == summary["worker_manager"] == "QuorumRewardManager"
    assert len(rows) == 6 and summary["rm_scores"] == [r["reward"] for r in rows]
    by_uid: dict[str, list] = {}
    for row in rows:
        by_uid.setdefault(row["uid"], []).append(row)
    assert sorted(len(g) for g in by_uid.values()) == [2, 2, 2]
    record = caller_stats(service, "verl-group-files" if paths == "files" else "verl-group")["record"]
    # one request per group with both rollouts (in the order they reached the manager, hence sorted here)
    assert sorted(tuple(sorted(g["rewards"])) for g in record) == sorted(tuple(sorted(r["reward"] for r in g))
                                                                         for g in by_uid.values())
    for group in by_uid.values():
        assert [r["extra"]["quorum_failed"] for r in group] == [0.0, 0.0]
        assert [r["reward"] for r in group] == rejudge(service, group[0]["prompt"], [r["response"] for r in group])
        assert group[0]["reward"] < group[1]["reward"]  # the longer answer wins under the scripted judge
