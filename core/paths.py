"""Where a config's relative paths point, on a laptop and inside a `ray job submit` job.

`quorum run` resolves relative paths against the current directory. A submitted job's current directory is Ray's
temporary copy of `--working-dir` (under the Ray session's directory, deleted with it), so there:

- `QUORUM_HOME` (an environment variable of the job, given with `--runtime-env-json`) is the directory relative
  paths mean: a relative `run.root` becomes `$QUORUM_HOME/<run.root>`; a relative input path is read from the
  uploaded working directory when it is there (`configs/data/...`) and from `$QUORUM_HOME/<path>` otherwise
  (`../shared/data/...`), so the job behaves as `quorum run` started in `$QUORUM_HOME`.
- Without `QUORUM_HOME`, a relative `run.root` (the outputs would vanish with the session) and a relative input
  path that leaves the working directory (it is not in the upload) stop the job before any work, naming the key.

URIs (`s3://...`) and absolute paths are never touched. Outside a submitted job `QUORUM_HOME` applies the same
way when it is set, and nothing changes when it is not. Pure: no Ray import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.config import ConfigError, apply_override, read_yaml, with_defaults

HOME_ENV = "QUORUM_HOME"
# set by Ray's job supervisor for a submitted job's entrypoint (and only there)
SUBMITTED_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# config keys holding input file or directory paths (model names and prompt template names are not paths)
PATH_KEYS = ("path", "rubrics", "config", "adapter", "init_adapter", "checkpoint", "fallback_sources")
PATH_SUFFIXES = ("_path", "_dir")
PATH_MAPS = ("extra_adapters",)  # name -> path
# free-form mappings whose keys are not config keys (environment variables for workers)
OPAQUE_MAPS = ("env_vars",)


def in_submitted_job(environ: dict | None = None) -> bool:
    return SUBMITTED_JOB_ENV in (os.environ if environ is None else environ)


def _is_local_relative(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "://" not in value and not Path(value).is_absolute()


def _path_entries(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every input-path value in a config mapping, list items by index."""
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = f"{where}.{key}" if where else str(key)
            if dotted == "run.root" or key in OPAQUE_MAPS:
                continue
            if key in PATH_MAPS and isinstance(value, dict):
                yield from ((f"{dotted}.{k}", v) for k, v in value.items() if isinstance(v, str))
            elif isinstance(value, str) and (key in PATH_KEYS or str(key).endswith(PATH_SUFFIXES)):
                yield dotted, value
            else:
                yield from _path_entries(value, dotted)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _path_entries(item, f"{where}.{i}")


def resolve_paths(data: dict, environ: dict | None = None, cwd: str | None = None) -> dict[str, str]:
    """{dotted key: absolute path} for the relative paths of config mapping `data` that must change.

    Raises ConfigError naming the key when a submitted job has no `QUORUM_HOME` for a path that needs one.
    """
    environ = os.environ if environ is None else environ
    cwd = cwd or os.getcwd()
    home = environ.get(HOME_ENV, "")
    submitted = in_submitted_job(environ)
    how = (f"set {HOME_ENV} for the job (ray job submit --runtime-env-json "
           f"'{{\"env_vars\": {{\"{HOME_ENV}\": \"/shared/dir\"}}}}') or pass an absolute path")
    changes = {}
    root = (data.get("run") or {}).get("root", "")
    if _is_local_relative(root):
        if home:
            changes["run.root"] = os.path.normpath(os.path.join(home, root))
        elif submitted:
            raise ConfigError(f"run.root: {root!r} is relative, and this is a submitted Ray job whose working "
                              f"directory is Ray's temporary copy of --working-dir: the results would be deleted "
                              f"with the Ray session; {how} (or a shared filesystem / s3:// URI)")
    for key, value in _path_entries(data):
        if not _is_local_relative(value) or Path(cwd, value).exists():
            continue
        if home:
            changes[key] = os.path.normpath(os.path.join(home, value))
        elif submitted and os.path.normpath(value).startswith(".."):
            raise ConfigError(f"{key}: {value!r} is outside the job's working directory, so it was not uploaded "
                              f"with --working-dir and is not where this submitted job runs; {how}")
    return changes


def as_overrides(changes: dict[str, str]) -> list[str]:
    """`key='value'` overrides (YAML single-quoted, so any path text survives the override parser)."""
    return [f"{key}='{value.replace(chr(39), chr(39) * 2)}'" for key, value in changes.items()]


def path_overrides(cls: type, config_path: str, overrides: list[str]) -> list[str]:
    """The overrides that make `cls`'s config from `config_path` + `overrides` resolve its paths as above.

    Built on the same merge as `load_config` (class defaults, YAML, overrides), so defaults count too.
    """
    data = read_yaml(config_path)
    data.pop("job", None)
    data = with_defaults(cls, data)
    for override in overrides:
        apply_override(data, override)
    return as_overrides(resolve_paths(data))
