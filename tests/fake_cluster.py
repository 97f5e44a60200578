"""A local autoscaling Ray cluster with cluster.yaml's node types, on Ray's fake multi-node provider.

What `ray.cluster_utils.AutoscalingCluster` does (a head started with `--autoscaling-config` of provider type
`fake_multinode` and `RAY_FAKE_CLUSTER=1`; the autoscaler "launches" a worker node by starting another raylet on
this machine), but isolated like tests/ray_head.py: `AutoscalingCluster.start()` and `.shutdown()` run
`ray stop --force`, which would stop every Ray on the machine (the session's `ray_local`, other people's clusters),
its generated config reads an example.yaml the Ray 2.60 wheel does not ship, and its provider dials GCS port 6379.
Here the head gets its own `--temp-dir` and free ports, the provider is told the head's GCS address, and teardown
ends only the processes whose command line names that temp dir (worker raylets live under the head's session dir).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from tests.ray_head import REPO, VENV_BIN, Head

# seconds between autoscaler rounds, and how long a worker's heartbeat may be missing before the autoscaler
# terminates it as unhealthy (and launches a replacement for the demand it served); Ray's defaults are 5 s and 30 s
UPDATE_INTERVAL_S = 1
HEARTBEAT_TIMEOUT_S = 5


def mirrored_node_types(cpus: float = 1) -> dict:
    """cluster.yaml's worker types with its bounds, each node scaled down to `cpus` CPUs; a gpu_worker advertises
    one `gpu_slot` per GPU of cluster.yaml's instead of GPUs (this machine has none)."""
    cluster = yaml.safe_load((REPO / "cluster.yaml").read_text())
    types = {}
    for name, node in cluster["available_node_types"].items():
        if name == cluster["head_node_type"]:
            continue
        resources = {"CPU": cpus}
        if node["resources"].get("GPU"):
            resources["gpu_slot"] = node["resources"]["GPU"]
        types[name] = {"resources": resources, "node_config": {}, "min_workers": node["min_workers"],
                       "max_workers": node["max_workers"]}
    return types


class FakeCluster(Head):
    """`start()` brings up the head (the autoscaler runs in it); workers come and go with demand."""

    def __init__(self, worker_types: dict, head_cpus: float = 1, idle_timeout_minutes: float = 0.05,
                 max_workers: int = 3):
        super().__init__()
        self.gcs_port = next(a.split("=", 1)[1] for a in self.start_args if a.startswith("--port="))
        self.gcs_address = f"127.0.0.1:{self.gcs_port}"
        self.head_cpus = head_cpus
        # the fake provider's config: Ray's fake_multi_node/example.yaml with our node types and the head's GCS
        self.config = {
            "cluster_name": "quorum-fake", "max_workers": max_workers, "upscaling_speed": 1.0,
            # minutes; the autoscaler compares `now - last_used` with 60 * this, so fractions are honoured
            "idle_timeout_minutes": idle_timeout_minutes,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": self.gcs_address},
            "available_node_types": {**copy.deepcopy(worker_types),
                                     "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {},
                                                          "max_workers": 0}},
            "head_node_type": "ray.head.default",
            "auth": {}, "docker": {}, "initialization_commands": [], "setup_commands": [],
            "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
            "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        }

    def start(self) -> None:
        config = Path(self.temp_dir, "autoscaling.json")
        env = dict(self.env, RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S=str(UPDATE_INTERVAL_S),
                   AUTOSCALER_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S))
        # loopback-only and short-lived: no token, so this process can poll the GCS without Ray's in-process token
        # state (the session's `ray_local` has its own) and the job's driver needs nothing but the address
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env["RAY_AUTH_MODE"] = "disabled"
        # the GCS notices a killed raylet after period x threshold (Ray's default 3 s x 5)
        system_config = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
        args = [str(VENV_BIN / "ray"), "start", "--head", f"--autoscaling-config={config}",
                f"--num-cpus={self.head_cpus}", "--include-dashboard=false",
                f"--system-config={json.dumps(system_config, separators=(',', ':'))}",
                *(a for a in self.start_args if not a.startswith("--dashboard-port="))]
        self.env = env
        for attempt in range(2):
            Path(self.temp_dir).mkdir(exist_ok=True)
            config.write_text(json.dumps(self.config))
            done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
                                  check=False)
            # Ray gives a new raylet 30 s (fixed) to register with the GCS; on a machine this loaded it can miss
            # that once: clear what started and try again
            if not done.returncode or attempt:
                break
            self.stop()  # ends this head's processes and removes its temp dir
        if done.returncode:
            raise AssertionError(f"`ray start --head` exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                 f"{done.stderr[-3000:]}")

    def nodes(self, dead_too: bool = False) -> list[dict]:
        """Alive nodes (and with `dead_too` the removed ones) as {node_id, resources, head, manager_port, alive},
        from the GCS."""
        from ray._raylet import GcsClient

        client = GcsClient(address=self.gcs_address)
        found = []
        for node_id, info in client.get_all_node_info(timeout=10).items():
            alive = info.state == 0  # GcsNodeInfo.ALIVE
            if alive or dead_too:
                found.append({"node_id": node_id.hex(), "resources": dict(info.resources_total),
                              "head": bool(info.is_head_node), "manager_port": info.node_manager_port,
                              "alive": alive})
        return found

    def actor_nodes(self, class_name: str) -> list[str]:
        """The node id each actor of `class_name` runs or ran on (dead actors keep theirs), from the GCS's actor
        table; read through a GlobalState of its own (the GcsClient's async calls never resolve outside Ray's
        event loop, and this process's `ray.state` belongs to the session's `ray_local`)."""
        from ray._private.state import GlobalState
        from ray._raylet import GcsClientOptions
        from ray.core.generated.gcs_pb2 import ActorTableData

        state = GlobalState()
        state._initialize_global_state(GcsClientOptions.create(self.gcs_address, None, allow_cluster_id_nil=True,
                                                               fetch_cluster_id_if_nil=False))
        try:
            table = [ActorTableData.FromString(raw) for raw in state._connect_and_get_accessor().get_actor_table(
                None, None)]
        finally:
            state.disconnect()
        return [a.node_id.hex() for a in table if a.class_name == class_name]

    def gpu_nodes(self) -> list[dict]:
        return [n for n in self.nodes() if n["resources"].get("gpu_slot")]

    def wait_for(self, predicate, what: str, timeout: float) -> float:
        """Poll until `predicate()` holds; return the seconds it took or fail naming `what`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if predicate():
                return time.monotonic() - start
            time.sleep(0.1)  # a GCS read per poll: cheap; a coarser poll only adds to each wait
        raise AssertionError(f"{what}: not within {timeout} s; alive nodes: {self.nodes()}\n"
                             f"autoscaler log:\n{self.monitor_log()}")

    def keep_logs(self, dest: Path, max_bytes: int = 4 << 20) -> Path:
        """Copy the cluster's logs (the autoscaler's monitor.*, the GCS's, every node's raylet and workers') to
        `dest` before `stop()` removes the temp dir with them: what a failed run is read from afterwards."""
        for log in Path(self.temp_dir).glob("session_*/logs/**/*"):
            if log.is_file() and log.stat().st_size <= max_bytes:
                target = dest / log.relative_to(Path(self.temp_dir))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, target)
        return dest

    def monitor_log(self, chars: int = 4000) -> str:
        """The end of the autoscaler's log (what it launched and terminated, and why)."""
        logs = sorted(Path(self.temp_dir).glob("session_*/logs/monitor.*"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)
