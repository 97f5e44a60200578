"""The live probe-set accuracy monitor (monitor.probe_path): labelled pairs sent through the run's reward client
to a real HTTP service, accuracy against gold by hand, and the config key checked."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from core.config import ConfigError, load_config
from eval.monitor_config import MonitorConfig
from eval.reward_monitors import gold_preference
from train.grpo.batch import GroupOutcome
from train.grpo.monitoring import LoopMonitors, probe_verdict

REPO = Path(__file__).resolve().parents[1]


class Judge(BaseHTTPRequestHandler):
    """A judge that prefers the response containing "good" (margins +2 / -2; both "good" or neither: tie) and
    answers 503 to the prompt "down"; it records every body."""

    bodies: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Judge.bodies.append(body)
        if body["prompt"] == "down":
            self.send_response(503)
            self.end_headers()
            return
        good = ["good" in r for r in body["responses"]]
        margins = [0.0, 0.0] if good[0] == good[1] else [2.0, -2.0] if good[0] else [-2.0, 2.0]
        items = [{"index": i, "reward": m, "mean_grade": 3.0 + m / 2, "n_judgments": 2, "n_failed": 0,
                  "errors": []} for i, m in enumerate(margins)]
        data = json.dumps({"scheme": body["scheme"], "rewards": margins, "items": items, "judgments": [],
                           "counts": {"n_failed_judgments": 0}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Judge.bodies = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_probe_verdict_and_gold_by_hand():
    assert probe_verdict(GroupOutcome(rewards=[1.0, -1.0], components={"grm_margin": [1.0, -1.0]})) == "A"
    assert probe_verdict(GroupOutcome(rewards=[0.0, 0.0], components={"grm_margin": [-0.5, 0.5]})) == "B"
    assert probe_verdict(GroupOutcome(rewards=[0.0, 0.0], components={"grm_margin": [0.0, 0.0]})) == "tie"
    assert probe_verdict(GroupOutcome(rewards=None, error="timeout")) is None
    assert (gold_preference(5, 2), gold_preference(1, 4), gold_preference(3, 3)) == ("A", "B", "tie")


def test_probe_pairs_go_through_the_reward_service_and_drop_alerts(judge_url, tmp_path):
    pairs = [
        {"judge_prompt": "p1", "dimension": "tone", "locale": "en_US", "response_a": "good", "response_b": "bad",
         "gold": "A"},                                   # judge: A, right
        {"judge_prompt": "p2", "dimension": "tone", "locale": "en_US", "response_a": "meh", "response_b": "good",
         "gold": "B"},                                   # judge: B, right
        {"judge_prompt": "p3", "dimension": "tone", "locale": "en_US", "response_a": "x", "response_b": "y",
         "gold": "A"},                                   # judge: tie, wrong
        {"judge_prompt": "down", "dimension": "tone", "locale": "en_US", "response_a": "good", "response_b": "b",
         "gold": "A"},                                   # 503 after retries: counted wrong
    ]
    reward_spec = {"kind": "grm", "config": {"url": judge_url, "scheme": "listwise", "retries": 0},
                   "monitor": {"config": {"every": 1, "probe_accuracy_drop_max": 0.2},
                               "alerts_path": str(tmp_path / "alerts.jsonl"), "probe": pairs}}
    monitors = LoopMonitors.build(reward_spec, rank=0)
    assert LoopMonitors.build(reward_spec, rank=1).probe is None
    def reduce(sums: dict) -> dict:  # one worker: its sums are the totals
        return sums

    out = monitors.step(1, [], {}, reduce)
    # 2 of 4 right
    assert out["monitor/probe/accuracy"] == 0.5 and out["monitor/probe/failed"] == 1.0
    assert out["monitor/probe/pairs"] == 4.0 and out["monitor/probe/alert"] == 0.0
    # every pair went as its two responses, all_pairs in both orders, whatever reward.scheme
    assert {(b["scheme"], b["both_orders"], len(b["responses"])) for b in Judge.bodies} == {("all_pairs", True, 2)}
    assert Judge.bodies[0]["dimension"] == "tone" and Judge.bodies[0]["locale"] == "en_US"
    # the judge turns: it now prefers nothing, accuracy falls to 0 (a drop of 0.5 > 0.2) -> alert
    monitors.probe.pairs = [dict(p, response_a="x", response_b="y") for p in pairs[:2]]
    out = monitors.step(2, [], {}, reduce)
    assert out["monitor/probe/accuracy"] == 0.0 and out["monitor/probe/alert"] == 1.0
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["monitor"] for a in alerts] == ["probe"]
    monitors.probe.close()


def test_probe_keys_are_checked_under_their_name():
    from jobs.policy.grpo import Config

    with pytest.raises(ConfigError, match=re.escape("monitor.probe_path")):
        load_config(Config, REPO / "configs" / "policy_grpo_demo.yaml", ["monitor.probe_path=/no/such/probe.jsonl"])
    with pytest.raises(ConfigError, match=re.escape("monitor.probe_limit")):
        load_config(Config, REPO / "configs" / "policy_grpo_demo.yaml", ["monitor.probe_limit=0"])
    assert MonitorConfig().probe_path == ""


def test_the_demo_sends_its_probe_pairs_with_gold_to_the_workers():
    from jobs.policy.grpo import Config, probe_pairs

    cfg = load_config(Config, REPO / "configs" / "policy_grpo_demo.yaml")
    pairs = probe_pairs(cfg)
    assert len(pairs) == cfg.monitor.probe_limit == 2
    # test-01: gold 5 vs 2 -> A; the training rows' judge prompt is the user prompt (reward.send_context)
    assert pairs[0]["gold"] == "A" and pairs[0]["judge_prompt"].startswith("Wenn du eine Sache")
    assert (pairs[0]["dimension"], pairs[0]["locale"]) == ("fluency", "de_DE")
