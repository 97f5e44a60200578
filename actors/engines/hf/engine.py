"""The `hf` engine: chat completions from a transformers causal LM on CPU or GPU, batched for throughput.

    from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
    from actors.engines.hf.engine import HFEngine
    engine = HFEngine(EngineSpec(model="smollm2-135m"))
    [answer] = engine.generate([ChatRequest([{"role": "user", "content": "Simplify: ..."}])])

What makes it fast on a small CPU (measured in `bench/generate.py`, see bench/README.md):

- bfloat16 on CPUs with native bf16 dot products (avx512_bf16 / AMX) when a quick matmul probe confirms it;
- nn.Linear weights pre-reordered into oneDNN's blocked layout (`actors.engines.hf.weights.PackedLinear`): the skinny
  decode matmuls stream weights far faster, with bit-identical results in bf16 and results within float32
  rounding of MKL's in float32 (another summation order; the dtype `auto` picks on CPUs without native bf16); in
  Llama layers q/k/v and gate/up run as one such matmul each (`actors.engines.hf.fused`), probed the same way;
- prompts sorted by length and continuous batching with a preallocated KV cache (`actors.engines.hf.decode`);
- a prompt prefix shared by the requests of a call (a judge's instructions and few-shot examples; per group of
  requests when a call mixes templates) is prefilled once (`enable_prefix_caching`, on by default).

Greedy decoding (temperature 0) gives the same tokens as `model.generate(do_sample=False)` on the unmodified model
(tests/test_hf_fast_path.py pins this at float32 on SmolLM2-135M).
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from pathlib import Path

import jinja2
import torch
from transformers import AutoTokenizer

from actors.engines.base import ChatRequest, Completion, EngineSpec, SamplingParams, split_thinking
from actors.engines.hf.decode import DecodeRow, DecodeSettings, DecodeStats, run_decode
from actors.engines.hf.fused import fuse_decoder_layers
from actors.engines.hf.int8 import quantize_linear_layers
from actors.engines.hf.prefix_attention import attention_backends, use_prefix_attention
from actors.engines.hf.weights import DTYPES, load_model, pack_linear_layers, pick_device, pick_dtype
from actors.models import resolve_model_dir
from actors.threads import decode_tuner, set_torch_threads, use_threads

# A shared prompt prefix shorter than this is recomputed per row; a longer one is shared where it saves enough prefill
# (actors.engines.hf.shared_prefix.plan_prefixes).
_MIN_SHARED_PREFIX = 16
# On CUDA a shared prefix is copied into every row, never held (cascade attention): there a decode step is bound by
# kernel launches, and the cascade path's float32 matrix products and softmax merge add ~40 small kernels per layer.
# bench.generate's 44-token prefix on an H100, 16 / 64 rows per step: held 278 / 1,141 tok/s, copied 539 / 2,214,
# not shared 488 / 2,140-2,793 (docs/engine.md; bench.gpu_engine). Copying keeps the prefill saved and costs no step time.
_NEVER_HELD = 2**62


def min_held_prefix_columns(device: torch.device) -> int:
    """`DecodeSettings.min_held_prefix_columns` on `device`: CPU engines hold a prefix that saves enough attention
    columns; CUDA engines copy every shared prefix (see `_NEVER_HELD`)."""
    return DecodeSettings.min_held_prefix_columns if device.type == "cpu" else _NEVER_HELD


class HFEngine:
    """Engine over a transformers causal LM. See module docstring.

    Args:
        spec: which model, device, dtype, batch size and thread count to use.

    Raises:
        ValueError: a spec field is invalid (the message names it), or the model has no chat template.
    """

    def __init__(self, spec: EngineSpec):
        validate_spec(spec)
        self.spec = spec
        # engine.num_threads if pinned, else the CPUs Ray assigned this actor (actors.threads)
        self.threads = set_torch_threads(spec.num_threads)
        self.device = pick_device(spec.device)
        if spec.quantize == "int8" and self.device.type != "cpu":
            raise ValueError(f"engine.quantize: int8 runs on CPU; engine.device resolved to {self.device}")
        # int8 layers take float32 inputs (actors.engines.hf.int8): `auto` is float32 then, whatever the CPU has
        self.dtype = torch.float32 if spec.quantize == "int8" else pick_dtype(spec.dtype, self.device)
        model_dir = resolve_model_dir(spec.model)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not self.tokenizer.chat_template:
            raise ValueError(f"engine.model: {spec.model!r} has no chat template in its tokenizer")
        self.model = load_model(model_dir, spec.adapter, self.dtype).to(self.device).eval()
        use_prefix_attention(self.model)  # shared prompt prefixes held once per group of rows
        self.packed_layers = self.fused_modules = self.int8_layers = 0
        if spec.quantize == "int8":
            # q/k/v and gate/up fused (plain), every decoder projection int8, the LM head prepacked at float32
            self.fused_modules = fuse_decoder_layers(self.model, spec.max_batch_size, pack=False)
            self.int8_layers = quantize_linear_layers(self.model, spec.max_batch_size)
            self.packed_layers = pack_linear_layers(self.model, spec.max_batch_size)
        elif self.device.type == "cpu" and self.dtype in (torch.bfloat16, torch.float32):
            # q/k/v and gate/up as one prepacked matmul each (Llama layers), then every other linear prepacked;
            # at float32 too, the dtype of CPUs without native bf16 (weights.PackedLinear; docs/engine.md: 1.2-3x a layer)
            self.fused_modules = fuse_decoder_layers(self.model, spec.max_batch_size)
            self.packed_layers = pack_linear_layers(self.model, spec.max_batch_size)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        eos_ids = collect_eos_ids(self.model, self.tokenizer)
        pad_id = self.tokenizer.pad_token_id
        self.settings = DecodeSettings(
            eos_ids=eos_ids,
            # Pad columns are masked out, so any valid id works when the tokenizer defines none.
            pad_id=pad_id if pad_id is not None else min(eos_ids, default=0),
            num_layers=self.model.config.get_text_config().num_hidden_layers,
            max_batch_size=spec.max_batch_size,
            decode=self._decode,
            logits_to_keep="logits_to_keep" in inspect.signature(self.model.forward).parameters,
            min_shared_prefix=_MIN_SHARED_PREFIX if spec.enable_prefix_caching else 0,
            min_held_prefix_columns=min_held_prefix_columns(self.device),
            fast_forward=spec.fast_forward,
        )
        # compiled lazily on the first request with a grammar (actors.engines.hf.constrained)
        self._grammars = None
        self.warm_up()
        # picks each decode step's thread count up to `self.threads`; kept across calls, it learns the load
        self.tuner = decode_tuner(spec.adaptive_threads, self.device, self.threads)
        # prompt / prefill token counts and decode steps per thread count of the last `generate` call
        self.last_stats = DecodeStats()

    def warm_up(self) -> None:
        """Decode two tokens for two short prompts, so oneDNN builds its kernels before the first real batch.

        Otherwise the first batch an actor serves pays that one-off cost (a second or more on CPU), which skews
        its latency and any throughput measured from the moment the model is loaded.
        """
        ids = self.tokenizer("Simplify: the cat sat on the mat.", add_special_tokens=False).input_ids
        rows = [DecodeRow(prompt_ids=ids, sampling=SamplingParams(max_tokens=2)) for _ in range(2)]
        run_decode(self.model, rows, self.settings)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """Complete each request; the result list is in request order.

        A prompt longer than the model's context gets a Completion with finish_reason "error"; malformed
        requests raise before any work starts.
        """
        if self.model is None:
            raise RuntimeError("HFEngine.generate: the engine is closed")
        for i, request in enumerate(requests):
            validate_request(i, request)
        prompts = [self._encode(request.messages) for request in requests]
        rows: dict[int, DecodeRow] = {}
        errors: dict[int, str] = {}
        for i, (request, prompt) in enumerate(zip(requests, prompts)):
            room = self.max_positions - len(prompt) if self.max_positions else request.sampling.max_tokens
            if room < 1:
                errors[i] = f"prompt has {len(prompt)} tokens; the model's context is {self.max_positions}"
                continue
            sampling = request.sampling
            if sampling.max_tokens > room:
                sampling = dataclasses.replace(sampling, max_tokens=room)
            try:
                matcher = self._grammar_matcher(sampling.grammar) if sampling.grammar else None
            except ValueError as exc:
                errors[i] = str(exc)
                continue
            rows[i] = DecodeRow(prompt_ids=prompt, sampling=sampling, matcher=matcher)
        # Longest first: prompts admitted together have similar lengths, so their prefill pads little.
        order = sorted(rows, key=lambda i: -len(rows[i].prompt_ids))
        if self.tuner is None and self.device.type == "cpu":
            use_threads(self.threads)  # another engine's tuner in this process may have lowered it
        with attention_backends(self.device):
            self.last_stats = run_decode(self.model, [rows[i] for i in order], self.settings, self.tuner)
        return [
            Completion(text="", finish_reason="error", error=errors[i], prompt_tokens=len(prompts[i]))
            if i in errors
            else self._completion(rows[i])
            for i in range(len(requests))
        ]

    def close(self) -> None:
        """Free the model (and GPU memory); the engine cannot generate afterwards."""
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _grammar_matcher(self, grammar: str):
        if self._grammars is None:
            from actors.engines.hf.constrained import GrammarCompiler

            # the logits' width, not len(tokenizer): padded vocabularies have rows no token maps to.
            # out_features, not weight.shape: a PackedLinear lm_head holds no plain weight
            vocab = self.model.get_output_embeddings().out_features
            self._grammars = GrammarCompiler(self.tokenizer, vocab)
        return self._grammars.matcher(grammar)

    def _encode(self, messages: list[dict]) -> list[int]:
        text = render_prompt(self.tokenizer, messages, self.spec.thinking)
        # The template already wrote any BOS/special tokens into the text.
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _completion(self, row: DecodeRow) -> Completion:
        ids = row.token_ids
        if ids and ids[-1] in self.settings.eos_ids:
            ids = ids[:-1]
        raw = self._decode(ids)
        if row.stop_at >= 0:
            raw = raw[: row.stop_at]
        text, reasoning = split_thinking(raw)
        return Completion(
            text=text,
            raw_text=raw,
            reasoning=reasoning,
            prompt_tokens=len(row.prompt_ids),
            completion_tokens=len(row.token_ids),
            finish_reason=row.finish_reason,
            error=row.error,
        )


# ---------------------------------------------------------------------------------------------------------------
# Validation


def validate_spec(spec: EngineSpec) -> None:
    """Raise ValueError naming the first EngineSpec field the hf engine cannot use."""
    if spec.kind != "hf":
        raise ValueError(f"engine.kind: HFEngine needs kind 'hf', got {spec.kind!r}")
    if spec.dtype != "auto" and spec.dtype not in DTYPES:
        raise ValueError(f"engine.dtype: {spec.dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if spec.device not in ("auto", "cpu") and not spec.device.startswith("cuda"):
        raise ValueError(f"engine.device: {spec.device!r} is not one of auto, cpu, cuda, cuda:<n>")
    if not isinstance(spec.max_batch_size, int) or spec.max_batch_size < 1:
        raise ValueError(f"engine.max_batch_size: must be an integer >= 1, got {spec.max_batch_size!r}")
    if not isinstance(spec.num_threads, int) or spec.num_threads < 0:
        raise ValueError(f"engine.num_threads: must be an integer >= 0, got {spec.num_threads!r}")
    if not isinstance(spec.adaptive_threads, bool):
        raise ValueError(f"engine.adaptive_threads: must be true or false, got {spec.adaptive_threads!r}")  # noqa: TRY004
    if spec.quantize not in ("none", "int8"):
        raise ValueError(f"engine.quantize: {spec.quantize!r} is not one of none, int8")
    if spec.quantize == "int8" and spec.dtype not in ("auto", "float32"):
        raise ValueError(f"engine.quantize: int8 takes float32 inputs; engine.dtype is {spec.dtype!r}")
    if spec.adapter and not (Path(spec.adapter) / "adapter_config.json").is_file():
        raise ValueError(f"engine.adapter: {spec.adapter!r} is not a peft adapter directory (no adapter_config.json)")


def validate_request(index: int, request: ChatRequest) -> None:
    """Raise ValueError naming the field of `requests[index]` that is malformed.

    A wrong type is a ValueError too (TRY004 is silenced below): callers catch one error type for any bad request.
    """
    where = f"requests[{index}]"
    if not isinstance(request, ChatRequest):
        raise ValueError(f"{where}: expected a ChatRequest, got {type(request).__name__}")  # noqa: TRY004
    if not isinstance(request.messages, list) or not request.messages:
        raise ValueError(f"{where}.messages: expected a non-empty list of {{role, content}} dicts")
    for j, message in enumerate(request.messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}.messages[{j}]: expected a dict, got {type(message).__name__}")  # noqa: TRY004
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(  # noqa: TRY004
                    f"{where}.messages[{j}].{key}: expected a string, got {message.get(key)!r}")
    validate_sampling(f"{where}.sampling", request.sampling)


def validate_sampling(where: str, params: SamplingParams) -> None:
    """Raise ValueError naming the SamplingParams field that is out of range."""
    if params.temperature < 0:
        raise ValueError(f"{where}.temperature: must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"{where}.top_p: must be in (0, 1], got {params.top_p}")
    if params.top_k != -1 and params.top_k < 1:
        raise ValueError(f"{where}.top_k: must be -1 (off) or >= 1, got {params.top_k}")
    if params.max_tokens < 1:
        raise ValueError(f"{where}.max_tokens: must be >= 1, got {params.max_tokens}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"{where}.stop: stop strings must be non-empty strings, got {params.stop!r}")


# ---------------------------------------------------------------------------------------------------------------
# Prompts


def render_prompt(tokenizer, messages: list[dict], thinking: bool) -> str:
    """Apply the chat template with a generation prompt.

    `enable_thinking` is passed for templates that read it (Qwen3-style) and ignored by the others. A template
    that rejects the system role (it raises, like Gemma's) gets the system text merged into the first user turn.
    """
    try:
        return _apply_template(tokenizer, messages, thinking)
    except jinja2.TemplateError:
        if not any(m["role"] == "system" for m in messages):
            raise
        return _apply_template(tokenizer, merge_system_into_user(messages), thinking)


def _apply_template(tokenizer, messages: list[dict], thinking: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )


def merge_system_into_user(messages: list[dict]) -> list[dict]:
    """Drop system turns and prefix their text to the first user turn (or make one), for chat templates without a
    system role (Gemma's). Paper 001 folds the system prompt into the user turn for Gemma 2 without naming a
    separator; the blank line is our choice.

    >>> merge_system_into_user([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    [{'role': 'user', 'content': 'Be brief.\\n\\nHi'}]
    """
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if len(rest) == len(messages):
        return rest
    for message in rest:
        if message["role"] == "user":
            message["content"] = f"{system}\n\n{message['content']}"
            return rest
    return [{"role": "user", "content": system}, *rest]


def collect_eos_ids(model, tokenizer) -> frozenset[int]:
    """Token ids that end a completion: the generation config's EOS (int or list) plus the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return frozenset(ids)
