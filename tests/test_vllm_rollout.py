"""train.grpo.rollout_vllm: the pure mappings on CPU; a real colocated vLLM engine with adapter sync on a CUDA machine.

GPU run: `python -m pytest tests/test_vllm_rollout.py -m gpu -q` (needs `pip install -e '.[gpu]'`).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import pytest
import torch

from train.config import GRPOConfig, LoraSection, RolloutSection
from train.grpo.rollout_vllm import (
    SLEEP_LEVEL,
    VLLMRollout,
    adapter_version_dir,
    colocated_engine_args,
    read_group_outputs,
    rollout_sampling_kwargs,
    visible_gpu_count,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def output(*samples: tuple[list[int], str]) -> SimpleNamespace:
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason=why) for ids, why in samples])


def test_sampling_kwargs_ask_for_the_whole_group_in_one_request():
    assert rollout_sampling_kwargs(0.9, 0.95, 0, 48, 4, 123) == {
        "n": 4, "temperature": 0.9, "top_p": 0.95, "top_k": 0, "max_tokens": 48, "seed": 123,
        "skip_special_tokens": True}
    # validation samples one answer per prompt (train/grpo/validate.py, val_metric vs_baseline)
    assert rollout_sampling_kwargs(0.9, 0.95, 0, 48, 1, 5)["n"] == 1
    with pytest.raises(ValueError, match="group_size >= 1"):
        rollout_sampling_kwargs(1.0, 1.0, 0, 48, 0, 0)
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


# ----- the colocated engine: which GPU, which arguments, when it sleeps -----


def vllm_device(env: dict, cuda_visible_devices: str) -> str:
    """The physical GPU vLLM opens for these engine settings, by vLLM's own rules: the external launcher takes
    `local_rank = int(os.environ["LOCAL_RANK"])` (vllm/v1/executor/uniproc_executor.py, ExecutorWithExternalLauncher.
    _distributed_args); the GPU worker opens `cuda:<local_rank>` among the visible devices (vllm/v1/worker/
    gpu_worker.py init_device -> platforms/interface.py device_id_to_physical_device_id: CUDA_VISIBLE_DEVICES
    [local_rank]). Without the external launcher the uniprocess executor takes local_rank 0 for a plain "cuda"."""
    return cuda_visible_devices.split(",")[int(env["LOCAL_RANK"])]


def test_each_rank_of_a_four_gpu_node_gets_its_own_gpu():
    # two 4-GPU nodes; Ray Train shows each worker its node's 4 GPUs and numbers them 0-3 within the node
    devices = {}
    for rank in range(8):
        node, local_rank = divmod(rank, 4)
        kwargs, env = colocated_engine_args("/models/qwen", rank=rank, local_rank=local_rank, world_size=8,
                                            lora_rank=64, gpu_memory_utilization=0.3, max_model_len=4096, seed=3,
                                            visible_gpus=4)
        assert kwargs["distributed_executor_backend"] == "external_launcher" and kwargs["tensor_parallel_size"] == 1
        assert env == {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "8",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        assert kwargs["seed"] == 3 + rank  # ranks sample different rollouts
        devices[rank] = (node, vllm_device(env, "0,1,2,3"))
    assert sorted(devices.values()) == [(n, g) for n in (0, 1) for g in "0123"]


def test_colocated_engine_holds_the_lora_rank_and_sleeps_on_cuda():
    kwargs, _ = colocated_engine_args("/m", rank=0, local_rank=0, world_size=1, lora_rank=64,
                                      gpu_memory_utilization=0.3, max_model_len=1024, seed=0)
    assert kwargs == {"model": "/m", "distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1,
                      "enable_lora": True, "max_lora_rank": 64, "max_loras": 1, "gpu_memory_utilization": 0.3,
                      "enable_sleep_mode": True, "seed": 0, "max_model_len": 1024, "enable_prefix_caching": True}
    cpu, _ = colocated_engine_args("/m", rank=0, local_rank=0, world_size=1, lora_rank=12,
                                   gpu_memory_utilization=0.3, max_model_len=1024, seed=0, sleep_mode=False)
    assert (cpu["enable_sleep_mode"], cpu["max_lora_rank"]) == (False, 16)


def test_a_worker_that_cannot_see_its_gpu_or_a_bad_rank_is_refused():
    # Ray Train's share_cuda_visible_devices off: worker 2 sees only its own GPU, cuda:2 does not exist
    with pytest.raises(ValueError, match="LOCAL_RANK 2 but sees 1 GPU"):
        colocated_engine_args("/m", rank=2, local_rank=2, world_size=4, lora_rank=16, gpu_memory_utilization=0.3,
                              max_model_len=64, seed=0, visible_gpus=1)
    with pytest.raises(ValueError, match="local_rank <= rank < world_size"):
        colocated_engine_args("/m", rank=4, local_rank=0, world_size=4, lora_rank=16, gpu_memory_utilization=0.3,
                              max_model_len=64, seed=0)
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == 4 and visible_gpu_count({}) is None


class RecordingLLM:
    """`vllm.LLM` at the edge of the world: records its arguments, the environment it saw, and every call."""

    built: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING")}
        self.calls = [("LLM",)]
        RecordingLLM.built.append(self)

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append(("generate", lora_request.lora_int_id))
        if prompts[0]["prompt_token_ids"] == [666]:
            raise RuntimeError("engine failed")
        sample = SimpleNamespace(token_ids=[7, 0], finish_reason="stop")
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
    RecordingLLM.built = []
    return RecordingLLM


def test_the_rollout_engines_of_a_four_gpu_node_open_four_gpus(fake_vllm, monkeypatch, tmp_path):
    cfg = GRPOConfig(rollout=RolloutSection(kind="vllm"), lora=LoraSection(r=64, alpha=128), use_gpu=True)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # what Ray Train gives each worker of the node
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        VLLMRollout(tokenizer, cfg, "/models/judge", str(tmp_path), rank)
    engines = fake_vllm.built
    assert [e.kwargs["distributed_executor_backend"] for e in engines] == ["external_launcher"] * 4
    assert {e.env["VLLM_ENABLE_V1_MULTIPROCESSING"] for e in engines} == {"0"}
    assert sorted(vllm_device(e.env, e.env["CUDA_VISIBLE_DEVICES"]) for e in engines) == ["0", "1", "2", "3"]
    assert {e.kwargs["max_lora_rank"] for e in engines} == {64}


def test_the_engine_wakes_for_rollouts_and_sleeps_around_training(fake_vllm, monkeypatch, tmp_path):
    cfg = GRPOConfig(rollout=RolloutSection(kind="vllm"), use_gpu=True, group_size=2)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    rollout = VLLMRollout(SimpleNamespace(pad_token_id=0, eos_token_id=0), cfg, "/m", str(tmp_path), 0,
                          sleep_mode=True)
    [llm] = fake_vllm.built
    assert llm.kwargs["enable_sleep_mode"] is True
    assert llm.calls == [("LLM",), ("sleep", SLEEP_LEVEL)]  # asleep through the first sync and training step
    for step in (1, 2):
        rollout.version = step  # what `sync` does after writing the adapter (tested on a GPU below)
        ids, finished = rollout.generate(None, [[1, 2], [3]], 2, seed=step)
        assert ids == [[7, 0]] * 4 and finished == [True] * 4
    assert llm.calls[2:] == [("wake_up", None), ("generate", 1), ("sleep", 1),
                             ("wake_up", None), ("generate", 2), ("sleep", 1)]
    with pytest.raises(RuntimeError, match="engine failed"):  # a failed rollout leaves the GPU to training too
        rollout.generate(None, [[666]], 2)
    assert llm.calls[-3:] == [("wake_up", None), ("generate", 2), ("sleep", 1)]


def test_without_sleep_mode_the_engine_is_never_put_to_sleep(fake_vllm, monkeypatch, tmp_path):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    rollout = VLLMRollout(SimpleNamespace(pad_token_id=0, eos_token_id=0), GRPOConfig(group_size=2), "/m",
                          str(tmp_path), 0, sleep_mode=False)
    rollout.version = 1
    rollout.generate(None, [[1]], 2)
    assert fake_vllm.built[0].calls == [("LLM",), ("generate", 1)]
    assert fake_vllm.built[0].kwargs["enable_sleep_mode"] is False


def test_outside_a_ray_train_worker_the_engine_says_what_is_missing(fake_vllm, monkeypatch, tmp_path):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(RuntimeError, match="inside a Ray Train worker, which sets LOCAL_RANK"):
        VLLMRollout(SimpleNamespace(pad_token_id=0, eos_token_id=0), GRPOConfig(), "/m", str(tmp_path), 0)


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
def test_synced_adapter_changes_the_rollouts(smollm2_dir, tmp_path, monkeypatch):
    """Two syncs of different adapter weights give two adapter versions that vLLM samples from."""
    from transformers import AutoTokenizer

    from tests.ray_head import free_ports

    # one Ray Train worker's environment; vLLM's external launcher starts the process group of one itself
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_ports(1)[0]))):
        monkeypatch.setenv(name, value)

    from train.engine import build_lora_model
    from train.grpo.rollout_vllm import VLLMRollout

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
