"""Chat engine for any OpenAI-compatible endpoint (vLLM serve, Ray Serve LLM, hosted APIs), over plain httpx.

`generate()` is synchronous: it fans the requests out over a bounded thread pool (`spec.max_concurrency`), retries
transient failures (connect errors, timeouts, 429, 5xx) with exponential backoff + jitter or the server's
Retry-After, and returns one `Completion` per request in input order. A row that still fails comes back as
`Completion(finish_reason="error", error=...)`; it is never dropped and never raises.

    spec = EngineSpec(kind="openai", model="Qwen/Qwen3-8B", base_url="http://head:8000/v1", api_key_env="JUDGE_KEY")
    with OpenAIEngine(spec) as engine:
        completions = engine.generate([ChatRequest(messages=[{"role": "user", "content": "hi"}])])

The API key is read from the environment variable named by `spec.api_key_env`, sent only as a bearer header,
and scrubbed from every error message and log line this module writes.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import NamedTuple, Self

import httpx

from actors.engines.base import ChatRequest, Completion, EngineSpec, split_thinking

logger = logging.getLogger(__name__)

# A misbehaving server could ask for an hour; one row should not stall a batch job that long.
MAX_RETRY_AFTER_S = 60.0
MAX_BACKOFF_S = 60.0
# Enough of an error body to diagnose, not enough to flood logs with an HTML error page.
_ERROR_BODY_CHARS = 300


def read_api_key(env_var: str) -> str:
    """Return the API key held by environment variable `env_var`, or "" when no variable is configured.

    Args:
        env_var: the variable's name (from `spec.api_key_env`); "" means the endpoint needs no key.

    Raises:
        ValueError: the variable is configured but unset/empty, or its value cannot be sent as a header.
            The message names the variable, never its value.
    """
    if not env_var:
        return ""
    key = os.environ.get(env_var, "").strip()
    if not key:
        raise ValueError(f"engine.api_key_env: environment variable {env_var!r} is not set or is empty")
    # httpx/h11 quote an illegal header value verbatim in their exception, which would leak the key.
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(
            f"engine.api_key_env: the value of {env_var!r} contains whitespace or control characters"
        )
    return key


def validate_openai_spec(spec: EngineSpec) -> None:
    """Check the fields the OpenAI engine uses; raise ValueError naming the first bad one."""
    if not spec.base_url.startswith(("http://", "https://")):
        raise ValueError(f"engine.base_url: expected an http(s) URL, got {spec.base_url!r}")
    if not (spec.served_model_name or spec.model):
        raise ValueError("engine.model: empty (set engine.model or engine.served_model_name)")
    if spec.max_concurrency < 1:
        raise ValueError(f"engine.max_concurrency: must be >= 1, got {spec.max_concurrency}")
    if spec.timeout_s <= 0:
        raise ValueError(f"engine.timeout_s: must be > 0, got {spec.timeout_s}")
    if spec.max_retries < 0:
        raise ValueError(f"engine.max_retries: must be >= 0, got {spec.max_retries}")
    if spec.retry_backoff_s < 0:
        raise ValueError(f"engine.retry_backoff_s: must be >= 0, got {spec.retry_backoff_s}")


def build_chat_body(model: str, request: ChatRequest, thinking: bool = False, grammar: bool = True) -> dict:
    """Translate one `ChatRequest` into an OpenAI chat-completions JSON body.

    `top_k` is not an OpenAI field (hosted APIs reject it) but vLLM accepts it as an extra body field, so it is
    sent only when a filter is asked for. Likewise `chat_template_kwargs` is sent only when thinking is on.

    >>> build_chat_body("m", ChatRequest(messages=[{"role": "user", "content": "x"}]))["max_tokens"]
    128
    """
    s = request.sampling
    body = {
        "model": model,
        "messages": request.messages,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
        "seed": s.seed,
    }
    if s.stop:
        body["stop"] = list(s.stop)
    if s.top_k != -1:
        body["top_k"] = s.top_k
    if thinking:
        body["chat_template_kwargs"] = {"enable_thinking": True}
    if s.grammar and grammar:
        # vLLM's OpenAI-compatible server (>= 0.12) field; its `guidance` backend reads this Lark dialect. Other
        # servers reject it, so `grammar` (engine.structured_outputs) says whether this one is vLLM
        body["structured_outputs"] = {"grammar": s.grammar}
    return body


def parse_chat_response(payload: dict) -> Completion:
    """Turn a chat-completions response body into a `Completion`.

    Reasoning comes from the message's `reasoning_content` (DeepSeek convention, older vLLM) or `reasoning`
    (vLLM >= 0.12) field when the server parsed it out; any `<think>` block left in the content is split off too.

    Raises:
        ValueError: the payload has no `choices[0].message`.
    """
    try:
        choice = payload["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices[0].message ({type(exc).__name__})") from None
    content = message.get("content") or ""
    answer, inline_reasoning = split_thinking(content)
    server_reasoning = (message.get("reasoning_content") or message.get("reasoning") or "").strip()
    reasoning = "\n".join(r for r in (server_reasoning, inline_reasoning) if r)
    usage = payload.get("usage") or {}
    return Completion(
        text=answer,
        raw_text=content,
        reasoning=reasoning,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
    )


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait according to a Retry-After header (delta-seconds or HTTP-date); None if absent/invalid.

    >>> parse_retry_after("3")
    3.0
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=datetime(2015, 10, 21, 7, 28, tzinfo=timezone.utc))
    10.0
    """
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def compute_backoff_s(attempt: int, base_s: float, retry_after_s: float | None, jitter: float) -> float:
    """Delay before retry number `attempt + 1`.

    The server's Retry-After wins when given (capped at MAX_RETRY_AFTER_S). Otherwise the delay is
    `base_s * 2**attempt`, scaled by a jitter factor in [0.5, 1.5) so that many workers that failed together
    do not retry in lock-step, and capped at MAX_BACKOFF_S.

    Args:
        attempt: 0 for the first retry.
        base_s: `spec.retry_backoff_s`.
        retry_after_s: parsed Retry-After header, or None.
        jitter: a uniform draw in [0, 1).

    >>> compute_backoff_s(2, 0.5, None, jitter=0.5)  # 0.5 * 2**2 * (0.5 + 0.5)
    2.0
    """
    if retry_after_s is not None:
        return min(retry_after_s, MAX_RETRY_AFTER_S)
    return min(base_s * (2**attempt) * (0.5 + jitter), MAX_BACKOFF_S)


def is_retryable_status(status: int) -> bool:
    """429 and 5xx are worth retrying; any other 4xx will fail the same way again."""
    return status == 429 or status >= 500


class AttemptResult(NamedTuple):
    """Outcome of one POST: a completion, or an error plus whether (and after what delay hint) to retry."""

    completion: Completion | None
    error: str = ""
    retryable: bool = False
    retry_after_s: float | None = None


def describe_error_body(response: httpx.Response) -> str:
    """A short, human-readable summary of an error response (OpenAI's `error.message` when present)."""
    try:
        detail = response.json().get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        detail = ""
    text = str(detail) if detail else response.text
    return f"HTTP {response.status_code}: {text[:_ERROR_BODY_CHARS]}"


class OpenAIEngine:
    """`Engine` over an OpenAI-compatible `/chat/completions` endpoint. Thread-safe; call `close()` when done."""

    def __init__(self, spec: EngineSpec):
        validate_openai_spec(spec)
        self.spec = spec
        self._model = spec.served_model_name or spec.model
        self._url = spec.base_url.rstrip("/") + "/chat/completions"
        self._secret = read_api_key(spec.api_key_env)
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        limits = httpx.Limits(max_connections=spec.max_concurrency, max_keepalive_connections=spec.max_concurrency)
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(spec.timeout_s), limits=limits)
        self._pool = ThreadPoolExecutor(max_workers=spec.max_concurrency, thread_name_prefix="openai-engine")
        self._rng = random.Random()
        self._warned_grammar = False

    def __repr__(self) -> str:
        return f"OpenAIEngine(model={self._model!r}, url={self._url!r}, api_key_env={self.spec.api_key_env!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """Complete every request, at most `spec.max_concurrency` at a time; results keep the input order."""
        return list(self._pool.map(self._complete_safely, requests))

    def close(self) -> None:
        """Wait for in-flight requests, then release the threads and connections."""
        self._pool.shutdown(wait=True)
        self._client.close()

    def _complete_safely(self, request: ChatRequest) -> Completion:
        # A batch of thousands must not die for one odd row (unserialisable message, server garbage):
        # whatever goes wrong becomes that row's error completion, with the key scrubbed.
        try:
            return self._complete_with_retries(request)
        except Exception as exc:  # noqa: BLE001 - see comment above
            return self._fail(request, f"{type(exc).__name__}: {exc}")

    def _complete_with_retries(self, request: ChatRequest) -> Completion:
        if not isinstance(request.messages, list) or not request.messages:
            return self._fail(request, "request.messages: expected a non-empty list of {role, content} dicts")
        if request.sampling.grammar and not self.spec.structured_outputs and not self._warned_grammar:
            self._warned_grammar = True  # once per engine: every judge row carries the same kind of grammar
            logger.warning("%s: engine.structured_outputs is false, so judge grammars are not sent; verdicts are "
                           "parsed (and retried, then counted) as free text", self._url)
        body = build_chat_body(self._model, request, thinking=self.spec.thinking,
                               grammar=self.spec.structured_outputs)
        result = AttemptResult(None, "no attempt made")
        for attempt in range(self.spec.max_retries + 1):
            result = self._attempt(body)
            if result.completion is not None:
                return result.completion
            if not result.retryable or attempt == self.spec.max_retries:
                break
            delay = compute_backoff_s(attempt, self.spec.retry_backoff_s, result.retry_after_s, self._rng.random())
            logger.debug(
                "request %r: %s; retry %d in %.2fs", request.request_id, self._redact(result.error), attempt + 1, delay
            )
            time.sleep(delay)
        return self._fail(request, result.error)

    def _attempt(self, body: dict) -> AttemptResult:
        try:
            response = self._client.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            return AttemptResult(None, f"timeout after {self.spec.timeout_s}s ({type(exc).__name__})", True)
        except httpx.TransportError as exc:
            return AttemptResult(None, f"{type(exc).__name__}: {exc}", True)
        if response.status_code == 200:
            try:
                return AttemptResult(parse_chat_response(response.json()))
            except ValueError as exc:
                return AttemptResult(None, f"malformed response: {exc}"[:_ERROR_BODY_CHARS])
        retryable = is_retryable_status(response.status_code)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return AttemptResult(None, describe_error_body(response), retryable, retry_after)

    def _fail(self, request: ChatRequest, error: str) -> Completion:
        error = self._redact(error)
        logger.warning("request %r failed: %s", request.request_id, error)
        return Completion(text="", finish_reason="error", error=error)

    def _redact(self, text: str) -> str:
        # Servers sometimes echo the presented credential in 401 bodies; never pass it on.
        return text.replace(self._secret, "***") if self._secret else text
