"""The GRPO jobs' configs and training rows, without Ray (the Ray runs are in tests/test_grpo_ray.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jobs.judge.grpo as judge_job
import jobs.policy.grpo as policy_job
from core.config import ConfigError, load_config
from jobs.cli import job_module

REPO = Path(__file__).resolve().parents[1]
JUDGE_DEMO, POLICY_DEMO = REPO / "configs" / "judge_grpo_demo.yaml", REPO / "configs" / "policy_grpo_demo.yaml"


def test_jobs_are_registered():
    assert job_module(str(JUDGE_DEMO)) is judge_job and job_module(str(POLICY_DEMO)) is policy_job


def test_judge_rows_cover_both_orders_with_gold_following_the_shown_order():
    cfg = load_config(judge_job.Config, JUDGE_DEMO)
    frame = judge_job.judge_rows(cfg)
    assert frame["role"].value_counts().to_dict() == {"train": 48, "val": 8}  # held-out val pairs, both orders
    assert not set(frame[frame["role"] == "val"]["pair_id"]) & set(frame[frame["role"] == "train"]["pair_id"])
    rows = frame[frame["role"] == "train"]
    assert set(rows["order"]) == {"AB", "BA"}
    assert rows["dimension"].nunique() == 4 and rows["locale"].nunique() == 8
    pair = rows[rows["pair_id"] == "flu-02-it_IT"].set_index("order")
    # fixture: response_a ("Usa molta acqua...") graded 3, response_b graded 5
    assert (pair.loc["AB", "gold_a"], pair.loc["AB", "gold_b"]) == (3.0, 5.0)
    assert (pair.loc["BA", "gold_a"], pair.loc["BA", "gold_b"]) == (5.0, 3.0)
    shown = json.loads(pair.loc["BA", "prompt_messages"])[-1]["content"]
    assert shown.index("abbondante acqua salata") < shown.index("Usa molta acqua")  # B's text shown as A


def test_pointwise_judge_rows_judge_each_response_with_its_own_gold():
    cfg = load_config(judge_job.Config, JUDGE_DEMO, ["prompt.mode=pointwise", "prompt.template=menlo_pointwise"])
    rows = judge_job.judge_rows(cfg)
    pair = rows[rows["pair_id"] == "flu-02-it_IT"].set_index("order")
    assert set(pair.index) == {"a", "b"} and (pair["mode"] == "pointwise").all()
    assert (pair.loc["a", "gold_a"], pair.loc["b", "gold_a"]) == (3.0, 5.0) and pair["gold_b"].isna().all()
    assert "Usa molta acqua" in json.loads(pair.loc["a", "prompt_messages"])[-1]["content"]
    assert "<final_grade>" in json.loads(pair.loc["a", "prompt_messages"])[0]["content"]
    with pytest.raises(ConfigError, match="prompt.template: 'menlo_pairwise' has no 'response'"):
        load_config(judge_job.Config, JUDGE_DEMO, ["prompt.mode=pointwise"])
    with pytest.raises(ConfigError, match="prompt.mode: 'listwise'"):
        load_config(judge_job.Config, JUDGE_DEMO, ["prompt.mode=listwise"])


def test_judge_rows_filters_and_averaged_grades():
    cfg = load_config(judge_job.Config, JUDGE_DEMO, ["data.dimensions=[tone]", "data.both_orders=false"])
    rows = judge_job.judge_rows(cfg)
    assert len(rows) == 7 and set(rows["dimension"]) == {"tone"}  # 6 train pairs, 1 val pair, one order each
    assert 3.5 in set(rows["gold_a"]) | set(rows["gold_b"])  # the averaged gold grade survives as is


def test_policy_rows_are_unique_prompts_without_localized_factuality():
    cfg = load_config(policy_job.Config, POLICY_DEMO)
    rows = policy_job.policy_rows(cfg)
    assert len(rows) == 18 and "localized_factuality" not in set(rows["dimension"]) and set(rows["role"]) == {"train"}
    with_val = policy_job.policy_rows(load_config(policy_job.Config, POLICY_DEMO, ["data.val_splits=[val]"]))
    assert with_val["role"].value_counts().to_dict() == {"train": 18, "val": 3}
    first = rows.iloc[0]
    assert json.loads(first["prompt_messages"])[0]["role"] == "user"
    # the served judge-training template renders dimension and locale from the request's own fields
    assert first["judge_prompt"] == json.loads(first["prompt_messages"])[0]["content"]
    task = policy_job.policy_rows(load_config(policy_job.Config, POLICY_DEMO, ["reward.send_context=false"]))
    first = task.iloc[0]
    assert first["judge_prompt"].startswith(f"[Locale]\n{first['locale']}\n\n[Dimension]\n")
    assert json.loads(first["prompt_messages"])[0]["content"] in first["judge_prompt"]


def test_limit_rows_samples_with_a_seed_or_keeps_the_head():
    import pandas as pd

    from jobs.grpo_stages import limit_rows

    frame = pd.DataFrame({"pair_id": [f"p{i}" for i in range(10)], "x": range(10)})
    assert list(limit_rows(frame, 3, "head", 0, "pair_id")["x"]) == [0, 1, 2]
    assert limit_rows(frame, 0, "random", 0, "pair_id") is frame
    assert limit_rows(frame, 10, "random", 0, "pair_id") is frame
    picked = limit_rows(frame, 3, "random", 0, "pair_id")
    # the three lowest sha256("0|p<i>") hex digests: p0 (44906d...), p8 (5b0be1...), p5 (60d721...); file order kept
    assert list(picked["pair_id"]) == ["p0", "p5", "p8"]
    # independent of the file's order, different for another seed
    shuffled = frame.iloc[::-1].reset_index(drop=True)
    assert set(limit_rows(shuffled, 3, "random", 0, "pair_id")["pair_id"]) == set(picked["pair_id"])
    assert set(limit_rows(frame, 3, "random", 1, "pair_id")["pair_id"]) != set(picked["pair_id"])


def test_policy_rows_sample_the_training_prompts():
    head = policy_job.policy_rows(load_config(policy_job.Config, POLICY_DEMO, ["data.limit=5", "data.sample=head"]))
    sampled = policy_job.policy_rows(load_config(policy_job.Config, POLICY_DEMO, ["data.limit=5"]))
    full = policy_job.policy_rows(load_config(policy_job.Config, POLICY_DEMO))
    assert list(head["id"]) == list(full["id"][:5])
    assert len(sampled) == 5 and set(sampled["id"]) <= set(full["id"]) and list(sampled["id"]) != list(head["id"])


@pytest.mark.parametrize("module, path, override, key", [
    (judge_job, JUDGE_DEMO, "data.dimensions=[style]", "data.dimensions"),
    (judge_job, JUDGE_DEMO, "reward.near_miss=-0.5", "reward.near_miss"),
    (judge_job, JUDGE_DEMO, "prompt.template=jury_score", "prompt.template"),
    (judge_job, JUDGE_DEMO, "grpo.prompts_per_step=3", "grpo.prompts_per_step"),
    (judge_job, JUDGE_DEMO, "data.val_splits=[train]", "data.val_splits"),
    (judge_job, JUDGE_DEMO, "data.val_splits=[dev]", "data.val_splits"),
    (judge_job, JUDGE_DEMO, "grpo.eval_every=-1", "grpo.eval_every"),
    (policy_job, POLICY_DEMO, "data.val_limit=-1", "data.val_limit"),
    (policy_job, POLICY_DEMO, "reward.url=localhost:8000", "reward.url"),
    (policy_job, POLICY_DEMO, "grm.overrides=[batching.max_batch_size=0]", "batching.max_batch_size"),
    (policy_job, POLICY_DEMO, "grm.config=configs/nope.yaml", "grm.config"),
    (policy_job, POLICY_DEMO, "data.dimensions=[]", "data.dimensions"),
    (policy_job, POLICY_DEMO, "data.sample=first", "data.sample"),
    (policy_job, POLICY_DEMO, "reward.signal=mean", "reward.signal"),
    (policy_job, POLICY_DEMO, "grpo.val_metric=loss", "grpo.val_metric"),
])
def test_config_errors_name_the_key(module, path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(module.Config, path, [override])


def test_policy_job_refuses_a_missing_token_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("QUORUM_TEST_ABSENT_TOKEN", raising=False)
    cfg = load_config(policy_job.Config, POLICY_DEMO, [f"run.root={tmp_path}", "reward.url=http://127.0.0.1:9",
                                                       "reward.token_env=QUORUM_TEST_ABSENT_TOKEN"])
    with pytest.raises(ConfigError, match="QUORUM_TEST_ABSENT_TOKEN"):
        policy_job.main(cfg, "x.yaml")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("judge_config, policy_config", [
    ("judge_grpo_demo.yaml", "policy_grpo_demo.yaml"), ("judge_grpo_cluster.yaml", "policy_grpo_cluster.yaml")])
def test_the_served_grm_prompt_is_the_judge_training_prompt(judge_config, policy_config):
    """What GRMServer renders for a policy row's request (`JudgePrompts.compare_messages`, as /compare and
    /reward/group do) equals the judge_grpo row of the same pair in the A-then-B order; the Serve app itself is
    checked the same way in tests/test_grpo_ray.py."""
    from eval.judging.menlo_data import read_menlo_jsonl
    from serve.config import load_prompts

    policy_cfg = load_config(policy_job.Config, REPO / "configs" / policy_config, ["data.limit=0"])
    served = load_prompts(policy_cfg.serve_config().prompts)
    judge_rows = judge_job.judge_rows(load_config(judge_job.Config, REPO / "configs" / judge_config))
    pairs = {r["pair_id"]: r for r in read_menlo_jsonl(policy_cfg.data.path).to_dict("records")}
    rows = policy_job.policy_rows(policy_cfg).to_dict("records")
    for row in rows:
        pair = pairs[row["id"]]
        messages = served.compare_messages(row["judge_prompt"], pair["response_a"], pair["response_b"],
                                           row["dimension"], row["locale"])
        trained = judge_rows[(judge_rows["pair_id"] == row["id"]) & (judge_rows["order"] == "AB")]
        assert messages == json.loads(trained.iloc[0]["prompt_messages"]), row["id"]
    assert len(rows) >= 18  # every training (and validation) prompt was checked


@pytest.mark.parametrize("judge_config, policy_config", [
    ("judge_grpo_demo.yaml", "policy_grpo_demo.yaml"), ("judge_grpo_cluster.yaml", "policy_grpo_cluster.yaml")])
def test_policy_configs_probe_the_judge_on_pairs_it_was_not_trained_on(judge_config, policy_config):
    """Both policy GRPO configs measure the served judge's accuracy on a labelled probe set (monitor.probe_path),
    and no probe pair is one the matching judge_grpo config trains the judge on."""
    from eval.judging.menlo_data import read_menlo_jsonl

    cfg = load_config(policy_job.Config, REPO / "configs" / policy_config, ["data.limit=0"])
    assert cfg.monitor.enabled and cfg.monitor.probe_path
    pairs = policy_job.probe_pairs(cfg)
    assert 2 <= len(pairs) <= cfg.monitor.probe_limit and {p["gold"] for p in pairs} <= {"A", "B", "tie"}
    judge = load_config(judge_job.Config, REPO / "configs" / judge_config)
    trained = read_menlo_jsonl(judge.data.path)
    trained = trained[trained["split"].isin(judge.data.splits)]
    probed = read_menlo_jsonl(cfg.monitor.probe_path).head(cfg.monitor.probe_limit)
    assert set(probed["split"]) == {"test"}
    assert not set(zip(probed["prompt"], probed["response_a"])) & set(zip(trained["prompt"], trained["response_a"]))
