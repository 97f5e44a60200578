"""train.vllm_rollout: the pure mappings on CPU; a real colocated vLLM engine with adapter sync on a CUDA machine.

GPU run: `python -m pytest tests/test_vllm_rollout.py -m gpu -q` (needs `pip install -e '.[gpu]'`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from train.config import GRPOConfig, RolloutSection
from train.vllm_rollout import adapter_version_dir, read_group_outputs, rollout_sampling_kwargs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def output(*samples: tuple[list[int], str]) -> SimpleNamespace:
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason=why) for ids, why in samples])


def test_sampling_kwargs_ask_for_the_whole_group_in_one_request():
    assert rollout_sampling_kwargs(0.9, 0.95, 0, 48, 4, 123) == {
        "n": 4, "temperature": 0.9, "top_p": 0.95, "top_k": 0, "max_tokens": 48, "seed": 123,
        "skip_special_tokens": True}
    with pytest.raises(ValueError, match="group_size >= 2"):
        rollout_sampling_kwargs(1.0, 1.0, 0, 48, 1, 0)
    with pytest.raises(ValueError, match="temperature > 0"):
        rollout_sampling_kwargs(0.0, 1.0, 0, 48, 4, 0)


def test_group_outputs_are_group_major_with_finished_flags():
    outputs = [output(([1, 2, 0], "stop"), ([3], "length")), output(([4, 0], "stop"), ([5, 6], "length"))]
    ids, finished = read_group_outputs(outputs, 2)
    assert ids == [[1, 2, 0], [3], [4, 0], [5, 6]]
    assert finished == [True, False, True, False]


def test_short_groups_and_aborted_samples_are_errors_not_rollouts():
    with pytest.raises(RuntimeError, match="1 samples for prompt 0, expected 2"):
        read_group_outputs([output(([1], "stop"))], 2)
    with pytest.raises(RuntimeError, match="aborted a rollout of prompt 1"):
        read_group_outputs([output(([1], "stop"), ([2], "stop")), output(([3], "abort"), ([4], "stop"))], 2)


def test_adapter_versions_get_their_own_directories(tmp_path):
    assert adapter_version_dir(tmp_path, 3) == tmp_path / "policy-v3"
    assert adapter_version_dir(tmp_path, 3) != adapter_version_dir(tmp_path, 4)


def test_vllm_rollouts_need_gpu_workers_and_a_memory_share():
    GRPOConfig(rollout=RolloutSection(kind="vllm"), use_gpu=True).validate()
    with pytest.raises(ValueError, match="rollout.kind: vllm rollouts run on each worker's GPU"):
        GRPOConfig(rollout=RolloutSection(kind="vllm")).validate()
    with pytest.raises(ValueError, match="rollout.gpu_memory_utilization"):
        GRPOConfig(rollout=RolloutSection(kind="vllm", gpu_memory_utilization=1.0),
                   use_gpu=True).validate()
    with pytest.raises(ValueError, match="rollout.kind: 'sglang'"):
        GRPOConfig(rollout=RolloutSection(kind="sglang")).validate()


@pytest.mark.gpu
@needs_cuda
def test_synced_adapter_changes_the_rollouts(smollm2_dir, tmp_path):
    """Two syncs of different adapter weights give two adapter versions that vLLM samples from."""
    from transformers import AutoTokenizer

    from train.loop import build_lora_model
    from train.vllm_rollout import VLLMRollout

    cfg = GRPOConfig(model=smollm2_dir, use_gpu=True, group_size=2, max_prompt_length=64, max_completion_length=8)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = build_lora_model(smollm2_dir, cfg)
    engine = SimpleNamespace(module=model)
    rollout = VLLMRollout(tokenizer, cfg, smollm2_dir, str(tmp_path), rank=0)
    with pytest.raises(RuntimeError, match="before the first sync"):
        rollout.generate(model, [[1, 2, 3]], 2)
    prompt = tokenizer("Say one word.")["input_ids"]
    rollout.sync(engine)
    first, finished = rollout.generate(model, [prompt], 2, seed=5)
    assert len(first) == 2 and len(finished) == 2 and all(0 < len(c) <= 8 for c in first)
    assert rollout.generate(model, [prompt], 2, seed=5)[0] == first  # same adapter, same seed, same rollouts
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    rollout.sync(engine)
    assert rollout.version == 2 and not adapter_version_dir(rollout.scratch, 1).exists()
    assert rollout.generate(model, [prompt], 2, seed=5)[0] != first
