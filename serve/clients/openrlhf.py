"""OpenRLHF's `reward_func` file form, for a quorum reward service with a bearer token.

OpenRLHF's HTTP path (`--reward.remote_url http://HOST:PORT/openrlhf?...`) posts with no Authorization header
(openrlhf 0.11.2 `openrlhf/utils/agent.py`, `_fetch_rewards_via_http`), so it reaches only a service without
auth. Given a path ending in `.py` instead, OpenRLHF loads its `reward_func(queries, prompts, labels)` and calls it
in a thread with one rollout's lists (`_fetch_rewards_via_func`). This file is such a module: it posts the same
body to the same `/openrlhf` route, adding the token, and returns the route's answer, which OpenRLHF reads exactly
as it reads an HTTP answer (`rewards`, `scores`, `extra_logs`).

    export QUORUM_REWARD_URL='http://HOST:8000/openrlhf?caller=my-run&failed_reward=0'
    export QUORUM_SERVE_TOKEN=...            # the variable named by QUORUM_REWARD_TOKEN_ENV (this is the default)
    --reward.remote_url "$(python -c 'import serve.clients.openrlhf as m; print(m.__file__)')"

Light: httpx and the standard library.
"""

from __future__ import annotations

import os

import httpx

TIMEOUT_S = 180.0  # OpenRLHF's own client timeout (aiohttp.ClientTimeout(total=180))


def reward_func(queries: list[str], prompts: list[str], labels: list) -> dict:
    url = os.environ.get("QUORUM_REWARD_URL", "")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"QUORUM_REWARD_URL: expected the service's /openrlhf URL, got {url!r}")
    token_env = os.environ.get("QUORUM_REWARD_TOKEN_ENV", "QUORUM_SERVE_TOKEN")
    token = os.environ.get(token_env, "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = httpx.post(url, json={"query": list(queries), "prompts": list(prompts), "labels": list(labels)},
                      headers=headers, timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()
