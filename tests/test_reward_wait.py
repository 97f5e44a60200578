"""A slow judge masks one step, it does not fail the worker group (issue 39, item 3).

While one worker waits for its groups' rewards the others sit in the step's next collective; past Ray Train's
collective timeout (`TorchConfig.timeout_s`, 1800 s by default in Ray 2.60: ray/train/torch/config.py) that
collective fails the whole group, which restarts from its last checkpoint, and `max_failed_steps` never applies.
The worst reward wait is now checked against `grpo.collective_timeout_s` when the config loads, and the timeout Ray
Train uses is that key. At 1761e29 `configs/policy_grpo_cluster.yaml` waited up to 2,438.5 s against Ray's 1,800 s.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

import jobs.policy.grpo as job
from core.config import ConfigError, load_config
from jobs.cli import main as cli_main
from train.grpo.reward.client import GroupRewardClient, RewardServiceConfig, TransportFailure

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "configs" / "policy_grpo_cluster.yaml"


def without_timeout_key(tmp_path: Path) -> Path:
    """configs/policy_grpo_cluster.yaml without `grpo.collective_timeout_s`: its reward settings as at 1761e29."""
    data = yaml.safe_load(CLUSTER.read_text())
    data["grpo"].pop("collective_timeout_s", None)
    path = tmp_path / "policy_grpo_cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_cluster_config_s_old_reward_wait_is_refused_with_the_numbers(tmp_path, capsys):
    with pytest.raises(ConfigError) as err:
        load_config(job.Config, without_timeout_key(tmp_path))
    assert ("reward.timeout_s: in the training step, a worker can wait 2438.5 s on the reward service (its 4 groups "
            "(grpo.prompts_per_worker): 1 round of up to 32 requests (reward.concurrency) x 2438.5 s, each 4 attempts x "
            "reward.timeout_s 600 s + back-offs of up to 38.5 s), not less than grpo.collective_timeout_s (1800 s)"
            in str(err.value))
    assert "raise grpo.collective_timeout_s above 2438.5" in str(err.value)
    # `quorum run` stops with exit 2 before any work
    root = tmp_path / "runs"
    assert cli_main(["run", str(without_timeout_key(tmp_path)), f"run.root={root}", "ray.shared_storage="]) == 2
    assert "grpo.collective_timeout_s (1800 s)" in capsys.readouterr().err and not root.exists()
    # as shipped: the timeout is above the wait
    cfg = load_config(job.Config, CLUSTER)
    assert cfg.reward.worst_wait_s() == 2438.5 < cfg.grpo.collective_timeout_s


def test_rounds_of_groups_beyond_the_concurrency_add_up():
    # 4 prompts per worker, 2 groups in flight: two rounds of one group's worst wait
    assert load_config(job.Config, CLUSTER).grpo.prompts_per_worker == 4
    with pytest.raises(ConfigError,
                       match=r"training step, a worker can wait 4877 s .*2 rounds of up to 2 requests \(reward.concurrency\)"):
        load_config(job.Config, CLUSTER, ["reward.concurrency=2", "grpo.collective_timeout_s=4877"])
    # (without the probe, whose 32 pairs would be 16 rounds at 2 in flight: tests/test_reward_wait_phases.py)
    assert load_config(job.Config, CLUSTER, ["reward.concurrency=2", "grpo.collective_timeout_s=4878",
                                             "monitor.probe_path="])


def test_the_worst_wait_is_the_client_s_own_retry_loop_at_its_longest():
    """The client against a service that never answers (every attempt runs to its deadline, on a clock the test
    moves): the time it takes never exceeds worst_wait_s, and with the jitter at its top reaches it."""
    cfg = RewardServiceConfig(url="http://judge.invalid", timeout_s=600, retries=3, backoff_s=5, backoff_max_s=12)
    clock = [0.0]

    class Silent:  # the world's edge: a service whose every attempt times out
        def post(self, body):
            clock[0] += cfg.timeout_s
            raise TransportFailure("timeout")

        def close(self):
            pass

    def sleep(seconds):
        clock[0] += seconds

    client = GroupRewardClient(cfg, sleep=sleep, transport=Silent())
    outcome = client.score("p", ["a", "b"])
    assert outcome.error == "timeout" and outcome.attempts == 4
    # back-offs 5, 10, then 20 capped at 12; each plus up to 10% jitter
    assert 4 * 600 + 5 + 10 + 12 <= clock[0] <= cfg.worst_wait_s() == 4 * 600 + (5 + 10 + 12) * 1.1

    class TopJitter(random.Random):
        def random(self):
            return 1.0

    clock[0] = 0.0
    client._rng = TopJitter()
    client.score("p", ["a", "b"])
    assert clock[0] == pytest.approx(cfg.worst_wait_s())


def test_ray_train_uses_the_configured_collective_timeout(tmp_path):
    from ray.train.torch import TorchConfig

    from train.config import GRPOConfig
    from train.trainer import build_trainer

    assert GRPOConfig().collective_timeout_s == TorchConfig().timeout_s  # Ray's own default unless set
    trainer = build_trainer(GRPOConfig(collective_timeout_s=3000), {}, str(tmp_path), lambda config: None)
    assert trainer.backend_config.timeout_s == 3000
    with pytest.raises(ConfigError, match="grpo.collective_timeout_s"):
        load_config(job.Config, CLUSTER, ["grpo.collective_timeout_s=0"])
