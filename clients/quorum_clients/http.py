"""The HTTP client the trainer integrations share: `POST /reward/group` and `POST /score` of a quorum reward service,
with retries, a bearer token from the environment, and failures returned as such (a reward of None plus the error),
never as a 0.

    client = RewardServiceClient(ClientConfig(url="http://127.0.0.1:8000", token_env="QUORUM_SERVE_TOKEN",
                                              caller="my-trl-run"))
    results = client.groups([GroupJob(prompt, [c1, c2]), ...], step=3)   # one GroupResult per job, in order
    results[0].rewards                                                     # [float | None, ...]

Retried: connection errors, timeouts, 408/425/429/5xx, `retries` times with back-off `backoff_s * 2^k`. Not
retried: 401/403 (`RewardServiceAuthError`, raised: a wrong token fails every request), other 4xx (the service
refused that request: its rows fail, `error` names the field). A 200 whose reward is null (no judgment of that
response parsed) is a failed row, counted with the service's `counts.n_failed_judgments`. Every `error` carries the
service's own message (`http_503: the judge engine is not ready`), or what the transport said.

`neutral_reward(scheme, signal)` is the middle of the scale a scheme's rewards live on: the fallback the
trainer clients give a failed judgment when asked for `failed_reward="neutral"`, so that a failure is neither the
best nor the worst reward.

Light: httpx and the standard library.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

RETRY_STATUS = (408, 425, 429, 500, 502, 503, 504)
SCHEMES = ("all_pairs", "vs_reference", "listwise", "score")
SIGNALS = ("own_grade", "margin")
# the range of the reward each scheme/signal returns (serve/rewards.py): grades 1..5, margins -4..4, listwise 0..1
_SCALES = {"score": (1.0, 5.0), "own_grade": (1.0, 5.0), "margin": (-4.0, 4.0), "listwise": (0.0, 1.0)}


def reward_scale(scheme: str, signal: str = "own_grade") -> tuple[float, float]:
    """(lowest, highest) reward of a scheme and signal.

    >>> reward_scale("all_pairs", "margin"), reward_scale("score"), reward_scale("listwise", "margin")
    ((-4.0, 4.0), (1.0, 5.0), (0.0, 1.0))
    """
    if scheme in ("score", "listwise"):
        return _SCALES[scheme]
    return _SCALES[signal]


def neutral_reward(scheme: str, signal: str = "own_grade") -> float:
    """The middle of the scheme's reward scale: 3 for grades, 0 for margins, 0.5 for listwise ranks."""
    low, high = reward_scale(scheme, signal)
    return (low + high) / 2


def resolve_failed_reward(value, scheme: str, signal: str) -> float | None:
    """A `failed_reward` setting as a number: None stays None, "neutral" is the scale's middle, else a finite float
    (a value outside the scale is refused: it would make a judge failure look like a verdict)."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().lower() == "neutral":
        return neutral_reward(scheme, signal)
    number = float(value)
    low, high = reward_scale(scheme, signal)
    if not low <= number <= high:
        raise ValueError(f"failed_reward: {number} lies outside the {scheme}/{signal} reward scale [{low}, {high}]; "
                         "give a value on the scale or 'neutral' (its middle)")
    return number


class RewardServiceAuthError(RuntimeError):
    """The reward service rejected the credentials (HTTP 401/403), or the token's variable is unset."""


@dataclasses.dataclass
class ClientConfig:
    # base URL of the reward service, route prefix included ("" = the QUORUM_REWARD_URL environment variable)
    url: str = ""
    # name of the environment variable holding the bearer token ("" = send none)
    token_env: str = ""
    # all_pairs | vs_reference (needs a reference per row) | listwise (one judge call per group) | score (pointwise:
    # each completion graded alone, reward = its grade)
    scheme: str = "all_pairs"
    # own_grade: a completion's reward is the mean grade the judge gave it; margin: the mean of its grade minus its
    # opponents' (pairwise schemes only)
    signal: str = "own_grade"
    # the run's name for the service-side monitors (/stats `callers`); "" = the service records nothing
    caller: str = ""
    # MENLO context sent with every group unless the row gives its own (dataset columns `dimension`, `locale`)
    dimension: str | None = None
    locale: str | None = None
    # per-attempt deadline, also sent as the request's timeout_s
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 1.0
    # groups in flight at once
    concurrency: int = 8

    def resolved_url(self) -> str:
        url = self.url or os.environ.get("QUORUM_REWARD_URL", "")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward service url: expected http(s)://host:port[/prefix] (or QUORUM_REWARD_URL), "
                             f"got {url!r}")
        return url.rstrip("/")

    def __post_init__(self) -> None:
        # a trainer script builds this object itself (no quorum config loader in between): refuse bad values here
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: {self.scheme!r} is not one of {SCHEMES}")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal: {self.signal!r} is not one of {SIGNALS}")
        if self.timeout_s <= 0 or self.concurrency < 1 or self.retries < 0:
            raise ValueError("timeout_s > 0, concurrency >= 1 and retries >= 0 are required")


@dataclasses.dataclass
class GroupJob:
    """One prompt's completions, judged together (scheme `score`: each alone)."""

    prompt: str
    responses: list[str]
    reference: str | None = None
    dimension: str | None = None
    locale: str | None = None


@dataclasses.dataclass
class GroupResult:
    rewards: list[float | None]
    # judgments the service reported failed (unparsed verdicts), and the error of a request that failed whole
    failed_judgments: int = 0
    error: str = ""

    @property
    def failed_rows(self) -> int:
        return sum(r is None for r in self.rewards)


class RewardServiceClient:
    """A keep-alive connection pool to one service; `groups` is thread-safe."""

    def __init__(self, cfg: ClientConfig, sleep=time.sleep):
        headers = {}
        if cfg.token_env:
            token = os.environ.get(cfg.token_env, "")
            if not token:
                raise RewardServiceAuthError(f"token_env: environment variable {cfg.token_env} is not set")
            headers["Authorization"] = f"Bearer {token}"
        self.cfg = cfg
        self._sleep = sleep
        self._rng = random.Random(0)
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        self._http = httpx.Client(base_url=cfg.resolved_url(), headers=headers, timeout=cfg.timeout_s, limits=limits)
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="quorum-reward")

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()

    def groups(self, jobs: list[GroupJob], step: int | None = None) -> list[GroupResult]:
        """Every job's rewards, in order; the requests run `concurrency` at a time."""
        if self.cfg.scheme == "score":
            calls = [(job, k) for job in jobs for k in range(len(job.responses))]
            answers = list(self._pool.map(lambda c: self._score(c[0], c[1], step), calls))
            results, at = [], 0
            for job in jobs:
                mine = answers[at:at + len(job.responses)]
                at += len(job.responses)
                results.append(GroupResult([a.rewards[0] for a in mine], sum(a.failed_judgments for a in mine),
                                           "; ".join(a.error for a in mine if a.error)))
            return results
        return list(self._pool.map(lambda job: self._group(job, step), jobs))

    # -- one request ----------------------------------------------------------------------------------------------

    def _context(self, job: GroupJob, step: int | None) -> dict:
        body = {"timeout_s": self.cfg.timeout_s}
        dimension, locale = job.dimension or self.cfg.dimension, job.locale or self.cfg.locale
        if dimension is not None:
            body["dimension"] = dimension
        if locale is not None:
            body["locale"] = locale
        if self.cfg.caller:
            body["caller"] = {"name": self.cfg.caller, "signal": self.cfg.signal}
            if step is not None:
                body["caller"]["step"] = int(step)
        return body

    def _group(self, job: GroupJob, step: int | None) -> GroupResult:
        body = {"prompt": job.prompt, "responses": job.responses, "scheme": self.cfg.scheme, **self._context(job, step)}
        if job.reference is not None:
            body["reference"] = job.reference
        data, error = self._post("/reward/group", body)
        n = len(job.responses)
        if data is None:
            return GroupResult([None] * n, error=error)
        try:
            failed = int(data["counts"]["n_failed_judgments"])
            if self.cfg.signal == "own_grade" and data["scheme"] != "listwise":
                values = [item["mean_grade"] for item in data["items"]]
            else:
                values = data["rewards"]
            rewards = [None if v is None else float(v) for v in values]
        except (KeyError, TypeError, ValueError):
            return GroupResult([None] * n, error="bad_response")
        if len(rewards) != n:
            return GroupResult([None] * n, error="bad_response")
        return GroupResult(rewards, failed)

    def _score(self, job: GroupJob, k: int, step: int | None) -> GroupResult:
        body = {"prompt": job.prompt, "response": job.responses[k], **self._context(job, step)}
        if job.reference is not None:
            body["reference"] = job.reference
        data, error = self._post("/score", body)
        if data is None:
            return GroupResult([None], error=error)
        grade = data.get("grade") if isinstance(data, dict) else None
        status = data.get("parse_status", "") if isinstance(data, dict) else "bad_response"
        return GroupResult([None if grade is None else float(grade)], int(status != "ok"))

    def _post(self, path: str, body: dict) -> tuple[dict | None, str]:
        """(JSON body, "") on a 200, else (None, error kind), after the retries."""
        error = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self._sleep(self.cfg.backoff_s * 2 ** (attempt - 1) * (1 + 0.1 * self._rng.random()))
            try:
                resp = self._http.post(path, json=body)
            except httpx.TimeoutException:
                error = f"timeout: no answer from {self._http.base_url}{path} within {self.cfg.timeout_s:g} s"
                continue
            except httpx.TransportError as exc:
                error = f"connect: {type(exc).__name__} to {self._http.base_url}{path}: {exc}"
                continue
            if resp.status_code in (401, 403):
                raise RewardServiceAuthError(f"reward service answered {resp.status_code} ({_message(resp)}): check "
                                             f"token_env ({self.cfg.token_env or 'unset'})")
            if resp.status_code in RETRY_STATUS:
                error = f"http_{resp.status_code}: {_message(resp)}"
                continue
            if resp.status_code != 200:
                return None, f"http_{resp.status_code}: {_message(resp)}"
            try:
                return resp.json(), ""
            except ValueError:
                return None, "bad_response"
        return None, f"{error} (after {self.cfg.retries + 1} attempts)"


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
