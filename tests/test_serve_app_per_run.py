"""One reward-service app per policy-GRPO run (issue 39, item 4), on real Ray Serve with the scripted hosted judge
(tests/fake_openai_server.py: no model loads).

At 1761e29 every policy_grpo run deployed the app `grm-policy-grpo`: a second run replaced the first one's judge
without a word, and whichever ended first deleted the other's. Now the app is `serve.app_name` plus the run id,
under its own route prefix, held by the driver that deployed it: two runs run side by side and each deletes only
its own app; a second live driver of the same run id is refused (exit 2 before any work), never redeployed over.
The first two tests import nothing 1761e29 lacks, so they run against its code too, and fail there for that reason.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer

import jobs.policy.grpo as job
from core.config import ConfigError, load_config
from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "policy_grpo_demo.yaml"
GRADES = "<final_grade_a>FINAL GRADE: 5 - EXCELLENT</final_grade_a> <final_grade_b>FINAL GRADE: 2 - POOR" \
         "</final_grade_b>"

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_port(ray_local) -> int:
    """The module's one Serve instance, on one port: the first test's deployment starts it (`serve.start` in
    `start_grm`), the later tests' deploy into it as a second run's driver would (starting Serve is ~10 s a test).
    Each test still deploys, checks and deletes its own apps, and checks that they are gone."""
    from ray import serve

    serve.shutdown()  # a Serve instance of an earlier module keeps its own HTTP options
    yield free_port()
    serve.shutdown()


@pytest.fixture
def serve_on(serve_port):
    from ray import serve

    # what an earlier test of the module deployed, it deleted (its last assertion): no app is left over
    assert not serve.status().applications
    return serve


def config(tmp_path, judge: FakeOpenAIServer, run_id: str, port: int):
    cfg = load_config(job.Config, DEMO, [f"run.root={tmp_path}", f"run.id={run_id}"])
    cfg.grm.overrides = [*cfg.grm.overrides, f"serve.port={port}", "serve.auth_token_env=", "judge.engine.kind=openai",
                         f"judge.engine.base_url={judge.base_url}", "judge.engine.model=scripted-judge",
                         "resources.num_cpus=0", "health.probe=false",
                         # a stopping replica (serve delete, the replaced app) checks for ongoing requests every
                         # 0.25 s instead of 2 s: the scripted judge leaves none, so each delete ends ~2 s sooner
                         "shutdown.wait_loop_s=0.25"]
    return cfg


def score(spec: dict) -> list[float] | None:
    from train.grpo.reward.build import GRMGroupReward
    from train.grpo.reward.client import RewardServiceConfig

    reward = GRMGroupReward(RewardServiceConfig(**spec["config"]))
    try:
        (outcome,) = reward([{"judge_prompt": "p", "dimension": "tone", "locale": "de_DE"}], [["a", "b"]])
    finally:
        reward.close()
    return outcome.rewards


def test_two_runs_keep_their_own_apps_and_each_deletes_only_its_own(serve_on, serve_port, tmp_path):
    port = serve_port
    with FakeOpenAIServer(reply=lambda message: GRADES) as judge:
        first, second = config(tmp_path, judge, "run-a", port), config(tmp_path, judge, "run-b", port)
        with job.served_reward(first) as (spec_a, _):
            app_a = spec_a["config"]["app"]
            with job.served_reward(second) as (spec_b, _):
                app_b = spec_b["config"]["app"]
                assert app_a != app_b, "two runs must not share one Serve app"
                assert (app_a, app_b) == ("grm-policy-grpo-run-a", "grm-policy-grpo-run-b")  # app_name + run id
                apps = serve_on.status().applications
                assert apps[app_a].status == apps[app_b].status == "RUNNING"
                assert spec_a["config"]["url"].endswith(f":{port}/grm/{app_a}")
                assert score(spec_b) == [5.0, 2.0]
            # the second run ended: its app is gone, the first run's still serves
            apps = serve_on.status().applications
            assert app_b not in apps and apps[app_a].status == "RUNNING"
            assert score(spec_a) == [5.0, 2.0]
        assert app_a not in serve_on.status().applications


def test_a_second_live_driver_of_the_same_run_is_refused_not_redeployed(serve_on, serve_port, tmp_path):
    port = serve_port
    with FakeOpenAIServer(reply=lambda message: GRADES) as judge:
        cfg = config(tmp_path, judge, "same", port)
        with job.served_reward(cfg) as (spec, _):
            app = spec["config"]["app"]
            deployed = serve_on.status().applications[app].last_deployed_time_s
            with pytest.raises(ConfigError, match=rf"run\.id: the Serve app '{app}' of this run id is held by a "
                                                  "running job"), job.served_reward(cfg):
                pass
            # untouched: not redeployed, still serving
            status = serve_on.status().applications[app]
            assert status.status == "RUNNING" and status.last_deployed_time_s == deployed
            assert score(spec) == [5.0, 2.0]
            # the job itself refuses before any work: exit 2, no run directory
            code = cli_main(["run", str(DEMO), f"run.root={tmp_path / 'second'}", "run.id=same",
                             f"grm.overrides={json.dumps(cfg.grm.overrides)}"])
            assert code == 2 and not (tmp_path / "second").exists()
        assert app not in serve_on.status().applications


def test_an_app_a_stopped_driver_left_is_replaced(serve_on, serve_port, tmp_path):
    """No live driver holds it (the one that deployed it is gone): the run of that id takes it over."""
    from jobs.serve_grm import claim_app, release_app

    app = "grm-policy-grpo-left"
    with FakeOpenAIServer(reply=lambda message: GRADES) as judge:
        cfg = config(tmp_path, judge, "left", serve_port)
        owner = claim_app(app)
        job.start_grm(cfg.serve_config(), app, 120)  # deployed by a driver ...
        release_app(owner)  # ... that went away without deleting it
        assert serve_on.status().applications[app].status == "RUNNING"
        with job.served_reward(cfg) as (spec, _):
            assert spec["config"]["app"] == app and score(spec) == [5.0, 2.0]
        assert app not in serve_on.status().applications
