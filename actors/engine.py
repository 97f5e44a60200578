"""The one interface every model engine implements: chat requests + sampling params in, completions out.

Pure module (no ray, no torch at import time) so that parsers, caches and tests can use the types freely.
Implementations: `actors.hf_engine.HFEngine` (transformers, CPU/GPU), `actors.vllm_engine.VLLMEngine` (GPU),
`actors.openai_engine.OpenAIEngine` (any OpenAI-compatible endpoint). `build_engine` picks one from an `EngineSpec`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings. temperature == 0 means greedy; top_k == -1 means no top-k filter."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int = 0
    stop: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class ChatRequest:
    """One chat conversation to complete. `messages` are {"role": ..., "content": ...} dicts."""

    messages: list[dict]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""


@dataclass
class Completion:
    """One engine answer. `text` has <think> blocks stripped; `reasoning` keeps them; `raw_text` is verbatim."""

    text: str
    raw_text: str = ""
    reasoning: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "stop" | "length" | "error"
    error: str = ""


@dataclass
class EngineSpec:
    """Which model to run and how. Shared by every engine kind; fields a kind does not use are ignored by it."""

    # hf | vllm | openai
    kind: str = "hf"
    # "smollm2-135m" (embedded default), a local HF model directory, or "hf:<repo>" (needs hub access)
    model: str = "smollm2-135m"
    # model name sent to an OpenAI-compatible server; defaults to `model`
    served_model_name: str = ""
    # the model emits <think>...</think> before its answer (Qwen3-style); enables thinking in the chat template
    thinking: bool = False
    # auto | float32 | bfloat16 | float16
    dtype: str = "auto"
    # cpu | cuda | auto
    device: str = "auto"
    # rows per forward pass for the hf engine
    max_batch_size: int = 16
    # torch intra-op threads for the hf engine on CPU; 0 leaves torch's default
    num_threads: int = 0
    # a LoRA adapter directory (peft format) applied on top of `model`; "" = the base model.
    # hf merges it into the weights at load; vllm serves it as a LoRA request; openai ignores it (name the
    # adapter in `served_model_name` instead)
    adapter: str = ""
    # hf and vllm: reuse the keys/values of shared prompt prefixes (hf: the prefix common to one call's requests)
    enable_prefix_caching: bool = True
    # vllm only
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 4096
    # openai only
    base_url: str = "http://127.0.0.1:8000/v1"
    # name of the environment variable holding the API key (never the key itself)
    api_key_env: str = ""
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5

    def cache_identity(self) -> str:
        """What makes two engines answer the same prompt the same way (request-cache key part)."""
        name = self.served_model_name or self.model
        adapter = f":adapter={adapter_digest(self.adapter)}" if self.adapter else ""
        return f"{self.kind}:{name}{adapter}:think={self.thinking}"


def adapter_digest(adapter_dir: str) -> str:
    """Content hash of a LoRA adapter directory: a retrained adapter at the same path is a different model."""
    digest = hashlib.sha256()
    for path in sorted(Path(adapter_dir).glob("adapter_*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class Engine(Protocol):
    spec: EngineSpec

    def generate(self, requests: list[ChatRequest]) -> list[Completion]: ...

    def close(self) -> None: ...


_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def split_thinking(text: str) -> tuple[str, str]:
    """Split a completion into (answer, reasoning).

    Closed `<think>…</think>` blocks go to reasoning. An unclosed `<think>` (generation cut off while thinking)
    leaves an empty answer: everything after it is reasoning. A stray leading `</think>` (templates that open the
    block in the prompt) ends reasoning there.

    >>> split_thinking("<think>hmm</think> Answer: [4]")
    ('Answer: [4]', 'hmm')
    """
    reasoning = [m.strip() for m in _THINK_BLOCK.findall(text)]
    answer = _THINK_BLOCK.sub("", text)
    if "</think>" in answer:
        head, answer = answer.split("</think>", 1)
        reasoning.insert(0, head.strip())
    if "<think>" in answer:
        answer, tail = answer.split("<think>", 1)
        reasoning.append(tail.strip())
    return answer.strip(), "\n".join(r for r in reasoning if r)


def build_engine(spec: EngineSpec) -> Engine:
    """Instantiate the engine named by `spec.kind`. Heavy imports happen here, not at module import."""
    if spec.kind == "hf":
        from actors.hf_engine import HFEngine

        return HFEngine(spec)
    if spec.kind == "vllm":
        from actors.vllm_engine import VLLMEngine

        return VLLMEngine(spec)
    if spec.kind == "openai":
        from actors.openai_engine import OpenAIEngine

        return OpenAIEngine(spec)
    raise ValueError(f"engine.kind: unknown engine kind {spec.kind!r} (expected hf, vllm or openai)")
