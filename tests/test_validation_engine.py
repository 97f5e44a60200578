"""Validation generations come from the rollout engine (train/grpo/validate.py), the baseline's included, and the
baseline is the policy before its first update.

With `rollout.kind: vllm` the baseline (the initial policy) is sampled by the colocated vLLM engine with the adapter
of step 0, never by HF `generate` on the training model (under ZeRO-3 every token of that gathers the sharded
weights across nodes). vLLM is faked only at its edge (`vllm.LLM`, as tests/test_vllm_rollout.py does); everything
else is real: a tiny peft model, its tokenizer, the adapter sync, a one-rank gloo process group for validation's
collectives. With `rollout.kind: hf` the baseline is `generate` on the policy as it starts: with an SFT adapter
(`grpo.init_adapter`), that adapter, not the bare base model.
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
from train.grpo.validate import BaselineAnswers, sample_baselines, validate

ROWS = [{"id": f"p{i}", "prompt_messages": f"Say something about {word}."} for i, word in enumerate(("cats", "tea"))]
BASE_IDS = [17, 18, 19]


def policy_ids(version: int) -> list[int]:
    """What the fake engine answers with adapter version `version`: each version answers apart."""
    return [40 + version, 41]


class RecordingLLM:
    """`vllm.LLM` at the edge: records every generate's LoRA request; the base model and the adapter answer apart."""

    built: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs, self.requests = kwargs, []
        RecordingLLM.built.append(self)

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.requests.append(lora_request)
        ids = BASE_IDS if lora_request is None else policy_ids(lora_request.lora_int_id)
        sample = SimpleNamespace(token_ids=ids, finish_reason="stop")
        return [SimpleNamespace(outputs=[sample] * p["n"]) for p in params]

    def shutdown(self):
        """vLLM's engine shutdown, which the rollout calls when it is done with the engine."""


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


def test_vllm_validation_samples_the_baseline_on_the_engine_with_the_adapter_of_step_0(
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
    sample_baselines(engine, tokenizer, cfg, ROWS, rollout, 0, 1, BaselineAnswers(str(tmp_path / "baseline"), 0), 0)
    judge, answers = Judge(), []
    # (training steps happen here); validation syncs the adapter again: version 2
    metrics = validate(engine, tokenizer, cfg, ROWS, judge, rollout, 0, 1, reduce_sums,
                       BaselineAnswers(str(tmp_path / "baseline"), 0), answers)
    (llm,) = fake_vllm.built
    # the baseline with the adapter synced before step 1 (version 1), then the policy's with the adapter of now
    assert [r.lora_int_id for r in llm.requests] == [1, 2]
    base, policy = tokenizer.decode(policy_ids(1)), tokenizer.decode(policy_ids(2))
    assert judge.asked == [([policy, policy], [base, base])]
    assert [(a["answer"], a["baseline_answer"]) for a in answers] == [(policy, base)] * 2
    assert metrics["val/vs_baseline/win_rate"] == 1.0
    # the baseline is sampled once per run: a restarted worker reads it back and samples nothing
    sample_baselines(engine, tokenizer, cfg, ROWS, rollout, 0, 1, BaselineAnswers(str(tmp_path / "baseline"), 0), 3)
    validate(engine, tokenizer, cfg, ROWS, judge, rollout, 0, 1, reduce_sums,
             BaselineAnswers(str(tmp_path / "baseline"), 0), [])
    assert [r.lora_int_id for r in llm.requests] == [1, 2, 3]


def test_hf_baseline_is_the_policy_before_its_first_update_with_an_sft_adapter(one_rank, tiny_model_dir, tmp_path):
    """An SFT adapter that moves the answers (grpo.init_adapter): the baseline is that adapter's answers, not the
    bare base model's; after an update the policy answers apart and the baseline stays."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = grpo_config("hf")
    model = peft_policy(tiny_model_dir, 1, 1.0)
    engine, rollout = SimpleNamespace(module=model), HFRollout(tokenizer, cfg, False)
    sample_baselines(engine, tokenizer, cfg, ROWS, rollout, 0, 1, BaselineAnswers(str(tmp_path / "base"), 0), 0)

    def judged() -> tuple[list[str], list[str]]:
        judge = Judge()
        validate(engine, tokenizer, cfg, ROWS, judge, rollout, 0, 1, reduce_sums,
                 BaselineAnswers(str(tmp_path / "base"), 0), [])
        return judge.asked[0]

    policy, baseline = judged()  # no update yet: the same policy, the same seeds, the same answers
    assert policy == baseline
    with model.disable_adapter():  # control: the bare base model answers otherwise
        bare, _ = judged()
    assert bare != baseline
    with torch.no_grad():  # an update
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param))
    updated, still = judged()
    assert still == baseline and updated != baseline


def test_a_run_resumed_past_step_0_without_its_baseline_is_refused(one_rank, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = grpo_config("hf")
    engine, rollout = SimpleNamespace(module=peft_policy(tiny_model_dir, 1, 1.0)), HFRollout(tokenizer, cfg, False)
    with pytest.raises(RuntimeError, match="resumes at step 2 .* the initial policy that answers them is gone"):
        sample_baselines(engine, tokenizer, cfg, ROWS, rollout, 0, 1, BaselineAnswers(str(tmp_path / "b"), 0), 2)
    with pytest.raises(RuntimeError, match=r"no baseline answer for validation rows \[0, 1\]"):
        validate(engine, tokenizer, cfg, ROWS, Judge(), rollout, 0, 1, reduce_sums,
                 BaselineAnswers(str(tmp_path / "b"), 0), [])
