"""What optimizer offload costs each optimizer step: an estimate from the plan's shape and published figures, not a
measurement (pure: no torch, ray or deepspeed). `quorum plan` prints it for every trainer with
`deepspeed.offload_optimizer` (`jobs.plan_check`).

With `offload_optimizer`, DeepSpeed keeps AdamW's fp32 master weights and moments on the host and steps them there
(DeepSpeed 0.19.8, `runtime/zero/stage3.py`, `stage_1_and_2.py`). Per optimizer step each rank

- copies its partition's gradients to the host in fp32, 4 bytes a parameter: the GPU converts them to the master
  dtype before the copy (`_offload_grad_partition_at_boundary`: `grad_buffer.to(dtype=master_weights_and_grads_dtype)`;
  ZeRO-2 `async_inplace_copy_grad_to_fp32_buffer_from_gpu`), once per step, at the accumulation boundary;
- runs the optimizer on the host over its partition: the trainer's torch AdamW (`train.ds_config` sets
  `zero_force_ds_cpu_optimizer: false`), with `cpus_per_worker` threads (OMP_NUM_THREADS);
- copies the updated weights back to the GPU in the weights' dtype, 2 bytes a parameter at bf16 (`_reassign_or_swap_
  out_partitioned_parameters`: a blocking host-to-device `copy_` from the fp32 master converts on the host, torch's
  copy rule, so only the 16-bit values cross).

Figures the estimate takes:

- the host link per direction, `HOST_LINK_GBPS`: PCIe 4.0 x16 (A10G, L4, A100) carries at most 32 GB/s a direction,
  PCIe 5.0 x16 (H100, H200) 64; the estimate assumes three quarters of that for pinned copies, each GPU on its own
  x16 link;
- torch's Adam on the host: 56 s for one step of an 11.6B-parameter GPT-2, against 8.2 s for DeepSpeed's
  DeepSpeedCPUAdam on the same model, as DeepSpeed's maintainers measured it (DeepSpeed PR #735, "CPU-Adam fix for
  scalar mode", February 2021): 4.8 and 0.71 ns a parameter. That host (a DGX-2's two 24-core Xeons) is not the
  worker's: a rank here steps with `cpus_per_worker` threads while the node's other ranks step theirs, so the
  host's share can be slower; DeepSpeed's ZeRO-Offload tutorial puts DeepSpeedCPUAdam at 5-7x torch's Adam.

    cost = offload_cost(plan)   # None without offload_optimizer
    cost.seconds                # link copies + host AdamW, per optimizer step and rank
"""

from __future__ import annotations

import dataclasses

from train.memory_budget import WorkerPlan

# host <-> GPU copy rate assumed per direction, GB/s (1e9 B/s): three quarters of the PCIe x16 link's peak
HOST_LINK_GBPS = {"A10G": 24.0, "L4": 24.0, "A100-40G": 24.0, "A100-80G": 24.0, "H100": 48.0, "H200": 48.0}
# seconds a parameter of one host Adam step (DeepSpeed PR #735: an 11.6B-parameter GPT-2, 56 s with torch's Adam,
# 8.2 s with DeepSpeedCPUAdam)
TORCH_HOST_ADAM_S = 56 / 11.6e9
DS_CPU_ADAM_S = 8.2 / 11.6e9
MEASURED = "DeepSpeed PR #735's 4.8 ns a parameter for torch's CPU Adam"


@dataclasses.dataclass(frozen=True)
class OffloadCost:
    """One rank's share of one optimizer step."""

    params: float  # the rank's partition of the trainable parameters
    bytes_down: float  # its fp32 gradients, GPU -> host
    bytes_up: float  # its updated weights in their dtype, host -> GPU
    link_gbps: float
    link_s: float
    adam_s: float  # torch AdamW on the host (what the trainer runs)
    ds_adam_s: float  # DeepSpeedCPUAdam at its published rate, for comparison

    @property
    def seconds(self) -> float:
        """Copies and host step added up: DeepSpeed steps a sub-group, then copies it back (the gradients' copy, in
        the last micro-batch's backward, may overlap it: the sum leans high)."""
        return self.link_s + self.adam_s


def offload_cost(plan: WorkerPlan) -> OffloadCost | None:
    """The estimate for one optimizer step of `plan` (module docstring); None without optimizer offload.

    >>> from train.model_shape import model_shape
    >>> from train.memory_budget import WorkerPlan
    >>> plan = WorkerPlan(model_shape("hf:Qwen/Qwen3-4B"), "A10G", 8, "bf16", 3, True, False, 0, "all-linear", 2,
    ...                   4096, 4096, True, 32, "vllm", 0.6, 1, 1024)
    >>> c = offload_cost(plan)   # Qwen3-4B over 8 A10G ranks: 502.8M parameters a rank
    >>> round(c.bytes_down / 1e9, 2), round(c.bytes_up / 1e9, 2), round(c.link_s, 3), round(c.adam_s, 2)
    (2.01, 1.01, 0.126, 2.43)
    """
    if not plan.offload_optimizer:
        return None
    shape = plan.shape
    trainable = shape.lora_params(plan.lora_r, plan.lora_targets) if plan.lora_r else shape.n_params
    params = trainable / plan.num_workers  # ZeRO-2 and -3 partition the optimizer over the ranks
    weight_bytes = 2 if plan.precision in ("bf16", "fp16") else 4
    down, up = params * 4, params * weight_bytes
    rate = HOST_LINK_GBPS[plan.gpu_type]
    return OffloadCost(params=params, bytes_down=down, bytes_up=up, link_gbps=rate, link_s=(down + up) / (rate * 1e9),
                       adam_s=params * TORCH_HOST_ADAM_S, ds_adam_s=params * DS_CPU_ADAM_S)


def describe(cost: OffloadCost, key: str, steps: int = 1) -> str:
    """One line of `quorum plan`'s notes; `steps` optimizer steps per training step (GRPO's num_iterations)."""
    per = f" ({steps} optimizer steps a training step)" if steps > 1 else ""
    return (f"{key}.deepspeed.offload_optimizer costs each rank about {cost.seconds:.1f} s per optimizer step{per}, an "
            f"estimate (train/offload_cost.py), not a measurement: {cost.bytes_down / 1e9:.2f} GB of fp32 gradients to "
            f"the host and {cost.bytes_up / 1e9:.2f} GB of weights back ({cost.link_s:.2f} s at an assumed "
            f"{cost.link_gbps:g} GB/s a direction), and torch AdamW on the host over {cost.params / 1e6:.0f}M "
            f"parameters ({cost.adam_s:.2f} s at {MEASURED}; DeepSpeedCPUAdam's 0.71 ns would take "
            f"{cost.ds_adam_s:.2f} s)")
