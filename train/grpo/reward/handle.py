"""The Serve-handle transport of `train.grpo.reward.client`: a GRM app of this Ray cluster called without HTTP.

    client = GroupRewardClient(cfg, transport=reward_transport(cfg))   # cfg.app set: a handle; else None = HTTP

A `DeploymentHandle` reaches a replica on any node through Ray, so a training worker needs no Serve HTTP proxy on
its own node (Ray 2.60 runs proxies only on the head and on nodes holding a replica). The app's
`reward_group_in_cluster` answers (HTTP status, JSON body), exactly what `POST /reward/group` would, so retries and
error kinds stay the client's; what only a handle can raise maps onto them here: Serve's back-pressure -> 503,
a dead or unavailable replica or app -> ``connect: <error>``, an exception raised in the replica -> 500, no
answer within `timeout_s` -> ``timeout`` (the call is cancelled). Kept apart from the pure client: it imports Ray.
"""

from __future__ import annotations

from train.grpo.reward.client import RewardServiceConfig, TransportFailure


def reward_transport(cfg: RewardServiceConfig) -> ServeHandleTransport | None:
    """The handle transport when `cfg.app` names a Serve app; None (HTTP to `cfg.url`) otherwise."""
    return ServeHandleTransport(cfg) if cfg.app else None


class ServeHandleTransport:
    """`reward_group_in_cluster` of Serve app `app` through a DeploymentHandle (see the module docstring)."""

    def __init__(self, cfg: RewardServiceConfig):
        from ray import serve
        from ray.serve.exceptions import RayServeException

        try:
            handle = serve.get_app_handle(cfg.app)
        except RayServeException as exc:
            raise ValueError(f"reward.app: no Serve application {cfg.app!r} in this Ray cluster ({exc})") from None
        self._method = handle.reward_group_in_cluster
        self._timeout_s = cfg.timeout_s

    def post(self, body: dict) -> tuple[int, object, str]:
        from ray import exceptions as ray_errors
        from ray.serve import exceptions as serve_errors

        response = self._method.remote(body)
        try:
            status, data = response.result(timeout_s=self._timeout_s)
        except TimeoutError:
            response.cancel()
            raise TransportFailure("timeout") from None
        except serve_errors.BackPressureError as exc:
            return 503, {"error": {"message": str(exc)[:200]}}, ""
        except (ray_errors.RayActorError, serve_errors.DeploymentUnavailableError,
                serve_errors.ReplicaUnavailableError, serve_errors.RequestCancelledError) as exc:
            raise TransportFailure(f"connect: {type(exc).__name__}") from None
        except ray_errors.RayTaskError as exc:  # raised in the replica: what the HTTP route answers with a 500
            return 500, {"error": {"message": f"{type(exc.cause).__name__}: {exc.cause}"[:200]}}, ""
        return status, data, ""

    def close(self) -> None:
        return None
