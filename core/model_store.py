"""Where a cluster job's models and outputs live: the shared filesystem every node mounts, and the model story.

Every node of a quorum cluster mounts one shared filesystem at the same path, declared as `ray.shared_storage`
(cluster.yaml mounts EFS there, k8s/shared-storage.yaml's ReadWriteMany claim is mounted there in every pod; both
/mnt/shared). Two rules follow, checked before any work:

- Outputs. `run.root` (run directories, adapters, the request cache, W&B files) and any trainer `storage_path`
  (Ray Train checkpoints) that is a local path must lie on the shared storage: a node's own disk goes away with the
  node when the autoscaler removes it, and other nodes never see it. URIs (s3://, gs://) are durable and are used as
  they are (training jobs refuse them for `run.root` on their own: adapters are read back as directories).
- Models. `ray.models` says how `hf:<owner>/<name>` models reach the workers. `hub_access: offline` (the default)
  loads them only from the Hugging Face cache under `hf_home`, filled once by `quorum stage-models CONFIG`; a hub
  model that is not staged there stops the job before any work, naming its key. `online` lets workers download into
  `hf_home` (a cluster whose nodes reach the hub; gated repos need HF_TOKEN in the nodes' environment). Every worker's
  runtime env gets HF_HOME, HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE from these keys (core.ray_env.worker_env), never
  from the shell that submitted the job: Ray's job server starts a submitted driver with the environment of the
  cluster's job supervisor, not the submitting shell's (ray/dashboard/modules/job/job_supervisor.py:367,
  `env = os.environ.copy()` in the supervisor actor; JobSubmitRequest carries no environment).

Pure apart from reading the cache directory (huggingface_hub's own cache layout); no Ray import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import Section, dotted, fail, one_of
from core.errors import ConfigError

HUB_PREFIX = "hf:"
HUB_ACCESS = ("offline", "online")
# the Hugging Face cache variables the model story sets; a runtime env naming them would contradict it
MODEL_ENV_KEYS = ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                  "TRANSFORMERS_CACHE")
# Meta's original consolidated checkpoints (`original/consolidated.*.pth`) sit beside the HF weights in the
# meta-llama repos and double their size; neither transformers nor vLLM reads them
STAGE_IGNORE = ("original/*",)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class ModelsConfig(Section):
    """How `hf:<repo>` models reach every worker (`ray.models`)."""

    # offline: load only from the cache under hf_home (staged by `quorum stage-models`); online: download there
    hub_access: str = "offline"
    # HF_HOME of every worker: a directory on ray.shared_storage; "" = each machine's own default cache
    hf_home: str = ""

    def check(self, where: str = "") -> None:
        one_of(self.hub_access, HUB_ACCESS, dotted(where, "hub_access"))
        if self.hf_home and ("://" in self.hf_home or not Path(self.hf_home).is_absolute()):
            fail(dotted(where, "hf_home"), f"{self.hf_home!r} must be an absolute directory that every node mounts "
                                           "(the Hugging Face cache is a directory tree, not a URI)")

    def env(self) -> dict[str, str]:
        """The worker environment of this model story."""
        offline = "1" if self.hub_access == "offline" else "0"
        env = {"HF_HUB_OFFLINE": offline, "TRANSFORMERS_OFFLINE": offline}
        if self.hf_home:
            env["HF_HOME"] = self.hf_home
        return env

    def hub_cache(self) -> str:
        """The hub cache directory models load from: `<hf_home>/hub`, else this machine's default."""
        if self.hf_home:
            return str(Path(self.hf_home) / "hub")
        from huggingface_hub import constants

        return constants.HF_HUB_CACHE


def on_storage(path: str, storage: str) -> bool:
    """Whether local absolute `path` lies under directory `storage` (lexically: symlinks are the mount's business).

    >>> on_storage("/mnt/shared/quorum/runs", "/mnt/shared"), on_storage("/mnt/shared2/runs", "/mnt/shared")
    (True, False)
    """
    path, storage = os.path.normpath(path), os.path.normpath(storage)
    return Path(path).is_absolute() and (path == storage or path.startswith(storage.rstrip("/") + "/"))


def hub_models(config: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, repo id) of every `hf:<repo>` value in a config mapping, list items by index."""
    if isinstance(config, dict):
        for key, value in config.items():
            yield from hub_models(value, f"{where}.{key}" if where else str(key))
    elif isinstance(config, (list, tuple)):
        for i, item in enumerate(config):
            yield from hub_models(item, f"{where}.{i}")
    elif isinstance(config, str) and config.startswith(HUB_PREFIX) and config[len(HUB_PREFIX):].strip():
        yield where, config[len(HUB_PREFIX):].strip()


def models_by_repo(config: dict) -> dict[str, list[str]]:
    """{repo id: [dotted keys naming it]}, in the order the config names them."""
    found: dict[str, list[str]] = {}
    for key, repo in hub_models(config):
        found.setdefault(repo, []).append(key)
    return found


def _output_paths(config: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of `run.root` and of every trainer `storage_path` in a config mapping."""
    if isinstance(config, dict):
        for key, value in config.items():
            dotted_key = f"{where}.{key}" if where else str(key)
            if isinstance(value, str) and (dotted_key == "run.root" or key == "storage_path"):
                yield dotted_key, value
            else:
                yield from _output_paths(value, dotted_key)
    elif isinstance(config, (list, tuple)):
        for i, item in enumerate(config):
            yield from _output_paths(item, f"{where}.{i}")


def check_cluster_storage(config: dict) -> None:
    """The load-time rules of a config that declares `ray.shared_storage` (a cluster config); pure.

    Raises ConfigError naming the key: an output path off the shared storage, or offline hub models with no
    `ray.models.hf_home` on it (each node would look in its own, empty cache).
    """
    ray = config.get("ray") or {}
    storage = ray.get("shared_storage", "")
    if not storage:
        return
    for key, value in _output_paths(config):
        if value and "://" not in value and not on_storage(value, storage):
            fail(key, f"{value!r} is not on ray.shared_storage ({storage}): results and checkpoints on a node's own "
                      f"disk vanish when the autoscaler removes the node, and other nodes never see them. Use a path "
                      f"under {storage} (e.g. {storage.rstrip('/')}/quorum/runs), an s3:// URI, or ray.shared_storage="
                      "'' for a one-machine run")
    models = ray.get("models") or {}
    repos = models_by_repo({k: v for k, v in config.items() if k != "ray"})
    if repos and models.get("hub_access") == "offline" and not models.get("hf_home"):
        repo, keys = next(iter(repos.items()))
        fail("ray.models.hf_home", f"{keys[0]} names hub model {repo!r} with ray.models.hub_access=offline, but no "
                                   f"hf_home on the shared storage: each node would look in its own empty cache. Set "
                                   f"ray.models.hf_home={storage.rstrip('/')}/hf and stage the models once with "
                                   "`quorum stage-models CONFIG`")


def missing_files(snapshot: Path) -> list[str]:
    """What a model snapshot directory lacks to load: config.json and its weights (every shard of an index)."""
    if not (snapshot / "config.json").is_file():
        return ["config.json"]
    for index in WEIGHT_INDEXES:
        if (snapshot / index).is_file():
            shards = sorted(set(json.loads((snapshot / index).read_text()).get("weight_map", {}).values()))
            return [s for s in shards if not (snapshot / s).is_file()]
    if any((snapshot / name).is_file() for name in WEIGHT_FILES):
        return []
    return ["model weights (" + " / ".join(WEIGHT_FILES + WEIGHT_INDEXES) + ")"]


def snapshot_dir(repo: str, hub_cache: str) -> Path | None:
    """The cached snapshot of `repo`'s main revision under `hub_cache` (huggingface_hub's layout), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json", cache_dir=hub_cache)
    return Path(found).parent if isinstance(found, str) else None


def unstaged(config: dict, models: ModelsConfig) -> dict[str, tuple[list[str], str]]:
    """{repo: (keys, what is missing)} for every hub model of `config` not fully in `models`' cache."""
    cache = models.hub_cache()
    result = {}
    for repo, keys in models_by_repo({k: v for k, v in config.items() if k != "ray"}).items():
        snapshot = snapshot_dir(repo, cache)
        missing = ["the whole model"] if snapshot is None else missing_files(snapshot)
        if missing:
            result[repo] = (keys, ", ".join(missing))
    return result


def check_models_staged(config: dict, models: ModelsConfig, config_path: str = "CONFIG") -> None:
    """Before any work: with offline hub access, every hub model of `config` is complete in the cache.

    Raises ConfigError naming the first unstaged model's key (and counting the others).
    """
    if models.hub_access != "offline":
        return
    missing = unstaged(config, models)
    if not missing:
        return
    repo, (keys, what) = next(iter(missing.items()))
    others = f" ({len(missing) - 1} more hub models are not staged either)" if len(missing) > 1 else ""
    raise ConfigError(f"{keys[0]}: hub model {repo!r} is not staged in {models.hub_cache()} (missing: {what}) and "
                      f"ray.models.hub_access=offline{others}. Stage the config's models once with `quorum "
                      f"stage-models {config_path}` on a machine that mounts the shared storage and reaches the hub, or set "
                      "ray.models.hub_access=online on a cluster whose nodes reach the hub")
