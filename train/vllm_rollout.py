"""GRPO rollouts from a vLLM engine colocated with each Ray Train worker (GPU only), synced after every step.

Each worker builds its own offline `vllm.LLM` on the GPU it trains on (TRL's "colocate" mode: no extra GPUs, the
engine takes `rollout.gpu_memory_utilization` of the memory and DeepSpeed the rest). The policy is the base model
plus a LoRA adapter, and only the adapter trains, so the weight sync is the adapter: after each optimizer step the
worker writes it (gathered from the ZeRO-3 partitions when needed) to a worker-local directory, and the next
`generate` passes it as a `LoRARequest` with a new integer id. vLLM keys its adapter cache by that id, so a new id
per version guarantees the rollouts of step t come from the weights after step t-1 (on-policy, as with
`HFRollout`), while the base weights stay resident. Everything vLLM-specific is imported inside `VLLMRollout`;
the mappings below are pure and tested on CPU (tests/test_vllm_rollout.py; the GPU test is marked `gpu`).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def rollout_sampling_kwargs(temperature: float, top_p: float, top_k: int, max_tokens: int, group_size: int,
                            seed: int) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for one prompt's group: `n = group_size` samples.

    Our top_k 0 means no cut, which is vLLM's 0 too. The seed makes each prompt's group reproducible (a resumed
    run re-samples the same rollouts); special tokens are kept out of the text, the ids are what trains.

    >>> rollout_sampling_kwargs(1.0, 1.0, 0, 64, 8, 7)["n"]
    8
    """
    if group_size < 2 or max_tokens < 1 or temperature <= 0:
        raise ValueError(f"rollout: need group_size >= 2, max_tokens >= 1, temperature > 0; got {group_size}, "
                         f"{max_tokens}, {temperature}")
    return {"n": group_size, "temperature": temperature, "top_p": top_p, "top_k": top_k, "max_tokens": max_tokens,
            "seed": seed, "skip_special_tokens": True}


def read_group_outputs(outputs: list, group_size: int) -> tuple[list[list[int]], list[bool]]:
    """`vllm.RequestOutput`s (one per prompt, `n` samples each) -> group-major completion ids and finished flags.

    A sample finished when vLLM stopped it on a stop/EOS token ("stop"); "length" is a truncation and "abort" an
    engine failure, which is raised rather than trained on.
    """
    ids, finished = [], []
    for p, output in enumerate(outputs):
        if len(output.outputs) != group_size:
            raise RuntimeError(f"vLLM returned {len(output.outputs)} samples for prompt {p}, expected {group_size}")
        for sample in output.outputs:
            if sample.finish_reason == "abort":
                raise RuntimeError(f"vLLM aborted a rollout of prompt {p}")
            ids.append(list(sample.token_ids))
            finished.append(sample.finish_reason == "stop")
    return ids, finished


def lora_rank_slot(r: int) -> int:
    """The smallest of vLLM's LoRA rank slots (8, 16, 32, ...) that holds rank `r`.

    >>> [lora_rank_slot(r) for r in (4, 8, 12, 64)]
    [8, 8, 16, 64]
    """
    slot = 8
    while slot < r:
        slot *= 2
    return slot


def adapter_version_dir(root: str | Path, version: int) -> Path:
    """Where adapter version `version` is written; LoRA ids start at 1 (vLLM reserves 0)."""
    return Path(root) / f"policy-v{version}"


class VLLMRollout:
    """A colocated vLLM engine that samples with the policy's latest LoRA adapter (see module docstring)."""

    def __init__(self, tokenizer, cfg, model_dir: str, scratch_dir: str, rank: int):
        from vllm import LLM

        self.tokenizer, self.cfg, self.rank = tokenizer, cfg, rank
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.scratch = Path(scratch_dir) / f"vllm-rank{rank}"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.llm = LLM(model=model_dir, enable_lora=True, max_lora_rank=lora_rank_slot(cfg.lora.r), max_loras=1,
                       gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, seed=cfg.seed + rank,
                       max_model_len=cfg.max_prompt_length + cfg.max_completion_length, enable_prefix_caching=True)

    def sync(self, engine) -> None:
        """Write the current adapter as a new version (every rank calls it: ZeRO-3 gathers are collective)."""
        from train.loop import lora_state_dict

        self.version += 1
        target = adapter_version_dir(self.scratch, self.version)
        engine.module.save_pretrained(target, state_dict=lora_state_dict(engine, self.cfg.deepspeed.zero_stage))
        stale = adapter_version_dir(self.scratch, self.version - 1)
        if stale.exists():
            shutil.rmtree(stale, ignore_errors=True)

    def generate(self, model, prompts: list[list[int]], group_size: int, seed: int = 0):
        """G samples per prompt with the adapter of the last `sync`; same return value as `HFRollout.generate`.

        `seed` is the step's (distinct per rank); prompt i samples with ``seed * 1000 + i``.
        """
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        if self.version == 0:
            raise RuntimeError("VLLMRollout.generate before the first sync: the engine has no policy adapter")
        request = LoRARequest(f"policy-v{self.version}", self.version,
                              str(adapter_version_dir(self.scratch, self.version)))
        rollout = self.cfg.rollout
        max_tokens = self.cfg.max_completion_length
        params = [SamplingParams(**rollout_sampling_kwargs(rollout.temperature, rollout.top_p, rollout.top_k,
                                                           max_tokens, group_size, seed * 1_000 + i))
                  for i in range(len(prompts))]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=request,
                                    use_tqdm=False)
        return read_group_outputs(outputs, group_size)
