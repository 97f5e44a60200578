"""GRPO against the served GRM, end to end on CPU: the policy_grpo job deploys the real Serve app, 2 Ray Train
workers (DeepSpeed ZeRO-2 + LoRA on the tiny random Llama) sample rollouts and POST every group to /reward/group
over real HTTP with a bearer token.

The judge behind the Serve app is a scripted hosted model (tests/fake_openai_server.py through the app's `openai`
engine): a random tiny model never writes parseable MENLO grades, so every group would fail and nothing could be
checked to train. The script grades each response by a hash of its text, in MENLO's exact output format, and
refuses to grade one prompt (marked UNJUDGEABLE) so that group fails for real inside the service (null rewards).
A second run points the job at a closed port: every group fails, is counted, and the adapter does not move.
The served prompt is checked to be the judge-training prompt (menlo_pairwise with the pair's dimension and locale).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
from pathlib import Path

import pandas as pd
import pytest
import torch
from fake_openai_server import FakeOpenAIServer
from safetensors.torch import load_file
from wandb_reader import find_run_files, read_run

import jobs.policy.grpo as job
from core.config import load_config
from eval.judging.menlo_data import read_menlo_jsonl
from eval.judging.menlo_parse import MENLO_LABELS
from jobs.cli import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
TOKEN_ENV, TOKEN = "QUORUM_TEST_GRPO_TOKEN", "grpo-token-91c3"
PROMPTS = [("de_DE", "fluency", "Wie bleibe ich beim Lernen konzentriert?"),
           ("ja_JP", "tone", "UNJUDGEABLE 最近とても疲れています。"),
           ("es_MX", "localized_tone", "Escribe un saludo para mi abuela."),
           ("en_US", "fluency", "How do I keep basil alive indoors?")]
VAL_PROMPTS = [("fr_FR", "tone", "Je suis un peu perdu en ce moment."),
               ("it_IT", "localized_tone", "Come saluto i vicini nuovi?")]
_RESPONSES = re.compile(r"\[Response A\]\n(.*)\n\n\[Response B\]\n(.*)\Z", re.DOTALL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


closed_port = free_port  # bound, then closed again: nothing listens there


def scripted_judge(message: str) -> str:
    """MENLO-format grades from a hash of each response (arbitrary but deterministic taste)."""
    if "UNJUDGEABLE" in message:
        return "I cannot grade these responses."
    a, b = _RESPONSES.search(message).groups()
    grade_a, grade_b = (1 + int(hashlib.sha256(r.encode()).hexdigest(), 16) % 5 for r in (a, b))
    return (f"<think>Comparing both.</think>\n<final_grade_A> FINAL GRADE: {grade_a} - {MENLO_LABELS[grade_a]} "
            f"</final_grade_A>\n<final_grade_B> FINAL GRADE: {grade_b} - {MENLO_LABELS[grade_b]} </final_grade_B>")


def write_prompts(path: Path) -> str:
    lines = []
    splits = [("train", p) for p in PROMPTS] + [("val", p) for p in VAL_PROMPTS]
    for i, (split, (locale, dim, prompt)) in enumerate(splits):
        lines.append(json.dumps({"pair_id": f"p{i}", "dimension": dim, "locale": locale, "split": split,
                                 "prompt": prompt, "response_a": "x", "response_b": "y", "gold_a": 3, "gold_b": 3},
                                ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def job_config(tmp: Path, model_dir: str, overrides: list[str], grm_overrides: list[str]) -> job.Config:
    cfg = load_config(job.Config, REPO / "configs" / "policy_grpo_demo.yaml", [
        f"run.root={tmp / 'runs'}", f"data.path={write_prompts(tmp / 'prompts.jsonl')}", f"grpo.model={model_dir}",
        "grpo.group_size=3", "grpo.prompts_per_step=2", "grpo.micro_batch_size=3", "grpo.max_steps=2",
        "grpo.max_prompt_length=64", "grpo.max_completion_length=8", "grpo.lr=0.01", "grpo.weight_decay=0.0",
        "grpo.num_iterations=2", "grpo.kl_coef=0.05", "grpo.entropy_coef=0.01", "grpo.lora.r=4", "grpo.lora.alpha=8",
        "grpo.checkpoint_every=2", "grpo.log_samples_every=1", "reward.backoff_s=0.01", *overrides])
    cfg.grm.overrides = grm_overrides
    cfg.validate()
    return cfg


def initial_lora(model_dir: str, cfg: job.Config) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    from train.engine import build_lora_model

    model = build_lora_model(model_dir, cfg.grpo)
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def history(run_dir: Path) -> list[dict]:
    """The step rows of rank 0's offline W&B run (in the job's run directory, beside the job's own run, which has
    no reward/groups rows), so `wandb sync <run>/wandb/...` finds it after the stage folder is renamed."""
    runs = [[row for row in read_run(f)["history"] if "reward/groups" in row] for f in find_run_files(run_dir)]
    (steps,) = [rows for rows in runs if rows]
    return steps


@pytest.fixture(scope="module")
def serve_port(ray_local) -> int:
    """The HTTP port of the module's one Serve instance: the first job that deploys its judge starts Serve there, the
    next test's deployment goes into the same instance (a Serve start is seconds), each test deletes its own app."""
    from ray import serve

    serve.shutdown()  # an earlier module's Serve instance keeps its own HTTP options
    yield free_port()
    serve.shutdown()  # later modules start Serve with their own HTTP options


def test_policy_grpo_with_served_grm_trains_lora_and_logs_reward_components(serve_port, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with FakeOpenAIServer(reply=scripted_judge) as judge:
        # validation on the 2 val prompts after the last step: each answer against the base model's
        cfg = job_config(tmp_path, tiny_model_dir, ["run.id=served", "data.val_splits=[val]"],
                         scripted_grm(judge, "grm-grpo-test", serve_port))
        job.main(cfg, "served.yaml")
        judged = judge.calls
    from ray import serve

    assert "grm-grpo-test" not in serve.status().applications, "the job must delete the app it deployed"
    run = Path(cfg.run.root) / "policy_grpo" / "served"
    steps = history(run)
    assert [row["step"] for row in steps] == [1, 2]
    # 4 prompts x 1 epoch: 4 groups of 3 rollouts; the UNJUDGEABLE one fails inside the service (null rewards)
    assert sum(row["reward/groups"] for row in steps) == 4
    assert sum(row["reward/groups_failed"] for row in steps) == 1
    assert sum(row.get("reward_service/errors/null_rewards", 0) for row in steps) == 1
    assert sum(row["reward_service/judgments_failed"] for row in steps) == 3      # its C(3,2) pairs
    assert len(judged) >= 3 * 4 - 3  # every pair went to the judge (the app's cache may answer repeats)
    for row in steps:
        for key in ("reward/mean", "reward/grm_margin", "reward/grm_mean_grade", "reward/std_within_group",
                    "reward_service/latency_s_mean", "response_length/mean", "kl", "approx_kl", "clip_fraction",
                    "entropy", "loss", "tokens_per_s", "generate_tokens_per_s"):
            assert math.isfinite(row[key]), (key, row)
        assert row["reward_service/latency_s_mean"] > 0 and row["tokens_per_s"] > 0
        assert 1 <= row["reward/grm_mean_grade"] <= 5 and row["updates_skipped"] == 0
        # what OpenRLHF / verl users read: score range, advantage and length statistics, both clip sides, phases,
        # throughput per GPU and per rank (no peak GPU memory off-GPU)
        for key in ("score/max", "score/min", "advantage/mean", "advantage/std", "advantage/max", "advantage/min",
                    "prompt_length/mean", "prompt_length/max", "prompt_length/min", "response_length/min",
                    "clip_fraction_low", "clip_fraction_high", "time/generate_s", "time/weight_sync_s",
                    "time/reward_s", "time/reference_s", "time/old_logprob_s", "time/update_s",
                    "tokens_per_s_per_gpu", "perf/rank0/tokens_per_s", "perf/rank1/tokens_per_s"):
            assert math.isfinite(row[key]), (key, row)
        assert row["score/min"] <= row["reward/mean"] <= row["score/max"] and row["time/update_s"] > 0
        assert row["tokens_per_s_per_gpu"] == pytest.approx(row["tokens_per_s"] / 2)
        assert "gpu/peak_memory_gib" not in row
    # the trainer's run sits in the job run's group, with the job's tags (offline: the job's run is)
    runs = {read_run(f)["run"]["job_type"]: read_run(f)["run"] for f in find_run_files(run)}
    assert runs["train"]["group"] == runs["policy_grpo"]["group"] == "policy_grpo/served"
    assert runs["train"]["tags"] == list(cfg.wandb.tags) and runs["train"]["project"] == cfg.wandb.project
    assert runs["train"]["name"] == "policy_grpo/served/grpo-policy_grpo"
    # the rollouts were sent with the bearer token; the app would have answered 401 otherwise
    trained = load_file(str(run / "train" / "run" / "adapter" / "adapter_model.safetensors"))
    initial = initial_lora(tiny_model_dir, cfg)
    assert trained.keys() == initial.keys()
    for name, before in initial.items():
        assert not torch.equal(trained[name], before), f"{name} did not change"
    summary = (run / "summary.md").read_text()
    assert "reward/groups_failed" in summary and "reward_service/errors/null_rewards" in summary
    # the reward-hacking monitors (monitor.every 1): every step, from the judge's per-order grades and the rollouts
    for row in steps:
        assert row["monitor/position/verdicts_window"] > 0 and 0 <= row["monitor/position/first_share_window"] <= 1
        assert 0 <= row["monitor/format/quoting_share"] <= 1 and row["monitor/length/rollout_mean"] > 0
    assert steps[0]["monitor/length/rollout_ratio"] == 1.0 and steps[-1]["monitor/length/val_ratio"] > 0
    # the probe set (monitor.probe_path: the fixture's first 2 pairs) judged by the same served judge every step
    assert all(row["monitor/probe/pairs"] == 2 and 0 <= row["monitor/probe/accuracy"] <= 1 for row in steps)
    train_summary = json.loads((run / "manifest.json").read_text())["stages"]["train"]["summary"]
    assert "monitor/position/first_share_window" in train_summary["monitor"]
    assert isinstance(train_summary["monitor_alerts"], list)
    # the policy's validation: its answers against the base model's, 2 judgments each (both orders)
    final = steps[-1]
    # the judged answers of the validation, as a W&B table in the final step's row
    assert final["val/generations/_type"] == "table-file" and final["val/generations/nrows"] == 2
    rates = [final[f"val/vs_baseline/{k}_rate"] for k in ("win", "tie", "loss")]
    assert final["val/vs_baseline/prompts"] == 2 and final["val/vs_baseline/prompts_failed"] == 0
    assert sum(rates) == pytest.approx(1.0) and 0 <= final["val/vs_baseline/score"] <= 1
    assert final["val/vs_baseline/score"] == pytest.approx(rates[0] + rates[1] / 2)
    assert 1 <= final["val/vs_baseline/baseline_grade_mean"] <= 5 and "val/reward/mean" not in final
    assert len(judge.calls_matching("Je suis un peu perdu")) >= 2  # both orders reached the judge
    best = json.loads((run / "train" / "run" / "best_adapter" / "best.json").read_text())
    assert best["score_key"] == "val/vs_baseline/score" and best["step"] == 2
    assert best["score"] == pytest.approx(final["val/vs_baseline/score"])
    assert "Best adapter by val/vs_baseline/score" in summary
    # the base model's answers, one per val prompt, kept for the run (a restarted worker reads them back)
    kept = [json.loads(p.read_text()) for p in sorted((run / "train" / "run" / "val_baseline").glob("rank*.json"))]
    assert [sorted(k) for k in kept] == [["0"], ["1"]]
    # MENLO Table 7's second stage: the judged answers of the best step go to human raters and come back
    answers = [json.loads(line) for p in sorted((run / "train" / "run" / "val_answers" / "step_000002").glob("*.jsonl"))
               for line in p.read_text().splitlines()]
    assert sorted(a["val_index"] for a in answers) == [0, 1]
    assert all(a["baseline_answer"] == kept[a["val_index"]][str(a["val_index"])] for a in answers)
    assert [a["grm_outcome"] for a in answers].count("win") == round(rates[0] * 2)
    human = tmp_path / "human"
    assert cli_main(["human", "export", str(run), "--out", str(human), "--n", "0"]) == 0
    key = pd.read_csv(human / "key.csv", dtype={"id": str})
    sheet = pd.read_csv(human / "sheet.csv", dtype=str, keep_default_na=False)
    assert len(sheet) == 4 and sorted(key["system"]) == ["base", "base", "trained", "trained"]
    systems = dict(zip(key["item_id"], key["system"]))
    sheet.assign(rating=["4" if systems[i] == "trained" else "2" for i in sheet["item_id"]]).to_csv(
        human / "ann.csv", index=False)
    assert cli_main(["human", "import", str(human), str(human / "ann.csv"), "--n-boot", "10"]) == 0
    # both prompts: trained rated 4, base 2 -> win rate 1, tie 0, loss 0
    assert re.search(r"\| trained +\| base +\| +2 \| 1\.000 \| 0\.000 \| +0\.000 \|", (human / "human_eval.md").read_text())


def scripted_grm(judge: FakeOpenAIServer, app: str, port: int) -> list[str]:
    """GRM overrides: the job's default prompts (configs/grm.yaml) with the scripted hosted judge as engine."""
    return [f"serve.port={port}", f"serve.app_name={app}", "serve.route_prefix=/grpo",
            f"serve.auth_token_env={TOKEN_ENV}", "judge.engine.kind=openai", f"judge.engine.base_url={judge.base_url}",
            "judge.engine.model=scripted-judge", "resources.num_cpus=0", "batching.batch_wait_timeout_s=0.05",
            # the job deletes its app at the end: its idle replica stops after one 0.1 s wait loop, not 2 s
            "shutdown.wait_loop_s=0.1"]


def test_the_policy_job_serves_the_judge_the_prompt_it_was_trained_on(serve_port, tmp_path, monkeypatch):
    import jobs.judge.grpo as judge_job
    from train.grpo.reward.build import GRMGroupReward
    from train.grpo.reward.client import RewardServiceConfig

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    demo = REPO / "configs" / "policy_grpo_demo.yaml"
    with FakeOpenAIServer(reply=scripted_judge) as judge:
        cfg = load_config(job.Config, demo, [f"run.root={tmp_path}"])
        cfg.grm.overrides = [*cfg.grm.overrides, *scripted_grm(judge, "grm-prompt-test", serve_port)]
        policy_rows = job.policy_rows(cfg).to_dict("records")
        # the judge's training rows for the same data, in the A-then-B order
        judge_cfg = load_config(judge_job.Config, REPO / "configs" / "judge_grpo_demo.yaml")
        judge_rows = judge_job.judge_rows(judge_cfg)
        pairs = {r["pair_id"]: r for r in read_menlo_jsonl(cfg.data.path).to_dict("records")}
        with job.served_reward(cfg) as (spec, _):
            reward = GRMGroupReward(RewardServiceConfig(**spec["config"]))
            try:
                for row in policy_rows[:3]:
                    pair = pairs[row["id"]]
                    judge.reset(api_key="")
                    # one group of the pair's two responses: all_pairs judges (0, 1), response_a shown as A
                    (outcome,) = reward([row], [[pair["response_a"], pair["response_b"]]])
                    assert outcome.error in ("", "null_rewards")
                    (call,) = judge.calls
                    trained = judge_rows[(judge_rows["pair_id"] == row["id"]) & (judge_rows["order"] == "AB")]
                    assert call.body["messages"] == json.loads(trained.iloc[0]["prompt_messages"]), row["id"]
            finally:
                reward.close()


def test_dead_reward_service_fails_every_group_and_leaves_the_adapter_untouched(serve_port, tiny_model_dir,
                                                                               tmp_path):
    # one worker and no W&B keep this run short; the loop's cross-worker paths ran in the test above
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = job_config(tmp_path, tiny_model_dir, ["run.id=dead", f"reward.url={url}", "reward.retries=2",
                                                "grpo.num_workers=1", "wandb.enabled=false"], [])
    table = job.main(cfg, "dead.yaml").set_index("metric")["value"]
    run = Path(cfg.run.root) / "policy_grpo" / "dead"
    # the last step: both groups failed to connect, each after 1 call + 2 retries; never a reward of 0 in disguise
    assert table["step"] == 2 and table["reward/groups"] == 2 and table["reward/groups_failed_fraction"] == 1.0
    assert table["reward_service/errors/connect"] == 2 and table["reward_service/retries"] == 4
    assert math.isnan(table["reward/mean"]) and table["updates_skipped"] == 1 and "loss" not in table
    assert not find_run_files(run), "wandb.enabled=false must leave no W&B files"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["train"]["summary"]["groups_failed"] == 2
    # where the GRPO worker ran (recorded by the shared report path): the session's one node
    import ray

    assert manifest["stages"]["train"]["summary"]["worker_nodes"] == [ray.get_runtime_context().get_node_id()]
    trained = load_file(str(run / "train" / "run" / "adapter" / "adapter_model.safetensors"))
    for name, before in initial_lora(tiny_model_dir, cfg).items():
        assert torch.equal(trained[name], before), f"{name} moved although no group was scored"
