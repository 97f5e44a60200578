"""Client of the GRM Serve app's `POST /reward/group`: retries with back-off, then an explicit failure.

    client = GroupRewardClient(RewardServiceConfig(url="http://127.0.0.1:8000/grm", token_env="QUORUM_SERVE_TOKEN"))
    client = GroupRewardClient(RewardServiceConfig(url=..., app="grm"))    # inside the app's Ray cluster
    outcome = client.score(prompt, responses, dimension="tone", locale="de_DE")   # train.grpo.batch.GroupOutcome
    outcome.rewards                               # [G floats], or None with outcome.error = "timeout", ...

The reward of a response is `signal`: ``own_grade`` (MENLO §5: the mean of the grades the judge gave it) or
``margin`` (the mean of its grade minus its opponent's); both are logged as components whichever trains.
    client.close()

Two transports, one set of semantics. With `app` empty: HTTP to `url` (an external service, or a client outside
the cluster). With `app` set (policy_grpo sets it for the GRM app it deploys): a Ray Serve `DeploymentHandle` to
that app's `reward_group_in_cluster` (`train.grpo.reward.handle`, which imports Ray; this module does not), which
answers exactly what the HTTP route would, as (status, body). A handle
reaches a replica on any node through Ray itself; an HTTP URL of `127.0.0.1` would need a Serve proxy on the
caller's node, and Ray 2.60 starts proxies only on the head and on nodes holding a replica
(serve/_private/controller.py `_update_proxy_nodes`), so a training worker on a GPU node without a replica would
reach nothing. A handle needs no token (only processes of the cluster can hold one; Ray's own auth guards that).

Failure semantics (GRPO's contract: a group without rewards is excluded from the loss, never scored 0):
    * connection errors, timeouts, 429 and 5xx are retried up to `retries` times, sleeping
      ``backoff_s · 2^k`` (capped at `backoff_max_s`, plus up to 10% jitter so workers do not retry in step);
      after the last attempt the group fails with the last error kind (``connect``, ``timeout``, ``http_503``);
    * 401 / 403 raise `RewardServiceAuthError`: a wrong or missing token fails every group, so the run stops
      and names ``reward.token_env`` instead of training on nothing;
    * other 4xx (a request the server refuses, e.g. a response over its size limit) fail the group at once;
    * a 200 whose body lacks G rewards fails with ``bad_response``; a reward of ``null`` (the judge's output for
      that rollout could not be parsed in any of its pairs) fails the group with ``null_rewards``;
    * over a handle: Serve's back-pressure is a retried ``http_503``, a replica that died or an app with no
      running replica a retried ``connect: <error>``, an exception raised in the replica a retried ``http_500``,
      a call past `timeout_s` a retried ``timeout`` (the call is cancelled).

No ray, no torch: usable from a Ray Train worker, a driver or a test.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable
from typing import Protocol

import httpx

from core.config import Section, dotted, fail, one_of, positive
from eval.reward_wire import SCHEMES
from train.grpo.batch import GroupOutcome, failed

RETRY_STATUS = (408, 425, 429, 500, 502, 503, 504)
SIGNALS = ("own_grade", "margin")


class RewardServiceAuthError(RuntimeError):
    """The reward service rejected our credentials (HTTP 401/403)."""


@dataclasses.dataclass
class RewardServiceConfig(Section):
    # base URL of the GRM app, route prefix included (http://host:port/prefix); "" = the job starts the app
    url: str = ""
    # Ray Serve application to call through a DeploymentHandle instead of HTTP, from processes of the Ray cluster
    # that runs it; policy_grpo sets it for the GRM app it deploys ("" = HTTP to `url`)
    app: str = ""
    # name of the environment variable holding the bearer token ("" = no Authorization header)
    token_env: str = ""
    # all_pairs (the paper's) | vs_reference (rows then need a `reference`) | listwise (quorum's extension: one judge
    # call ranks the group, reward = normalised rank in 0..1, `signal` unused; the app needs prompts.listwise)
    scheme: str = "all_pairs"
    # own_grade: a response's reward is the mean grade the judge gave it (MENLO §5); margin: the mean of its grade
    # minus its opponent's (cancels a judge's leniency per pair; a group's margins sum to 0)
    signal: str = "own_grade"
    # send each row's `dimension` and `locale` with the request, which fill the judge-training template's
    # {dimension}/{question}/{criteria}/{locale} (menlo_pairwise); false for a template that takes the whole task
    # in its prompt (menlo_grpo_grm), which has no such slots
    send_context: bool = True
    # judge every pair in both A/B orders (twice the judge calls, no position bias)
    both_orders: bool = False
    # client-side deadline of one HTTP attempt (also sent as the request's timeout_s); policy GRPO refuses a worst
    # wait (attempts x timeout_s + back-offs, per round of `concurrency` requests) not below grpo.collective_timeout_s
    # in a training step, a validation pass or the probe (train.grpo.reward.wait)
    timeout_s: float = 120.0
    # extra attempts after the first one
    retries: int = 3
    backoff_s: float = 1.0  # seconds before retry k+1: backoff_s * 2^k plus up to 10% jitter
    backoff_max_s: float = 30.0  # cap in seconds of one retry's backoff
    # groups in flight at once per worker (the server batches concurrent judge calls)
    concurrency: int = 8
    # send each group the moment its rollouts exist, so judging overlaps the next generate call
    # (train.grpo.overlap; same rollouts, rewards and update as false, the strict generate -> reward order)
    overlap: bool = True

    def check(self, where: str = "") -> None:
        # retries, backoff_s, backoff_max_s >= 0: check_tree's floor for every number
        one_of(self.scheme, SCHEMES, dotted(where, "scheme"))
        one_of(self.signal, SIGNALS, dotted(where, "signal"))
        if self.url and not self.url.startswith(("http://", "https://")):
            fail(dotted(where, "url"), f"expected http(s)://host:port[/prefix], got {self.url!r}")
        for name in ("timeout_s", "concurrency"):
            positive(getattr(self, name), dotted(where, name))
        if not isinstance(self.overlap, bool):
            fail(dotted(where, "overlap"), f"expected true or false, got {self.overlap!r}")


    def worst_wait_s(self) -> float:
        """The longest one group can wait for its rewards: every attempt running to `timeout_s`, every back-off at
        its longest (`backoff_delay` with the full 10% jitter). `retries` 3, `timeout_s` 600, back-off 5 s doubling:
        4 x 600 + (5 + 10 + 20) x 1.1 = 2438.5 s.

        >>> RewardServiceConfig(timeout_s=600, retries=3, backoff_s=5, backoff_max_s=60).worst_wait_s()
        2438.5
        """
        backoffs = sum(min(self.backoff_s * 2 ** (k - 1), self.backoff_max_s) for k in range(1, self.retries + 1))
        return round((self.retries + 1) * self.timeout_s + backoffs * (1.0 + MAX_JITTER), 6)


# the most `backoff_delay` adds to a back-off, as a share of it
MAX_JITTER = 0.1


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Sleep before retry number `attempt` (1-based): base · 2^(attempt-1), capped, plus up to 10% jitter.

    >>> backoff_delay(3, 1.0, 30.0, random.Random(0)) >= 4.0
    True
    """
    delay = min(base_s * 2 ** (attempt - 1), cap_s)
    return delay * (1.0 + MAX_JITTER * rng.random())


class GroupRewardClient:
    """One client per worker (a keep-alive HTTP pool or a Serve handle); `score` is thread-safe."""

    def __init__(self, cfg: RewardServiceConfig, sleep: Callable[[float], None] = time.sleep, seed: int = 0,
                 transport: Transport | None = None):
        if not cfg.url and not cfg.app:
            raise ValueError("reward.url: the reward service URL is empty (the job sets it when it starts the app)")
        if cfg.app and transport is None:
            raise ValueError("reward.app: calls through a Serve handle need its transport "
                             "(train.grpo.reward.handle.reward_transport)")
        self.cfg = cfg
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._transport = transport or HTTPTransport(cfg)

    def close(self) -> None:
        self._transport.close()

    def body(self, prompt: str, responses: list[str], reference: str | None = None, *, dimension: str | None = None,
             locale: str | None = None, scheme: str | None = None, both_orders: bool | None = None) -> dict:
        body = {"prompt": prompt, "responses": responses, "scheme": scheme or self.cfg.scheme,
                "both_orders": self.cfg.both_orders if both_orders is None else both_orders,
                "timeout_s": self.cfg.timeout_s}
        optional = {"reference": reference, "dimension": dimension, "locale": locale}
        return body | {k: v for k, v in optional.items() if v is not None}

    def score(self, prompt: str, responses: list[str], reference: str | None = None, *, dimension: str | None = None,
              locale: str | None = None, scheme: str | None = None, both_orders: bool | None = None) -> GroupOutcome:
        """The group's rewards, after up to `retries` retries; see the module docstring for failures.

        `dimension` / `locale` fill the served template's MENLO context; `scheme` / `both_orders` override the
        config's for this request (validation judges one answer against the baseline in both orders)."""
        body = self.body(prompt, responses, reference, dimension=dimension, locale=locale, scheme=scheme,
                         both_orders=both_orders)
        started, error = time.perf_counter(), ""
        for attempt in range(1, self.cfg.retries + 2):
            if attempt > 1:
                self._sleep(backoff_delay(attempt - 1, self.cfg.backoff_s, self.cfg.backoff_max_s, self._rng))
            error, outcome = self._attempt(body, len(responses))
            if outcome is not None or not error.startswith(("timeout", "connect", "http_retry")):
                elapsed = time.perf_counter() - started
                if outcome is not None:
                    return dataclasses.replace(outcome, attempts=attempt, latency_s=elapsed)
                return failed(error, attempt, elapsed)
        return failed(error.replace("http_retry_", "http_"), self.cfg.retries + 1, time.perf_counter() - started)

    def _attempt(self, body: dict, n: int) -> tuple[str, GroupOutcome | None]:
        """One request: ("", outcome) on success, else (error kind, None); retryable kinds start with timeout /
        connect / http_retry."""
        try:
            status, data, text = self._transport.post(body)
        except TransportFailure as exc:
            return exc.kind, None
        if status in (401, 403):
            raise RewardServiceAuthError(f"reward service answered {status} ({_message(data, text)}); check "
                                         f"reward.token_env ({self.cfg.token_env or 'unset'})")
        if status in RETRY_STATUS:
            return f"http_retry_{status}", None
        if status != 200:
            return f"http_{status}: {_message(data, text)}", None
        return "", parse_group_body(data, n, self.cfg.signal)


class Transport(Protocol):
    """How one request reaches the service: `post(body)` -> (status, JSON body or None, raw text), or raises
    `TransportFailure` when no answer came."""

    def post(self, body: dict) -> tuple[int, object, str]: ...

    def close(self) -> None: ...


class TransportFailure(Exception):
    """No answer from the service; `kind` is the error kind (``timeout``, ``connect: <error>``)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class HTTPTransport:
    """`POST <url>/reward/group` with the bearer token from `token_env`; answers (status, JSON or None, text)."""

    def __init__(self, cfg: RewardServiceConfig):
        headers = {}
        if cfg.token_env:
            token = os.environ.get(cfg.token_env, "")
            if not token:
                raise RewardServiceAuthError(f"reward.token_env: environment variable {cfg.token_env} is not set")
            headers["Authorization"] = f"Bearer {token}"
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        self._http = httpx.Client(base_url=cfg.url.rstrip("/"), headers=headers, timeout=cfg.timeout_s, limits=limits)

    def post(self, body: dict) -> tuple[int, object, str]:
        try:
            resp = self._http.post("/reward/group", json=body)
        except httpx.TimeoutException:
            raise TransportFailure("timeout") from None
        except httpx.TransportError as exc:
            raise TransportFailure(f"connect: {type(exc).__name__}") from None
        try:
            data = resp.json()
        except ValueError:
            data = None
        return resp.status_code, data, resp.text

    def close(self) -> None:
        self._http.close()


def parse_group_response(resp: httpx.Response, n: int, signal: str = "own_grade") -> GroupOutcome:
    """A 200 HTTP response -> outcome (see `parse_group_body`)."""
    try:
        data = resp.json()
    except ValueError:
        return failed("bad_response")
    return parse_group_body(data, n, signal)


def parse_group_body(data: object, n: int, signal: str = "own_grade") -> GroupOutcome:
    """A 200 body -> outcome with `signal` as the rewards (the body's `rewards` are margins, its items'
    `mean_grade` own grades); a body without n numeric values is a failure (`bad_response` / `null_rewards`)."""
    try:
        rewards = data["rewards"]
        items = data.get("items", [])
        failed_judgments = int(data.get("counts", {}).get("n_failed_judgments", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return failed("bad_response")
    if not isinstance(rewards, list) or len(rewards) != n:
        return failed("bad_response")
    if any(r is None for r in rewards):
        outcome = failed("null_rewards")
        outcome.failed_judgments = failed_judgments
        return outcome
    if data.get("scheme") == "listwise":
        # one call ranked the group: the reward is its normalised rank (or grade) in 0..1; `signal` is pairwise's
        listwise = [float(r) for r in rewards]
        return GroupOutcome(rewards=listwise, components={"grm_listwise": listwise},
                            failed_judgments=failed_judgments, verdicts=[])
    grades = [item.get("mean_grade") for item in items] if len(items) == n else []
    components = {"grm_margin": [float(r) for r in rewards]}
    if grades and all(g is not None for g in grades):
        components["grm_mean_grade"] = [float(g) for g in grades]
    elif signal == "own_grade":
        # a reward with no grade cannot be: a body that says so is malformed, not a grade of 0
        return failed("bad_response")
    return GroupOutcome(rewards=components["grm_mean_grade" if signal == "own_grade" else "grm_margin"],
                        components=components, failed_judgments=failed_judgments, verdicts=judgment_verdicts(data))


def judgment_verdicts(data: dict) -> list[tuple[int, int]]:
    """(first slot's grade, second slot's grade) of each parsed judgment of a body (`JudgmentOut`: `a` is the
    response shown first); a body without judgments (an older server) gives none."""
    judgments = data.get("judgments") or []
    return [(j["grade_a"], j["grade_b"]) for j in judgments if isinstance(j, dict) and j.get("parse_status") == "ok"
            and isinstance(j.get("grade_a"), int) and isinstance(j.get("grade_b"), int)]


def _message(data: object, text: str) -> str:
    try:
        return str(data["error"]["message"])[:200]
    except (KeyError, TypeError):
        return text[:200]
