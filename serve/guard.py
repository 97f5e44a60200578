"""The checks every request to the GRM app passes before its body is read: body size, then the bearer token.

Kept apart from the deployment (`serve.app`) so the rules read in one place: a POST needs a Content-Length
(411 without one) within `limits.max_body_bytes` (413 over it); with a token configured every path but the open
probes needs `Authorization: Bearer <token>` (401 when missing or wrong, compared in constant time).
"""

from __future__ import annotations

import collections
import hmac

from fastapi import Request
from fastapi.responses import JSONResponse

from serve.config import ReplicaSettings
from serve.errors import error_response

# liveness and readiness probes (Serve's proxy, Kubernetes) carry no token
OPEN_PATHS = ("/health", "/ready")


def route_path(scope: dict) -> str:
    """The request path below the app's route prefix."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


def admit(request: Request, settings: ReplicaSettings | None, token: bytes,
          counters: collections.Counter) -> JSONResponse | None:
    """None to let the request through, else the rejection (411/413 body size, 401 token).

    `settings` is None before the replica's first reconfigure: nothing is enforced yet, and every route but
    /health answers 503 until a judge is loaded anyway."""
    counters["http_requests"] += 1
    if settings is None:
        return None
    if request.method == "POST":
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            return error_response(411, "a Content-Length header is required")
        if int(length) > settings.limits.max_body_bytes:
            return error_response(413, f"body of {length} bytes exceeds the limit of "
                                       f"{settings.limits.max_body_bytes}")
    if not token or route_path(request.scope) in OPEN_PATHS:
        return None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        counters["auth_rejected"] += 1
        return error_response(401, "missing bearer token (Authorization: Bearer <token>)",
                              headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token):
        counters["auth_rejected"] += 1
        # 401, not 403: RFC 6750 §3.1 answers an invalid token like a missing one (403 is for a valid token
        # without the scope), so clients treat both as "fix your credentials"
        return error_response(401, "invalid bearer token",
                              headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return None
