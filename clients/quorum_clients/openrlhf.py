"""OpenRLHF's `reward_func` file form (OpenRLHF 0.11.2), for a quorum reward service.

OpenRLHF given `--reward.remote_url` ending in `.py` loads that file with `spec_from_file_location` and calls its
`reward_func(queries, prompts, labels)` in a thread, one rollout per call (openrlhf/utils/agent.py,
`SingleTurnAgentExecutor._fetch_rewards_via_func`); `query` is decode(prompt tokens + response tokens) with special
tokens kept. Whatever the function raises, the executor logs and leaves the rollout's reward None, and the PPO step
then dies in `torch.tensor`/`torch.cat` with a TypeError. So this function never raises and never returns None: a
judgment that fails (the service refused it, answered 401/5xx, timed out, or parsed no verdict) gets the configured
`failed_reward` after bounded retries with back-off, with `quorum_failed: 1` in `extra_logs` (OpenRLHF logs it
beside its other metrics), and the service's message is logged (logger `quorum_clients.openrlhf`, the vLLM actor's
log). A configuration that cannot work fails when OpenRLHF loads the file, before any rollout.

    pip install ./clients                       # into OpenRLHF's environment (every node)
    export QUORUM_REWARD_URL='http://HOST:8000/openrlhf?caller=my-run&dimension=fluency&locale=en_US'
    export QUORUM_SERVE_TOKEN=...               # or the variable QUORUM_REWARD_TOKEN_ENV names
    --reward.remote_url "$(python -c 'import quorum_clients.openrlhf as m; print(m.__file__)')"

QUORUM_REWARD_URL is the service (with or without the `/openrlhf` route that OpenRLHF's plain HTTP path posts to)
and its query parameters configure this client: `scheme` score (default: each response graded alone, 1..5) or
vs_reference (judged against its label: an empty or missing label is refused, counted as failed); `signal`;
`caller`, `dimension`, `locale`; `failed_reward` (a number on the scheme's scale, or `neutral`, the default: the
middle of the scale, so a failure is neither the best nor the worst reward); `timeout_s`, `retries`, `backoff_s`.
OpenRLHF sends one rollout per call, so the group schemes (all_pairs, listwise) cannot be served and are refused.

Light: httpx and the standard library.
"""

from __future__ import annotations

import logging
import os
import urllib.parse

from quorum_clients.http import ClientConfig, GroupJob, RewardServiceClient, resolve_failed_reward
from quorum_clients.text import TextError, prompt_text, response_text

log = logging.getLogger("quorum_clients.openrlhf")
SCHEMES = ("score", "vs_reference")
_PARAMS = ("scheme", "signal", "caller", "dimension", "locale", "failed_reward", "timeout_s", "retries", "backoff_s")


def settings_from_url(url: str, environ=os.environ) -> tuple[ClientConfig, float]:
    """(client configuration, failed reward) from QUORUM_REWARD_URL and the token variable's name."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"QUORUM_REWARD_URL: expected http(s)://host:port[/prefix][/openrlhf][?params], got {url!r}")
    params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise ValueError(f"QUORUM_REWARD_URL: unknown parameter(s) {unknown}; known: {list(_PARAMS)}")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/openrlhf")
    scheme = params.get("scheme", "score")
    if scheme not in SCHEMES:
        raise ValueError(f"QUORUM_REWARD_URL: scheme={scheme!r}; OpenRLHF sends one rollout per call, so only "
                         f"{SCHEMES} can be judged (a group scheme needs a prompt's rollouts together)")
    token_env = environ.get("QUORUM_REWARD_TOKEN_ENV", "QUORUM_SERVE_TOKEN")
    cfg = ClientConfig(url=urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")),
                       token_env=token_env if environ.get(token_env) else "", scheme=scheme,
                       signal=params.get("signal", "own_grade"), caller=params.get("caller", ""),
                       dimension=params.get("dimension"), locale=params.get("locale"),
                       timeout_s=float(params.get("timeout_s", 180.0)), retries=int(params.get("retries", 3)),
                       backoff_s=float(params.get("backoff_s", 1.0)), concurrency=1)
    return cfg, resolve_failed_reward(params.get("failed_reward", "neutral"), cfg.scheme, cfg.signal)


def split_query(query: str, prompt: str) -> str:
    """The response inside OpenRLHF's query: what follows the prompt (a tokenizer round trip may not give the
    prompt back verbatim at the start; its last occurrence still ends where the response begins)."""
    if query.startswith(prompt):
        return query[len(prompt):]
    at = query.rfind(prompt) if prompt else -1
    if at < 0:
        raise TextError("query does not contain its prompt: cannot tell the response apart")
    return query[at + len(prompt):]


class OpenRLHFReward:
    """The reward_func behind this module, for one configuration (tests build their own)."""

    def __init__(self, cfg: ClientConfig, failed_reward: float, client: RewardServiceClient | None = None):
        self.cfg, self.failed_reward = cfg, failed_reward
        self.client = client or RewardServiceClient(cfg)
        self.failures = 0

    def __call__(self, queries: list[str], prompts: list[str], labels: list | None) -> dict:
        labels = list(labels) if labels is not None else [None] * len(queries)
        rewards, failed = [], []
        for i, (query, prompt, label) in enumerate(zip(queries, prompts, labels)):
            reward, error = self._one(query, prompt, label)
            if reward is None:
                self.failures += 1
                log.warning("quorum reward failed for query %d (%s): reward %s given, %d failure(s) so far",
                            i, error, self.failed_reward, self.failures)
            rewards.append(self.failed_reward if reward is None else reward)
            failed.append(float(reward is None))
        return {"rewards": rewards, "scores": list(rewards), "extra_logs": {"quorum_failed": failed}}

    def _one(self, query: str, prompt: str, label) -> tuple[float | None, str]:
        try:
            reference = None
            if self.cfg.scheme == "vs_reference":
                if not isinstance(label, str) or not label.strip():
                    return None, f"label {label!r}: scheme vs_reference judges against the label, which is empty"
                reference = label
            job = GroupJob(prompt_text(prompt), [response_text(split_query(query, prompt))], reference=reference)
            result = self.client.groups([job])[0]
            return result.rewards[0], result.error or "no judgment of this response parsed"
        except Exception as exc:  # noqa: BLE001 - OpenRLHF turns any exception into a None reward, then a TypeError
            return None, f"{type(exc).__name__}: {exc}"


_reward: OpenRLHFReward | None = None


def reward_func(queries: list[str], prompts: list[str], labels: list) -> dict:
    global _reward
    if _reward is None:
        _reward = OpenRLHFReward(*settings_from_url(os.environ.get("QUORUM_REWARD_URL", "")))
    return _reward(queries, prompts, labels)


# OpenRLHF loads this file when its vLLM actors start: a configuration that cannot work fails there, not as a None
# reward at the first rollout (importing the module elsewhere, e.g. to print its path, checks nothing)
if __name__ == "reward_func":
    settings_from_url(os.environ.get("QUORUM_REWARD_URL", ""))
