"""Error bodies of the GRM app: OpenAI-style (`error.message` / `param` naming the field) plus FastAPI's `detail`.

Every body serialises, whatever the client sent: an error handler that fails on a NaN or a lone surrogate in the
request it quotes would turn a malformed request's 4xx into a 500.
"""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from serve.protocol import RequestError


def json_safe(value):
    """`value` with lone surrogates escaped and NaN / infinities as strings (JSONResponse refuses both)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json_safe({"error": {"message": message, "type": kind, "param": param, "code": status}, "detail": message})


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def validation_error_body(raw_errors: list) -> dict:
    """The 422 body of a request that failed validation (pydantic's `errors()`), for HTTP and handle callers."""
    # loc / msg / type only: the offending `input` (NaN, a lone surrogate, a huge body) is not echoed back
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in raw_errors]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    field = ".".join(str(part) for part in first["loc"] if part != "body")
    message = f"{field or 'body'}: {first['msg']}"
    return json_safe({"error": {"message": message, "type": "invalid_request_error", "param": field or None,
                                "code": 422}, "detail": errors})


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(validation_error_body(exc.errors()), status_code=422)


async def _on_request_error(request: Request, exc: RequestError) -> JSONResponse:
    return error_response(400, str(exc), exc.field)


async def _on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


def install_error_handlers(api: FastAPI) -> None:
    api.add_exception_handler(RequestValidationError, _on_validation_error)
    api.add_exception_handler(RequestError, _on_request_error)
    api.add_exception_handler(HTTPException, _on_http_error)
