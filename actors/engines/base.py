"""The one interface every model engine implements: chat requests + sampling params in, completions out.

Pure module (no ray, no torch at import time) so that parsers, caches and tests can use the types freely.
Implementations: `actors.engines.hf.engine.HFEngine` (transformers, CPU/GPU), `actors.engines.vllm_sync.VLLMEngine` (GPU),
`actors.engines.openai_api.OpenAIEngine` (any OpenAI-compatible endpoint). `actors.engines.factory.build_engine` picks one from an
`EngineSpec`; the implementations import this module, never the factory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from core.config import Section, dotted, fail, in_range, one_of, positive


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings. temperature == 0 means greedy; top_k == -1 means no top-k filter."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int = 0
    stop: tuple[str, ...] = ()
    # a grammar the completion must match (llguidance's Lark dialect, e.g. from eval.judging.grammar); "" = free
    # text. hf decodes under it with llguidance, vllm with its `guidance` structured-output backend, openai sends
    # it as vLLM's `structured_outputs.grammar` request field
    grammar: str = ""

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        if not self.grammar:
            # free-text requests keep the request-cache keys they had before grammars existed
            del d["grammar"]
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
class EngineSpec(Section):
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
    # torch intra-op threads for the hf engine on CPU; 0 = the CPUs Ray assigned the actor (pool.num_cpus, floor,
    # at least 1), or torch's default outside Ray (actors.threads)
    num_threads: int = 0
    # hf on CPU: each decode step's thread count is picked between that maximum, half of it and 1 by timing steps
    # (core.thread_tuner), so a process sharing the cores does not make every step wait for a descheduled thread
    adaptive_threads: bool = True
    # a LoRA adapter directory (peft format) applied on top of `model`; "" = the base model.
    # hf merges it into the weights at load; vllm serves it as a LoRA request; openai ignores it (name the
    # adapter in `served_model_name` instead)
    adapter: str = ""
    # hf and vllm: reuse the keys/values of shared prompt prefixes (hf: the prefix common to one call's requests)
    enable_prefix_caching: bool = True
    # hf only: the tokens a request's grammar forces are fed in one forward with its last token (jump-forward,
    # actors.engines.hf.fast_forward); false = one token per forward
    fast_forward: bool = True
    # hf on CPU only: "int8" runs the decoder layers' projections in int8 (dynamic quantisation, VNNI; the LM head
    # stays float32; actors.engines.hf.int8), at float32 otherwise. A declared option for CPUs without native bf16:
    # it changes outputs (near-tied tokens can flip) and has its own request-cache key. "none" = the model's dtype
    quantize: str = "none"
    # vllm only. GPUs one engine shards the model over (vLLM tensor parallelism); >= 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85  # fraction (0, 1] of each GPU's memory vLLM may take (weights + KV cache)
    max_model_len: int = 4096  # tokens, prompt + completion, per sequence (vLLM's max_model_len); >= 1
    # openai only. Base URL of the OpenAI-compatible API, /v1 included (requests go to <base_url>/chat/completions)
    base_url: str = "http://127.0.0.1:8000/v1"
    # name of the environment variable holding the API key (never the key itself)
    api_key_env: str = ""
    max_concurrency: int = 8  # openai: requests in flight at once per engine (thread pool and HTTP connections)
    timeout_s: float = 60.0  # openai: HTTP timeout in seconds (httpx: each of connect, read, write); retried
    max_retries: int = 3  # openai: retries of a 429, 5xx, timeout or connection error after the first try; 0 = none
    # openai: first retry delay in seconds, doubled each retry with jitter (a server's Retry-After wins)
    retry_backoff_s: float = 0.5
    # the server is vLLM's OpenAI-compatible one (started with `--structured-outputs-config.backend guidance`): a
    # constrained judge's grammar goes in its `structured_outputs` field. Off for hosted APIs (OpenAI, Anthropic,
    # DeepSeek reject unknown fields): their verdicts are parsed, retried and counted as without a grammar
    structured_outputs: bool = False

    def check(self, where: str = "") -> None:
        """Raise ConfigError naming `<where>.<field>` for a value no engine could start with (run at config time)."""
        check_engine(self, where)

    def cache_identity(self) -> str:
        """What makes two engines answer the same prompt the same way (request-cache key part)."""
        name = self.served_model_name or self.model
        adapter = f":adapter={adapter_digest(self.adapter)}" if self.adapter else ""
        # single steps may tokenise forced text otherwise than jump-forward: the knob that restores them must not
        # read jump-forward's cached answers (the default's key is unchanged)
        steps = ":fast_forward=false" if self.kind == "hf" and not self.fast_forward else ""
        # int8 answers differ from float32's: their own key (the default's key is unchanged)
        quantize = f":quantize={self.quantize}" if self.kind == "hf" and self.quantize != "none" else ""
        return f"{self.kind}:{name}{adapter}:think={self.thinking}{steps}{quantize}"


ENGINE_KINDS = ("hf", "vllm", "openai")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
QUANTIZE = ("none", "int8")
# torch generators and the OpenAI API take 64-bit signed seeds; a larger one overflows inside a batch
SEED_MAX = 2**63 - 1
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_sampling(sampling, where: str) -> None:
    """Ranges of a sampling section (SamplingParams or its config twin); errors name `<where>.<field>`."""
    in_range(sampling.temperature, 0, 2, dotted(where, "temperature"))
    in_range(sampling.top_p, 0, 1, dotted(where, "top_p"), low_open=True)
    if sampling.top_k < -1 or sampling.top_k == 0:
        fail(dotted(where, "top_k"), f"must be -1 (off) or >= 1, got {sampling.top_k}")
    if sampling.max_tokens < 1:
        fail(dotted(where, "max_tokens"), f"must be >= 1, got {sampling.max_tokens}")
    if not 0 <= sampling.seed <= SEED_MAX:
        fail(dotted(where, "seed"), f"must be in [0, 2**63 - 1], got {sampling.seed}")
    if any(not s for s in sampling.stop):
        fail(dotted(where, "stop"), "stop strings must be non-empty")


def check_engine(spec: EngineSpec, where: str) -> None:
    """Enums, ranges, and the model / adapter paths of an engine spec, before any actor loads it."""
    for name, allowed in (("kind", ENGINE_KINDS), ("dtype", DTYPES), ("device", DEVICES), ("quantize", QUANTIZE)):
        one_of(getattr(spec, name), allowed, dotted(where, name))
    if spec.quantize == "int8" and (spec.kind != "hf" or spec.device == "cuda" or spec.dtype not in ("auto", "float32")):
        # the int8 kernels are the CPU's (fbgemm / oneDNN) and take float32 inputs
        fail(dotted(where, "quantize"), f"int8 runs in the hf engine on CPU at float32; got kind={spec.kind!r}, "
                                        f"device={spec.device!r}, dtype={spec.dtype!r}")
    for name in ("max_batch_size", "tensor_parallel_size", "max_model_len", "max_concurrency"):
        if getattr(spec, name) < 1:
            fail(dotted(where, name), f"must be >= 1, got {getattr(spec, name)}")
    in_range(spec.gpu_memory_utilization, 0, 1, dotted(where, "gpu_memory_utilization"), low_open=True)
    positive(spec.timeout_s, dotted(where, "timeout_s"))
    if spec.api_key_env and not _ENV_NAME.fullmatch(spec.api_key_env):
        fail(dotted(where, "api_key_env"), f"{spec.api_key_env!r} is not an environment variable name")
    if spec.kind == "openai":
        if not spec.base_url.startswith(("http://", "https://")):
            fail(dotted(where, "base_url"), f"{spec.base_url!r} must start with http:// or https://")
        return
    model = spec.model.strip()
    if not model:
        fail(dotted(where, "model"), "must be set")
    # a local engine loads the embedded alias, an hf:<repo> id, or a model directory that must exist now
    local_dir = (Path(model).expanduser() / "config.json").is_file()
    if model != "smollm2-135m" and not model.startswith("hf:") and not local_dir:
        fail(dotted(where, "model"), f"{model!r} is not 'smollm2-135m', not hf:<repo>, and not a model directory "
                                  "(no config.json there)")
    if spec.adapter and not (Path(spec.adapter).expanduser() / "adapter_config.json").is_file():
        fail(dotted(where, "adapter"), f"{spec.adapter!r} is not a peft adapter directory (no adapter_config.json)")


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
