"""A validation pass and the probe wait on the judge too, not only the training step (issue 39, item 3 follow-up).

`tests/test_reward_wait.py` checks one training step's rewards against `grpo.collective_timeout_s`. A validation
pass sends each worker's shard of the val prompts (`train.grpo.validate`) and rank 0 alone judges the probe pairs
(`train.grpo.monitoring.ProbeSet`), each while the other ranks may sit in a collective; `train.grpo.reward.wait`
counts their requests, and policy GRPO refuses a phase whose worst wait is not below the collective timeout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import jobs.policy.grpo as job
from core.config import ConfigError, load_config
from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "configs" / "policy_grpo_cluster.yaml"
DEMO = REPO / "configs" / "policy_grpo_demo.yaml"
TRAIN_DATA = REPO / "configs" / "data" / "menlo_grpo_train.jsonl"


def with_val_prompts(tmp_path: Path, n: int) -> Path:
    """The bundled training pairs plus `n` val pairs of distinct prompts."""
    rows = [json.loads(line) for line in TRAIN_DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    template = next(r for r in rows if r["split"] == "train")
    rows = [r for r in rows if r["split"] != "val"]
    rows += [template | {"pair_id": f"val-{i}", "split": "val", "prompt": f"{template['prompt']} ({i})"}
             for i in range(n)]
    path = tmp_path / "menlo.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def refusal(config: Path, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(job.Config, config, overrides)
    return str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# Validation


def test_a_validation_pass_that_outlasts_the_collective_is_refused_though_the_step_fits(tmp_path, capsys):
    """The cluster config (8 workers x 4 prompts, 8 in flight, 2,438.5 s a request, 3,000 s timeout) with 100 val
    prompts and val_metric reward: each worker's 13 requests go 4, 4, 4, 1 with no collective between the chunks
    (vLLM rollouts meet only at the pass's start), 4 rounds = 9,754 s; the step's 4 groups are one round."""
    data = with_val_prompts(tmp_path, 100)
    base = [f"data.path={data}", "monitor.probe_path=", "grpo.val_metric=reward", "reward.concurrency=8"]
    message = refusal(CLUSTER, base)
    assert message.startswith(f"{CLUSTER}: data.val_limit: in the validation pass, a worker can wait 9754 s on the "
                              "reward service (100 val prompts (all: data.val_limit 0) over 8 workers "
                              "(grpo.num_workers): 13 requests each, padding included, 4 at a time "
                              "(grpo.prompts_per_worker); nothing brings the ranks together between chunks "
                              "(grpo.val_metric reward, grpo.rollout.kind vllm, grpo.deepspeed.zero_stage 3): 4 rounds "
                              "of up to 8 requests (reward.concurrency) x 2438.5 s, each 4 attempts x reward.timeout_s "
                              "600 s + back-offs of up to 38.5 s), not less than grpo.collective_timeout_s (3000 s)")
    assert "Lower data.val_limit (to at most 32), raise reward.concurrency" in message
    assert "raise grpo.collective_timeout_s above 9754" in message
    # the training step alone is within the timeout, and the advice holds: 32 prompts are 4 a worker, one chunk
    assert load_config(job.Config, CLUSTER, [*base, "data.val_limit=32"])
    assert "wait 4877 s" in refusal(CLUSTER, [*base, "data.val_limit=33"])
    # vs_baseline meets the other ranks before every chunk (`_any_rank`): one chunk's round, as the step's
    assert load_config(job.Config, CLUSTER, [*base, "grpo.val_metric=vs_baseline"])
    # `quorum run` stops with exit 2 before any work
    root = tmp_path / "runs"
    assert cli_main(["run", str(CLUSTER), f"run.root={root}", "ray.shared_storage=", *base]) == 2
    err = capsys.readouterr().err
    assert "data.val_limit: in the validation pass" in err and not root.exists()


def test_the_next_step_s_groups_still_in_flight_go_before_the_first_validation_chunk(tmp_path):
    """rollout.max_staleness 1 sends step t+1's 4 groups before the validation after step t; they share the pool
    (4 in flight) with the first chunk's 4 requests: 2 rounds = 4,877 s. Validating only after the last step
    (eval_every 0) has nothing in flight."""
    base = [f"data.path={with_val_prompts(tmp_path, 100)}", "monitor.probe_path=", "reward.concurrency=4",
            "grpo.rollout.max_staleness=1"]
    message = refusal(CLUSTER, base)
    assert "data.val_limit: in the validation pass, a worker can wait 4877 s" in message
    assert ("the ranks meet before every chunk (grpo.val_metric vs_baseline); the next step's 4 groups, still in "
            "flight (grpo.rollout.max_staleness 1), go first: 2 rounds of up to 4 requests") in message
    assert load_config(job.Config, CLUSTER, [*base, "grpo.eval_every=0"])


# ---------------------------------------------------------------------------------------------------------------
# The probe


def test_a_probe_that_outlasts_the_collective_is_refused(tmp_path, capsys):
    """The demo (2 workers, 1 prompt each, 4 in flight, 3 x 300 s + (2 + 4) x 1.1 = 906.6 s a request, 1,800 s):
    rank 0 sends its probe pairs 4 at a time, so 5 pairs are 2 rounds, 1,813.2 s."""
    message = refusal(DEMO, ["monitor.probe_limit=5"])
    assert message.startswith(f"{DEMO}: monitor.probe_limit: in the probe, rank 0 (alone, the others going on to the "
                              "next collective) can wait 1813.2 s on the reward service (5 pairs of "
                              "monitor.probe_path configs/data/menlo_fixture.jsonl (monitor.probe_limit 5), one "
                              "request each, all sent at once: 2 rounds of up to 4 requests (reward.concurrency) x "
                              "906.6 s, each 3 attempts x reward.timeout_s 300 s + back-offs of up to 6.6 s), not "
                              "less than grpo.collective_timeout_s (1800 s)")
    assert "Lower monitor.probe_limit (to at most 4), raise reward.concurrency" in message
    assert load_config(job.Config, DEMO, ["monitor.probe_limit=4"])
    assert load_config(job.Config, DEMO, ["monitor.probe_limit=5", "monitor.enabled=false"])  # no monitors, no probe
    assert load_config(job.Config, DEMO, ["monitor.probe_limit=5", "reward.concurrency=5"])
    root = tmp_path / "runs"
    assert cli_main(["run", str(DEMO), f"run.root={root}", "monitor.probe_limit=5"]) == 2
    assert "monitor.probe_limit: in the probe" in capsys.readouterr().err and not root.exists()


def test_the_probe_counts_the_pairs_its_file_holds(tmp_path):
    """probe_limit caps the pairs, the file decides how many there are: it is read when the config loads."""
    fixture = (REPO / "configs" / "data" / "menlo_fixture.jsonl").read_text(encoding="utf-8").splitlines()
    for n in (4, 5):
        (tmp_path / f"probe{n}.jsonl").write_text("\n".join(fixture[:n]) + "\n", encoding="utf-8")
    assert load_config(job.Config, DEMO, [f"monitor.probe_path={tmp_path / 'probe4.jsonl'}", "monitor.probe_limit=64"])
    assert f"5 pairs of monitor.probe_path {tmp_path / 'probe5.jsonl'} (monitor.probe_limit 64)" in refusal(
        DEMO, [f"monitor.probe_path={tmp_path / 'probe5.jsonl'}", "monitor.probe_limit=64"])


def test_the_probe_and_a_validation_with_no_collective_between_them_add_up(tmp_path):
    """The demo's ZeRO-2 hf rollouts with val_metric reward: after the monitored step's reduction rank 0 judges the
    probe (1 round) and then its validation chunks (1 + 1 rounds: 2 val prompts a worker, 1 a chunk) before any
    collective. At 200 s a request (606.6 s with retries) each fits alone, the three rounds (1,819.8 s) do not."""
    base = [f"data.path={with_val_prompts(tmp_path, 4)}", "data.val_splits=[val]", "grpo.eval_every=2",
            "grpo.val_metric=reward", "reward.timeout_s=200"]
    message = refusal(DEMO, base)
    assert message.startswith(f"{DEMO}: monitor.probe_limit: in the probe, rank 0 (alone, the others going on to the "
                              "next collective) can wait 1819.8 s")
    assert ("then a validation pass's 2 rounds before any collective (grpo.val_metric reward, "
            "grpo.deepspeed.zero_stage 2): 3 rounds") in message
    assert "Lower monitor.probe_limit or data.val_limit, raise reward.concurrency" in message
    assert load_config(job.Config, DEMO, [*base, "monitor.probe_path="])  # the validation alone: 1,213.2 s
    assert load_config(job.Config, DEMO, [*base, "grpo.val_metric=vs_baseline"])  # `_any_rank` after the probe


# ---------------------------------------------------------------------------------------------------------------
# The shipped configs


# `grep -l "job: policy_grpo" configs/*.yaml`
POLICY_CONFIGS = sorted(str(p) for p in (REPO / "configs").glob("*.yaml")
                        if re.search(r"^job: policy_grpo\s*$", p.read_text(encoding="utf-8"), re.MULTILINE))


@pytest.mark.parametrize("config", POLICY_CONFIGS, ids=lambda p: Path(p).name)
def test_every_shipped_policy_grpo_config_loads(config):
    assert load_config(job.Config, config)


def test_the_shipped_configs_were_found():
    assert {Path(p).name for p in POLICY_CONFIGS} >= {"policy_grpo_cluster.yaml", "policy_grpo_demo.yaml"}
