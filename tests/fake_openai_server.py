"""A real OpenAI-compatible HTTP server on 127.0.0.1 for engine tests: deterministic answers, injectable faults.

This is the edge of the world (a hosted API), so faking it is fair; everything on our side runs for real.

    with FakeOpenAIServer(api_key="sk-test") as server:      # uvicorn in a thread, ephemeral port
        server.inject("status_500", times=2, match="row-3")   # next 2 calls whose last user msg has "row-3"
        ...POST server.base_url + "/chat/completions"...
        server.calls_matching("row-3"), server.max_in_flight

Answer for the last user message `m`: content `"ECHO: " + m.upper()` with usage counted in words. Markers in `m`
change the answer: `[think]` wraps reasoning in `<think>…</think>` inside the content, `[reasoning_content]` /
`[reasoning]` return it in that message field instead, `[length]` sets finish_reason "length", and
`[sleep=0.2]` delays the answer (to reorder completions or hold requests in flight). A `reply` function can
script the answers instead (a hosted judge that follows the output format); `reply_body` does the same from
the whole request body (a multi-role agent team told apart by its system prompts: tests/agentsimp_fake.py).
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

REASONING = "pondering the question"
_SLEEP = re.compile(r"\[sleep=([0-9.]+)\]")
FAULT_KINDS = ("status_500", "status_429", "status_400", "sleep", "garbage")


@dataclass
class Fault:
    """Answer the next `times` calls whose last user message contains `match` with a failure (None = forever)."""

    kind: str
    times: int | None
    match: str = ""
    retry_after: str = ""
    sleep_s: float = 1.0


@dataclass
class RecordedCall:
    body: dict
    headers: dict
    status: int = 0


@dataclass
class _State:
    api_key: str = ""
    faults: list[Fault] = field(default_factory=list)
    calls: list[RecordedCall] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


class FakeOpenAIServer:
    """Runs the fake API with uvicorn in a daemon thread; use as a context manager or call start()/stop()."""

    def __init__(self, api_key: str = "", reply: Callable[[str], str | None] | None = None,
                 reply_body: Callable[[dict], str | None] | None = None):
        # reply(last user message) -> the answer text, or None for the default echo (a scripted hosted model)
        self.reply = reply
        # reply_body(request body) -> the answer text, or None; tried before `reply`
        self.reply_body = reply_body
        self._state = _State(api_key=api_key)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(build_app(self), log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake OpenAI server did not start on port {self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()

    # ----- test controls -----

    def reset(self, api_key: str = "") -> None:
        """Forget calls and faults; set the expected bearer key ("" accepts any or none)."""
        with self._lock:
            self._state = _State(api_key=api_key)

    def inject(self, kind: str, times: int | None = 1, match: str = "", retry_after: str = "", sleep_s: float = 1.0):
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {FAULT_KINDS}")
        with self._lock:
            self._state.faults.append(Fault(kind, times, match, retry_after, sleep_s))

    @property
    def calls(self) -> list[RecordedCall]:
        with self._lock:
            return list(self._state.calls)

    @property
    def max_in_flight(self) -> int:
        return self._state.max_in_flight

    def calls_matching(self, text: str) -> list[RecordedCall]:
        return [c for c in self.calls if text in last_user_message(c.body)]

    # ----- used by the app -----

    def begin_call(self, body: dict, headers: dict) -> tuple[RecordedCall, Fault | None, str]:
        """Record a call, count it in flight, and pick the fault (if any) that applies to it."""
        call = RecordedCall(body=body, headers=headers)
        with self._lock:
            state = self._state
            state.calls.append(call)
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            return call, take_fault(state.faults, last_user_message(body)), state.api_key

    def end_call(self, call: RecordedCall, status: int) -> None:
        with self._lock:
            call.status = status
            self._state.in_flight -= 1


def last_user_message(body: dict) -> str:
    users = [m.get("content", "") for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def take_fault(faults: list[Fault], text: str) -> Fault | None:
    """Consume one use of the first fault matching `text` (caller holds the lock)."""
    for fault in faults:
        if fault.match in text and (fault.times is None or fault.times > 0):
            if fault.times is not None:
                fault.times -= 1
            return fault
    return None


def build_answer(body: dict, reply: Callable[[str], str | None] | None = None,
                 reply_body: Callable[[dict], str | None] | None = None) -> dict:
    """The deterministic chat-completions response for a request body."""
    text = last_user_message(body)
    scripted = reply_body(body) if reply_body else None
    if scripted is None and reply:
        scripted = reply(text)
    answer = scripted if scripted is not None else "ECHO: " + text.upper()
    message = {"role": "assistant", "content": answer}
    if "[think]" in text:
        message["content"] = f"<think>{REASONING}</think>{answer}"
    elif "[reasoning_content]" in text:
        message["reasoning_content"] = REASONING
    elif "[reasoning]" in text:
        message["reasoning"] = REASONING
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body.get("model", ""),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "length" if "[length]" in text else "stop"}
        ],
        "usage": {"prompt_tokens": prompt_words, "completion_tokens": len(message["content"].split())},
    }


async def answer_fault(fault: Fault) -> JSONResponse | None:
    """The failure response for `fault`, or None when the fault only delays (sleep) the normal answer."""
    if fault.kind == "sleep":
        await asyncio.sleep(fault.sleep_s)
        return None
    if fault.kind == "garbage":
        return JSONResponse({"unexpected": True}, status_code=200)
    status = int(fault.kind.split("_")[1])
    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
    error = {"error": {"message": f"injected {status}", "type": "fake", "code": status}}
    return JSONResponse(error, status_code=status, headers=headers)


def build_app(server: FakeOpenAIServer) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        body = await request.json()
        call, fault, api_key = server.begin_call(body, dict(request.headers))
        response = JSONResponse({"error": {"message": "unset"}}, status_code=500)
        try:
            presented = request.headers.get("authorization", "")
            if api_key and presented != f"Bearer {api_key}":
                # Some real APIs echo the presented credential; the client must scrub it.
                message = f"invalid api key: {presented}"
                response = JSONResponse({"error": {"message": message}}, status_code=401)
                return response
            if fault is not None:
                failed = await answer_fault(fault)
                if failed is not None:
                    response = failed
                    return response
            delay = _SLEEP.search(last_user_message(body))
            if delay:
                await asyncio.sleep(float(delay.group(1)))
            response = JSONResponse(build_answer(body, server.reply, server.reply_body))
            return response
        finally:
            server.end_call(call, response.status_code)

    return app
