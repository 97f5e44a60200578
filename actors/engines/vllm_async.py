"""Chat engine on vLLM's `AsyncLLM` (GPU; vLLM's CPU build in tests): each request joins the running batch at once.

    engine = AsyncVLLMEngine(EngineSpec(kind="vllm", model="hf:Qwen/Qwen3-8B", adapter="runs/judge/adapter"))
    completion = await engine.complete(request)          # continuously batched with every request in flight
    completions = await engine.complete_many(requests)   # order kept
    engine.close()

`actors.engines.vllm_sync.VLLMEngine` runs one offline `LLM.chat` per batch: a caller waits for the batch's slowest row,
and rows that arrive meanwhile wait for the next batch. Here every `complete` is its own `AsyncLLM.generate`
request: vLLM's scheduler adds it to the running batch at the next step and returns it as soon as it finishes, so
a short judgment never waits behind a long one. The engine core runs in its own process (AsyncLLM's multiprocess
client), so the caller's event loop stays free while the model steps.

Same `EngineSpec` and the same mappings as `VLLMEngine` (`build_llm_kwargs`, `build_sampling_params` with the
grammar as a guidance structured output, `chat_template_kwargs`, `to_completion` with its thinking split); the
chat is rendered by vLLM's own renderer exactly as `LLM.chat` renders it (vllm/entrypoints/common/offline.py
`_preprocess_chat`: generation prompt on, template-added special tokens not added again).

The adapter is a LoRA request per call, never merged: the base weights stay resident and `set_adapter` swaps the
adapter between requests without a reload, as long as the engine was started with LoRA on and the new adapter's
rank fits the slot (`can_swap_to`). Requests in flight keep the adapter they started with; a new adapter gets a new
integer id because vLLM caches loaded adapters by id. Two slots (`max_loras=2`), so requests on the new adapter
start while the last ones on the old adapter finish.

Shutdown: `close` (or, for an engine its owner never closed, interpreter exit) shuts the engine down in order while
every module is loaded: the engine core process stops and its IPC and shared-memory segments are released
(`vllm_sync.shutdown_vllm`). Left to AsyncLLM's own `__del__`, the shutdown ran during interpreter teardown, where
it failed part-way (`TypeError: 'NoneType' object is not callable`, module globals already cleared) and left its
`/dev/shm/psm_*` segments behind.

`vllm` is imported inside the class only: this module imports on machines without vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
import weakref

from actors.engines.base import ChatRequest, Completion, EngineSpec
from actors.engines.hf.constrained import special_tags
from actors.engines.vllm_sync import (
    adapter_lora_rank,
    build_llm_kwargs,
    build_sampling_params,
    chat_template_kwargs,
    check_extra_args,
    cpu_platform_args,
    on_cpu_platform,
    shutdown_vllm,
    to_completion,
)

# adapters of one engine: the spec's and each swapped-in one (ids are positive: vLLM reads 0 as "no adapter")
_LORA_IDS = itertools.count(1)


def engine_error_text(exc: BaseException) -> str:
    """`Type: message` of an engine failure; AsyncLLM wraps unexpected errors in an empty `EngineGenerateError`,
    so its cause is named too."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    cause = exc.__cause__
    return f"{text} ({type(cause).__name__}: {cause})" if cause is not None else text


class AsyncVLLMEngine:
    """An `AsyncLLM` with quorum's request and completion types. Call its coroutines from one event loop."""

    def __init__(self, spec: EngineSpec, extra_args: dict | None = None):
        """Start the engine (loads the model; blocks: call it from a thread inside an event loop).

        Args:
            spec: the engine spec, as for `VLLMEngine` (kind "vllm").
            extra_args: further `AsyncEngineArgs` keyword arguments (enforce_eager, max_num_seqs, ...); keys the
                spec sets are refused (`check_extra_args`).
        """
        from actors.models import resolve_model_dir

        kwargs = {**build_llm_kwargs(spec, resolve_model_dir(spec.model)), **check_extra_args(extra_args)}
        if on_cpu_platform():  # seeded requests and chunked prefill on vLLM's CPU build (vllm_sync.cpu_platform_args)
            kwargs = {**cpu_platform_args(spec.max_model_len), **kwargs}
        if spec.adapter:
            # one slot for the adapter in use and one for the next, so a swap never waits for in-flight requests
            kwargs["max_loras"] = 2
        kwargs.setdefault("disable_log_stats", True)  # as `vllm.LLM`: no periodic stats lines in the caller's log
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if isinstance(kwargs.get("structured_outputs_config"), dict):
            kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
        self.spec = spec
        self.lora_rank_slot = kwargs.get("max_lora_rank", 0) if kwargs["enable_lora"] else 0
        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        # shut down explicitly: on `close`, or at interpreter exit while every module is still loaded (atexit; a Ray
        # actor's graceful exit runs it), never from AsyncLLM's own __del__ at teardown (module docstring)
        self._finalizer = weakref.finalize(self, shutdown_vllm, self._engine)
        from vllm.renderers import ChatParams

        self._tags = special_tags(self._engine.get_tokenizer())
        renderer = self._engine.renderer
        # LLM.chat's rendering (vllm/entrypoints/common/offline.py `_preprocess_chat`) for text-only chats
        self._chat_params = ChatParams(chat_template_kwargs={
            **chat_template_kwargs(spec), "add_generation_prompt": True, "continue_final_message": False,
            "tokenize": False})
        self._tok_params = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
        self._lora = None
        self.adapter = ""
        if spec.adapter:
            self.set_adapter(spec.adapter)
        self.in_flight = 0

    def __repr__(self) -> str:
        return f"AsyncVLLMEngine(model={self.spec.model!r}, adapter={self.adapter!r})"

    def can_swap_to(self, adapter: str) -> bool:
        """Whether `set_adapter(adapter)` works without a reload: no adapter, or LoRA on and its rank fits."""
        return not adapter or (self.lora_rank_slot > 0 and adapter_lora_rank(adapter) <= self.lora_rank_slot)

    def set_adapter(self, adapter: str) -> None:
        """Serve `adapter` ("" = the base model) from the next request on; requests in flight keep theirs.

        Raises:
            ValueError: the engine has no LoRA slot of that rank (`can_swap_to`): it must be rebuilt.
        """
        if not self.can_swap_to(adapter):
            raise ValueError(f"engine.adapter: {adapter} (rank {adapter_lora_rank(adapter)}) needs a LoRA slot of "
                             f"that rank; this engine's is {self.lora_rank_slot or 'off'}: rebuild the engine")
        if not adapter:
            self._lora, self.adapter = None, ""
            return
        from vllm.lora.request import LoRARequest

        lora_id = next(_LORA_IDS)
        self._lora, self.adapter = LoRARequest(f"adapter-{lora_id}", lora_id, adapter), adapter

    async def complete(self, request: ChatRequest) -> Completion:
        """One completion, generated alongside every other request in flight.

        Whatever goes wrong with this request (sampling settings vLLM rejects, a prompt longer than
        `max_model_len`, an engine failure) becomes its own `finish_reason="error"` completion; cancelling the
        caller aborts the request inside vLLM.
        """
        lora = self._lora  # the adapter at arrival, even if it is swapped while this request runs
        self.in_flight += 1
        try:
            from vllm.sampling_params import RequestOutputKind

            params = build_sampling_params(request.sampling, self._tags)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # one output at the end, no per-token streaming
            _, (prompt,) = await self._engine.renderer.render_chat_async(
                [request.messages], self._chat_params, self._tok_params)
            final = None
            # ids must be unique among requests in flight: the caller's id (for vLLM's logs) made unique
            request_id = f"{request.request_id}-{uuid.uuid4().hex}" if request.request_id else uuid.uuid4().hex
            async for output in self._engine.generate(prompt, params, request_id, lora_request=lora):
                final = output
            if final is None:
                return Completion(text="", finish_reason="error", error="vllm returned no output")
            return to_completion(final)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - this request's failure is its own answer, never its neighbours'
            return Completion(text="", finish_reason="error", error=engine_error_text(exc))
        finally:
            self.in_flight -= 1

    async def complete_many(self, requests: list[ChatRequest]) -> list[Completion]:
        """Every request in flight at once; results keep the input order."""
        return list(await asyncio.gather(*(self.complete(r) for r in requests)))

    async def check_health(self) -> None:
        """Raises when the engine core is dead (AsyncLLM's own check)."""
        await self._engine.check_health()

    @property
    def errored(self) -> bool:
        return self._engine is None or self._engine.errored

    def close(self) -> None:
        """Stop the engine core process and free its memory and shared-memory segments; requests still in flight
        fail. Idempotent."""
        self._engine = None
        self._finalizer()
