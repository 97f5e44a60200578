"""Before a stage asks Ray for workers or actors: will the cluster ever grant them? (`core.resource_fit` is the
arithmetic; this module reads the cluster.)

`ensure_fits(ask)` reads the alive nodes (`ray.nodes()`), what this job's entrypoint holds (`ray job submit
--entrypoint-num-cpus/-gpus/-resources`, from the job's record in the GCS), and the autoscaler's node types (the
cluster config the autoscaler reports to the GCS, which Ray Data and Ray Train read the same way). A request that can
never fit raises `ConfigError` (exit 2) naming the stage, the numbers and the keys; one that fits only once the
autoscaler adds nodes asks the autoscaler for them (`NodeRequest`: `request_resources` through Ray Data's
autoscaling coordinator) and waits up to `QUORUM_AUTOSCALE_WAIT_S` seconds (default 900), logging what it waits for
every 30 s, then raises. Without a connected Ray it does nothing (the jobs connect before their first Ray stage).
`ensure_all_fit(asks)` does the same for everything a job must hold at once (`core.resource_fit.verdict_all`: each
ask and their sum).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid

from core.errors import ConfigError
from core.resource_fit import (
    OK,
    REFUSE,
    Ask,
    Capacity,
    NodeType,
    Verdict,
    autoscaler_in_status,
    describe,
    describe_all,
    verdict_all,
)

log = logging.getLogger("quorum.resources")

WAIT_ENV = "QUORUM_AUTOSCALE_WAIT_S"
DEFAULT_WAIT_S = 900.0
LOG_EVERY_S = 30.0
POLL_S = 2.0


def wait_limit_s() -> float:
    raw = os.environ.get(WAIT_ENV, "")
    try:
        return float(raw) if raw.strip() else DEFAULT_WAIT_S
    except ValueError:
        raise ConfigError(f"{WAIT_ENV}: must be a number of seconds, got {raw!r}") from None


def entrypoint_resources() -> dict[str, float]:
    """What `ray job submit --entrypoint-*` reserved for this job's entrypoint ({} when not submitted as a job).

    Ray runs the entrypoint under a supervisor actor created with those resources for the job's whole life; the
    job's record (`JobInfo`, in the GCS key-value store) is the only place a driver can read them back.
    """
    try:
        metadata = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("metadata") or {}
    except ValueError:
        return {}
    submission_id = metadata.get("job_submission_id")
    if not submission_id:
        return {}
    try:
        from ray._private.ray_constants import KV_NAMESPACE_JOB
        from ray.dashboard.modules.job.common import JobInfoStorageClient
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id),
                               namespace=KV_NAMESPACE_JOB)
        info = json.loads(raw) if raw else {}
    # a private record: if its shape changes, count nothing held rather than fail the job
    except Exception as exc:  # noqa: BLE001
        log.debug("cannot read job %s's entrypoint resources: %s", submission_id, exc)
        return {}
    held = {"CPU": info.get("entrypoint_num_cpus") or 0.0, "GPU": info.get("entrypoint_num_gpus") or 0.0,
            "memory": info.get("entrypoint_memory") or 0.0, **(info.get("entrypoint_resources") or {})}
    return {name: float(amount) for name, amount in held.items() if amount}


def autoscaler_node_types() -> tuple[tuple[NodeType, ...], bool]:
    """The autoscaler's node types from the cluster config it reports to the GCS, and whether an autoscaler runs
    without reporting them (the cluster launcher's autoscaler only writes its status to the GCS key-value store)."""
    import ray._private.state
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    types: tuple[NodeType, ...] = ()
    try:
        config = ray._private.state.state.get_cluster_config()
    # a private API (what Ray Data and Ray Train read): absent means "unknown"
    except Exception as exc:  # noqa: BLE001
        log.debug("cannot read the autoscaler's cluster config: %s", exc)
        config = None
    if config is not None:
        types = tuple(NodeType(g.name, {k: float(v) for k, v in g.resources.items()}, int(g.max_count))
                      for g in config.node_group_configs if g.resources and g.max_count != 0)
    try:
        raw = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
        running = autoscaler_in_status(json.loads(raw)) if raw else False
    except Exception:  # noqa: BLE001 - no readable status, no autoscaler known
        running = False
    return types, running and not types


def capacity() -> Capacity:
    import ray

    nodes = tuple({k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive"))
    types, unknown = autoscaler_node_types()
    return Capacity(nodes=nodes, held=entrypoint_resources(), node_types=types, autoscaler_unknown=unknown)


class NodeRequest:
    """Ask the autoscaler for room for `bundles` (`[]` withdraws the request). A stage that waits before asking Ray
    for its actors puts no demand on the cluster by itself, so the autoscaler would never add the nodes it waits
    for: a standing `request_resources` is the autoscaler's API for that (it counts what is in use).

    Through Ray Data's AutoscalingCoordinator, not `ray.autoscaler.sdk.request_resources` directly: the cluster has
    one request slot, last writer wins, and the coordinator (a detached actor every Ray Data execution starts) writes
    the merged requests of its requesters into it on each change and every 20 s, an empty list when it has none. A
    request written beside it is erased within seconds and the autoscaler never sees it (a job then waited its whole
    `QUORUM_AUTOSCALE_WAIT_S` for a node no one asked for). As one more requester, quorum's bundles are in every
    write. The coordinator drops a request not renewed within `expire_after_s`, so `ensure_all_fit` renews it each
    poll, and a driver killed while it waits leaves nothing standing. (`ray.data._internal`: Ray is pinned, and
    tests/test_resource_fit.py pins this against the coordinator's own writes.)"""

    TTL_S = 60.0

    def __init__(self):
        self.requester_id = f"quorum-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._client, self._job = None, None

    def __call__(self, bundles: list[dict[str, float]]) -> None:
        import ray
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            DefaultAutoscalingCoordinator,
        )

        job = ray.get_runtime_context().get_job_id()  # a new connection (ray.init) needs a new actor handle
        if self._client is None or job != self._job:
            self._client, self._job = DefaultAutoscalingCoordinator(self.requester_id), job
        if bundles:
            self._client.request_resources(bundles, expire_after_s=self.TTL_S)
        else:
            self._client.cancel_request()


request_nodes = NodeRequest()


def ensure_fits(ask: Ask, read=capacity, limit_s: float | None = None, clock=time.monotonic,
                sleep=time.sleep, demand=request_nodes) -> Verdict:
    """Return once `ask` fits the cluster's nodes; raise ConfigError if it never can (or the autoscaler did not make
    room within the limit). While it waits, the autoscaler is asked for the room (`demand`). `read`, `clock`,
    `sleep` and `demand` are for tests."""
    return ensure_all_fit([ask], read, limit_s, clock, sleep, demand)


def ensure_all_fit(asks: list[Ask], read=capacity, limit_s: float | None = None, clock=time.monotonic,
                   sleep=time.sleep, demand=request_nodes) -> Verdict:
    """`ensure_fits` for everything a job places at the same time (`core.resource_fit.verdict_all`): each ask and
    their sum. A job calls it once, before any work, with all of them (policy GRPO: the training workers and the
    reward service's replicas); each stage still checks its own ask when it starts."""
    import ray

    asks = [ask for ask in asks if ask.count > 0]
    if not asks or (read is capacity and not ray.is_initialized()):
        return Verdict(OK)
    what = describe(asks[0]) if len(asks) == 1 else describe_all(asks)
    try:
        first = read()
    # a guard must not stop a job Ray could run: a connection that cannot report its nodes (Ray Client) skips it
    except Exception as exc:  # noqa: BLE001
        log.warning("%s: cannot read the cluster's resources (%s); not checked", what, exc)
        return Verdict(OK)
    result = verdict_all(asks, first)
    if result.kind == OK:
        return result
    if result.kind == REFUSE:
        raise ConfigError(result.message)
    limit = wait_limit_s() if limit_s is None else limit_s
    started = last_log = clock()
    log.warning("%s (up to %.0f s, %s)", result.message, limit, WAIT_ENV)
    bundles = [{k: v for k, v in ask.unit.items() if v > 0} for ask in asks for _ in range(ask.count)]
    demand(bundles)
    try:
        while clock() - started < limit:
            sleep(POLL_S)
            result = verdict_all(asks, read())
            if result.kind == OK:
                log.info("%s: the cluster has room now, after %.0f s", what, clock() - started)
                return result
            if result.kind == REFUSE:
                raise ConfigError(result.message)
            if clock() - last_log >= LOG_EVERY_S:
                last_log = clock()
                log.warning("%s (%.0f s of %.0f s)", result.message, last_log - started, limit)
            demand(bundles)  # renewed, or the request expires (NodeRequest.TTL_S)
    finally:
        # the stage's own request for actors / workers holds the nodes from here on
        demand([])
    keys = " or ".join(key for ask in asks for key in ask.keys) or "the stage's resources"
    raise ConfigError(f"{result.message}; after {limit:.0f} s the cluster still has no room ({WAIT_ENV} sets the "
                      f"wait). Change {keys}, or check the autoscaler")

