"""Does one vLLM engine fit its GPUs? The memory of an inference engine (a Ray Data pool's actor, a Serve replica),
from the model's shape and the engine's settings, before any work (pure: no torch, ray, vllm or deepspeed).

vLLM takes `gpu_memory_utilization` of every GPU the engine shards over (`tensor_parallel_size` of them) and refuses
to start when that share is not free (`train.memory_budget`'s docstring cites the check). Inside the share it keeps,
per GPU (all figures GiB):

- the weights: the parameters over the tensor-parallel ranks, 2 bytes each in bf16/fp16 (4 in float32), or the
  checkpoint's quantised width with its group scales (`quantization_config` of an AWQ / GPTQ config.json) for all but
  the embedding and output head, which stay bf16;
- one LoRA slot of rank `max_lora_rank` when the engine serves an adapter (`lora_rank_slot`: the smallest of vLLM's
  ranks that holds it), bf16 A and B matrices on the adapter's target modules, sharded like the weights;
- its profile run's activations, sampler and CUDA graphs (`VLLM_RESERVE_GIB`, the same reserve the GRPO budget uses);
- the KV cache: the rest. vLLM refuses a `max_model_len` its KV cache cannot hold one sequence of, so the engine
  needs at least one full sequence; the plan also reports how many full sequences of `max_model_len` the rest holds
  (the engine's batch of longest prompts). Each rank holds `ceil(kv_heads / tp)` KV heads of every layer (vLLM
  replicates a KV head when there are more ranks than heads).

    EngineFit(shape, gpu_type="A10G", tensor_parallel=1, utilization=0.85, max_model_len=4096).budget()
"""

from __future__ import annotations

import dataclasses
import math

from train.memory_budget import GIB, GPU_MEMORY_MIB, VLLM_LORA_RANK_SLOTS, VLLM_RESERVE_GIB, lora_rank_slot
from train.model_shape import ModelShape


def gpu_gib(gpu_type: str) -> float:
    """A GPU's memory as the driver reports it, GiB.

    >>> round(gpu_gib("A10G"), 2)
    22.49
    """
    return GPU_MEMORY_MIB[gpu_type] / 1024


@dataclasses.dataclass(frozen=True)
class EngineFit:
    """One vLLM engine's memory inputs."""

    shape: ModelShape
    gpu_type: str
    tensor_parallel: int
    utilization: float
    max_model_len: int
    # bytes per weight: 2 (bf16 / fp16), 4 (float32), 0.5 (4-bit AWQ / GPTQ)
    weight_bytes: float = 2.0
    # the adapter's LoRA rank and target modules; 0 = no adapter (LoRA off)
    lora_rank: int = 0
    lora_targets: list[str] | str = "all-linear"

    def budget(self) -> dict[str, float]:
        """GiB per GPU: share, weights, lora_slot, reserve, need (the least the engine starts with), kv_cache (what
        the share leaves for it), kv_per_sequence and sequences (full `max_model_len` sequences the KV cache holds)."""
        tp, shape = self.tensor_parallel, self.shape
        share = self.utilization * gpu_gib(self.gpu_type)
        # a quantised checkpoint keeps its embedding and output head in bf16 (AWQ / GPTQ quantise the linears only)
        embeddings = shape.embedding_params * (1 if shape.tied else 2) if self.weight_bytes < 2 else 0
        weights = ((shape.n_params - embeddings) * self.weight_bytes + embeddings * 2) / tp / GIB
        lora = shape.lora_params(lora_rank_slot(self.lora_rank), self.lora_targets) * 2 / tp / GIB \
            if self.lora_rank else 0.0
        per_token = 2 * shape.layers * math.ceil(shape.kv_heads / tp) * shape.head_dim * 2
        per_sequence = self.max_model_len * per_token / GIB
        kv = share - weights - lora - VLLM_RESERVE_GIB
        return {"share": share, "weights": weights, "lora_slot": lora, "reserve": VLLM_RESERVE_GIB,
                "need": weights + lora + VLLM_RESERVE_GIB + per_sequence, "kv_cache": kv,
                "kv_per_sequence": per_sequence, "sequences": max(kv, 0.0) / per_sequence}


def problems(fit: EngineFit, key: str) -> list[tuple[str, str]]:
    """(dotted key, message) for an engine that cannot start on its GPUs; [] when it fits. `key` is the engine's
    config key (its settings are `<key>.gpu_memory_utilization`, ...)."""
    found = []
    b = fit.budget()
    if b["share"] < b["need"]:
        gpu = gpu_gib(fit.gpu_type)
        low = math.ceil(b["need"] / gpu * 100) / 100
        more = (f"raise {key}.gpu_memory_utilization to at least {low:.2f}" if low <= 0.95
                else f"raise {key}.tensor_parallel_size (and its pool's num_gpus)")
        found.append((f"{key}.gpu_memory_utilization", (
            f"{fit.utilization} of an {fit.gpu_type} ({gpu:.2f} GiB) is {b['share']:.2f} GiB per GPU, less than the "
            f"engine needs at tensor_parallel_size {fit.tensor_parallel}: {b['need']:.2f} GiB (weights "
            f"{b['weights']:.2f}" + (f", LoRA slot {b['lora_slot']:.2f}" if b["lora_slot"] else "")
            + f", reserve {b['reserve']:.2f}, KV cache of one {fit.max_model_len}-token sequence "
            f"{b['kv_per_sequence']:.2f}); {more}, shorten {key}.max_model_len, or name a bigger GPU")))
    return found


def rank_problems(rank: int, key: str) -> list[tuple[str, str]]:
    """A LoRA rank above the largest `max_lora_rank` vLLM serves (its engine refuses to load the adapter)."""
    if rank > VLLM_LORA_RANK_SLOTS[-1]:
        return [(key, (f"LoRA rank {rank} is above the largest max_lora_rank vLLM serves ({VLLM_LORA_RANK_SLOTS[-1]}): "
                      "its engine cannot load the adapter; train at a lower rank"))]
    return []


def weight_bytes(hf_config: dict, dtype: str = "auto") -> float:
    """Bytes per weight of an engine's linear layers: a quantised checkpoint's width plus its per-group scale (fp16)
    and zero point (`bits`) every `group_size` weights (AWQ / GPTQ), else its dtype's (2 for bf16 / fp16).

    >>> weight_bytes({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    0.51953125
    >>> weight_bytes({}, "float32"), weight_bytes({})
    (4.0, 2.0)
    """
    quant = hf_config.get("quantization_config") or {}
    bits = quant.get("bits")
    if bits:
        group = int(quant.get("group_size") or 0)
        return int(bits) / 8 + ((2 + int(bits) / 8) / group if group > 0 else 0.0)
    return 4.0 if dtype == "float32" else 2.0  # vLLM's "auto" runs a float32 checkpoint in bf16
