"""Validation generations come from the rollout engine (train/grpo/validate.py), the baseline's included.

With `rollout.kind: vllm` the baseline (the initial policy: the model with its adapter off) is sampled by the
colocated vLLM engine without a LoRA request, never by HF `generate` on the training model (under ZeRO-3 every
token of that gathers the sharded weights across nodes). vLLM is faked only at its edge (`vllm.LLM`, as
tests/test_vllm_rollout.py does); everything else is real: a tiny peft model, its tokenizer, the adapter sync, a
one-rank gloo process group for validation's collectives. With `rollout.kind: hf` the baseline is `generate` with
the adapter disabled: the same answers whatever the adapter's weights.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from train.config import GRPOConfig, LoraSection, RolloutSection
from train.grpo.batch import GroupOutcome
from train.grpo.loop import reduce_sums
from train.grpo.rollout_hf import HFRollout
from train.grpo.validate import BaselineAnswers, validate

ROWS = [{"id": f"p{i}", "prompt_messages": f"Say something about {word}."} for i, word in enumerate(("cats", "tea"))]
BASE_IDS, POLICY_IDS = [17, 18, 19], [40, 41]


class RecordingLLM:
    """`vllm.LLM` at the edge: records every generate's LoRA request; the base model and the adapter answer apart."""

    built: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs, self.requests = kwargs, []
        RecordingLLM.built.append(self)

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.requests.append(lora_request)
        ids = BASE_IDS if lora_request is None else POLICY_IDS
        sample = SimpleNamespace(token_ids=ids, finish_reason="stop")
        return [SimpleNamespace(outputs=[sample] * p["n"]) for p in params]


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = ModuleType("vllm")
    vllm.LLM = RecordingLLM
    vllm.SamplingParams = lambda **kwargs: kwargs
    request = ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, int_id, path: SimpleNamespace(lora_name=name, lora_int_id=int_id, path=path)
    for name, module in (("vllm", vllm), ("vllm.lora", ModuleType("vllm.lora")), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    RecordingLLM.built = []
    return RecordingLLM


@pytest.fixture
def one_rank(tmp_path):
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Judge:
    """The GRM's `versus` at the edge: records what it was asked to compare, the policy always wins by 1."""

    def __init__(self):
        self.asked = []

    def versus(self, rows, answers, baselines):
        self.asked.append((list(answers), list(baselines)))
        return [GroupOutcome(rewards=[1.0], components={"grm_margin": [1.0], "grm_mean_grade": [4.0]})
                for _ in rows]


def peft_policy(model_dir: str, seed: int, std: float):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=std)
    return model


def grpo_config(kind: str) -> GRPOConfig:
    return GRPOConfig(rollout=RolloutSection(kind=kind), use_gpu=kind == "vllm", val_metric="vs_baseline",
                      group_size=2, max_prompt_length=64, max_completion_length=6, lora=LoraSection(r=4, alpha=8))


def test_vllm_validation_samples_the_baseline_on_the_engine_not_with_hf_generate(
        fake_vllm, one_rank, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from train.grpo.rollout_vllm import VLLMRollout

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = grpo_config("vllm")
    model = peft_policy(tiny_model_dir, 0, 0.01)

    def no_hf_generate(*args, **kwargs):
        raise AssertionError("HF generate on the training model during validation with rollout.kind vllm")

    model.generate = no_hf_generate  # the training model must not decode: under ZeRO-3 each token gathers it
    engine = SimpleNamespace(module=model)
    rollout = VLLMRollout(tokenizer, cfg, tiny_model_dir, str(tmp_path / "scratch"), 0, sleep_mode=False)
    judge, answers = Judge(), []
    metrics = validate(engine, tokenizer, cfg, ROWS, judge, rollout, 0, 1, reduce_sums,
                       BaselineAnswers(str(tmp_path / "baseline"), 0), answers)
    (llm,) = fake_vllm.built
    # one baseline call without a LoRA request, then the policy's with the adapter synced before validation
    assert [r is None for r in llm.requests] == [True, False]
    assert llm.requests[1].lora_int_id == rollout.version == 1
    base, policy = tokenizer.decode(BASE_IDS), tokenizer.decode(POLICY_IDS)
    assert judge.asked == [([policy, policy], [base, base])]
    assert [(a["answer"], a["baseline_answer"]) for a in answers] == [(policy, base)] * 2
    assert metrics["val/vs_baseline/win_rate"] == 1.0
    # the baseline is sampled once per run: a second validation asks the engine for the policy only
    validate(engine, tokenizer, cfg, ROWS, judge, rollout, 0, 1, reduce_sums,
             BaselineAnswers(str(tmp_path / "baseline"), 0), [])
    assert [r is None for r in llm.requests] == [True, False, False]


def test_hf_validation_samples_the_baseline_with_the_adapter_off(one_rank, tiny_model_dir, tmp_path):
    """Two policies with very different adapters: the same baseline answers, different policy answers."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = grpo_config("hf")
    seen = []
    for seed in (1, 2):
        model = peft_policy(tiny_model_dir, seed, 1.0)
        judge, answers = Judge(), []
        validate(SimpleNamespace(module=model), tokenizer, cfg, ROWS, judge, HFRollout(tokenizer, cfg, False), 0, 1,
                 reduce_sums, BaselineAnswers(str(tmp_path / f"baseline{seed}"), 0), answers)
        seen.append(judge.asked[0])
    (policy_a, base_a), (policy_b, base_b) = seen
    assert base_a == base_b
    assert policy_a != policy_b
