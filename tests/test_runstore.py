"""Run store: atomic stage outputs, manifest contents, resume by chained config hash."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from core.runstore import RunStore, write_table


def producer(calls: list, rows: int = 3, fail: bool = False):
    def produce(out_dir: str) -> dict:
        calls.append(out_dir)
        write_table(pa.table({"x": list(range(rows))}), out_dir)
        if fail:
            raise RuntimeError("boom")
        return {"rows_out": rows}

    return produce


def test_stage_writes_manifest_and_resumes(tmp_path):
    calls = []
    store = RunStore(str(tmp_path), "job", "r1")
    store.start({"a": 1}, "a: 1\n")
    first = store.run_stage("s1", {"k": 1}, producer(calls))
    second = store.run_stage("s2", {"k": 2}, producer(calls, rows=5))
    assert (first.rows, second.rows, first.skipped) == (3, 5, False)
    manifest = json.loads((tmp_path / "job" / "r1" / "manifest.json").read_text())
    assert manifest["stages"]["s1"]["status"] == "complete" and manifest["stages"]["s2"]["rows"] == 5
    assert manifest["config_hash"] and "torch" in manifest["packages"]
    assert (tmp_path / "job" / "r1" / "config.yaml").read_text() == "a: 1\n"

    again = RunStore(str(tmp_path), "job", "r1")
    assert again.run_stage("s1", {"k": 1}, producer(calls)).skipped
    assert again.run_stage("s2", {"k": 2}, producer(calls)).skipped
    assert len(calls) == 2


def test_changed_config_reruns_that_stage_and_later_ones(tmp_path):
    calls = []
    store = RunStore(str(tmp_path), "job", "r")
    store.run_stage("s1", {"k": 1}, producer(calls))
    store.run_stage("s2", {"k": 2}, producer(calls))
    again = RunStore(str(tmp_path), "job", "r")
    assert not again.run_stage("s1", {"k": "changed"}, producer(calls)).skipped
    # s2's own key is unchanged, but its upstream hash moved: it must re-run too
    assert not again.run_stage("s2", {"k": 2}, producer(calls)).skipped
    assert len(calls) == 4


def test_failed_stage_leaves_no_output_and_is_not_complete(tmp_path):
    store = RunStore(str(tmp_path), "job", "r")
    with pytest.raises(RuntimeError):
        store.run_stage("s1", {"k": 1}, producer([], fail=True))
    assert not (tmp_path / "job" / "r" / "s1").exists()
    assert store.manifest["stages"]["s1"]["status"] == "running"
    again = RunStore(str(tmp_path), "job", "r")
    assert not again.run_stage("s1", {"k": 1}, producer([])).skipped


def test_no_resume_reruns(tmp_path):
    calls = []
    RunStore(str(tmp_path), "job", "r").run_stage("s1", {"k": 1}, producer(calls))
    RunStore(str(tmp_path), "job", "r", resume=False).run_stage("s1", {"k": 1}, producer(calls))
    assert len(calls) == 2


def test_uri_root_uses_pyarrow_filesystem(tmp_path):
    store = RunStore(f"file://{tmp_path}", "job", "r")
    result = store.run_stage("s1", {"k": 1}, producer([]))
    assert result.rows == 3
    assert store.read_stage("s1").num_rows == 3


def test_an_interrupted_attempt_is_removed_when_the_stage_runs_again(tmp_path):
    """A stopped job leaves `.<stage>.tmp-*` behind (and the stage 'running' in the manifest); the next run redoes
    the stage whole and deletes the leftover, and leaves other stages' folders alone."""
    calls = []
    store = RunStore(str(tmp_path), "job", "r1")
    with pytest.raises(RuntimeError):
        store.run_stage("s1", {"k": 1}, producer(calls, fail=True))
    run_dir = tmp_path / "job" / "r1"
    (leftover,) = run_dir.glob(".s1.tmp-*")
    other = run_dir / ".s10.tmp-abcd1234"
    other.mkdir()
    assert json.loads((run_dir / "manifest.json").read_text())["stages"]["s1"]["status"] == "running"

    again = RunStore(str(tmp_path), "job", "r1")
    result = again.run_stage("s1", {"k": 1}, producer(calls))
    assert not result.skipped and result.rows == 3 and not leftover.exists() and other.is_dir()
    assert [p.name for p in run_dir.glob(".s1.tmp-*")] == []
