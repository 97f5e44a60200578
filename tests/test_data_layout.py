"""What a failed `quorum data get` leaves (nothing that looks like a corpus), the demo's check of its evaluation
corpus (missing or empty: the demo references stand in; partial: exit 2 naming `quorum data get`), `quorum data
mirror` for `--registry`, and the data as users get it (`tests/user_data.py`). The server is tests/test_data_cli.py's
real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.config import ConfigError
from core.corpora import load_registry
from jobs.cli import main as cli_main
from tests.test_data_cli import FILES, Server, write_registry
from tests.user_data import DEV_DATA, lay_out, serve

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server():
    with Server() as srv:
        yield srv


def data(registry: Path, *args: str) -> int:
    return cli_main(["data", *args, "--registry", str(registry)])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed: connections are refused


def test_offline_get_leaves_no_directory_at_all(tmp_path, capsys):
    registry = write_registry(tmp_path, f"http://127.0.0.1:{closed_port()}")
    to = tmp_path / "shared" / "data"
    assert data(registry, "get", "tiny", "--to", str(to), "--accept-licence") == 1
    err = capsys.readouterr().err
    assert "download failed" in err and "nothing was written" in err
    assert not (tmp_path / "shared").exists(), "an offline get created directories"


def test_an_interrupted_get_leaves_no_corpus_directory_and_resumes(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    to = tmp_path / "data"
    server.drop.add("tiny/b.txt")  # a.txt arrives whole, b.txt half
    assert data(registry, "get", "tiny", "--to", str(to), "--accept-licence") == 1
    err = capsys.readouterr().err
    assert "was not created or changed" in err and ".tiny.download" in err
    assert [p.name for p in to.iterdir()] == [".tiny.download"], "only the hidden staging folder"
    assert sorted(p.name for p in (to / ".tiny.download").iterdir()) == ["a.txt", "b.txt.part"]
    assert data(registry, "get", "tiny", "--to", str(to), "--accept-licence") == 0
    assert [p.name for p in to.iterdir()] == ["tiny"]
    assert {p.name: p.read_bytes() for p in (to / "tiny").iterdir()} == {"a.txt": FILES["tiny/a.txt"],
                                                                         "b.txt": FILES["tiny/b.txt"]}


def test_a_get_fills_an_empty_or_partial_corpus_directory_only_once_all_is_verified(tmp_path, server, capsys):
    """A directory an older get left (empty, or with some files) is completed; it changes only at the end."""
    registry = write_registry(tmp_path, server.url)
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    (target / "a.txt").write_bytes(FILES["tiny/a.txt"])
    server.drop.add("tiny/b.txt")
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "data"), "--accept-licence") == 1
    assert [p.name for p in target.iterdir()] == ["a.txt"]
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "data"), "--accept-licence") == 0
    assert sorted(p.name for p in target.iterdir()) == ["a.txt", "b.txt"]
    assert "a.txt: kept (already present, SHA-256 verified)" in capsys.readouterr().out
    assert not (tmp_path / "data" / ".tiny.download").exists()


def test_mirror_writes_a_registry_that_gets_the_same_bytes(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    origin = tmp_path / "origin"
    assert data(registry, "get", "tiny", "--to", str(origin), "--accept-licence") == 0
    with serve(origin) as url:
        mirror = tmp_path / "mirror.yaml"
        assert data(registry, "mirror", str(origin), "--base-url", url, "--out", str(mirror)) == 0
        tiny = load_registry(mirror)["tiny"]
        assert tiny.base_url == f"{url}/tiny" and [f.source for f in tiny.files] == ["a.txt", "b.txt"]
        server.requests.clear()
        assert cli_main(["data", "get", "tiny", "--to", str(tmp_path / "copy"), "--accept-licence",
                         "--registry", str(mirror)]) == 0
    assert server.requests == [], "the mirror served it, not the source"
    assert (tmp_path / "copy" / "tiny" / "b.txt").read_bytes() == FILES["tiny/b.txt"]
    (origin / "tiny" / "a.txt").write_bytes(b"edited\n")  # a mirror is never built from a copy that differs
    assert data(registry, "mirror", str(origin), "--base-url", "http://h", "--out", str(tmp_path / "m2.yaml")) == 2
    assert "a.txt: its SHA-256 is not the source's" in capsys.readouterr().err
    assert not (tmp_path / "m2.yaml").exists()


def test_hub_steps_download_one_revision(capsys):
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert cli_main(["data", "get", "coedit", "--revision", commit, "--to", "/mnt/shared/data"]) == 2
    out = capsys.readouterr().out
    assert (f"hf download grammarly/coedit --repo-type dataset --revision {commit} --local-dir "
            "/mnt/shared/data/coedit") in out
    assert "/mnt/shared/data/coedit/coedit_sources.jsonl" in out
    assert cli_main(["data", "get", "menlo"]) == 2
    out = capsys.readouterr().out
    assert "--revision REVISION" in out and "quorum records no revision of facebook/menlo" in out
    assert cli_main(["data", "get", "menlo", "--revision", "main"]) == 2  # a branch is no pin
    assert "40-hex-digit commit" in capsys.readouterr().err


# -- the demo's evaluation corpus -------------------------------------------------------------------------------


def demo_clone(tmp_path: Path, files: list[str] | None) -> Path:
    """A checkout's configs with ../shared/data/turkcorpus beside it: absent (None), empty ([]) or those files."""
    clone = tmp_path / "clone" / "quorum"
    shutil.copytree(REPO / "configs", clone / "configs")
    if files is not None:
        turk = clone.parent / "shared" / "data" / "turkcorpus"
        turk.mkdir(parents=True)
        for name in files:
            (turk / name).write_text("a line\n")
    return clone


@pytest.mark.parametrize("files", [None, []], ids=["missing", "empty"])
def test_the_demo_falls_back_to_its_references_without_a_corpus(files, tmp_path, monkeypatch):
    from jobs.policy.stages import EvalConfig, load_eval_set

    monkeypatch.chdir(demo_clone(tmp_path, files))
    cfg = EvalConfig()
    cfg.check_data()
    assert not cfg.data_found()
    frame = load_eval_set(cfg, "lexical")
    assert len(frame) == 40 and set(frame.columns) == {"id", "source", "references"}


def test_a_partial_corpus_stops_the_demo_naming_the_files_and_quorum_data_get(tmp_path):
    """The real CLI on a clone whose corpus directory holds one file: exit 2 before any work, one line."""
    clone = demo_clone(tmp_path, ["tune.8turkers.tok.norm"])
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "run", "configs/demo.yaml"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "lacks 8 of the 9 files split 'tune' reads" in lines[0] and "tune.8turkers.tok.turk.0" in lines[0]
    assert "`quorum data get turkcorpus --to ../shared/data`" in lines[0]
    assert not (clone / "runs").exists(), "nothing ran"


def test_a_set_path_that_is_empty_is_refused(tmp_path, monkeypatch):
    from jobs.policy.stages import EvalConfig

    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^evaluate\.path: 'mine' is an empty directory$"):
        EvalConfig(path="mine").check_data()


# -- the data as users get it -----------------------------------------------------------------------------------


@pytest.mark.skipif(not DEV_DATA.is_dir(), reason="no ../shared/data beside the checkout to mirror")
def test_user_data_lays_out_exactly_the_registry_files(tmp_path):
    """tests/user_data.py: every downloadable corpus through `quorum data get`, nothing else (the development
    copy's reference-values.md and README stay behind)."""
    lay_out(tmp_path / "data")
    registry = load_registry()
    want = {f"{c.layout}/{f.to}": f.sha256 for c in registry.corpora.values() if c.access == "download"
            for f in c.files}
    got = {str(p.relative_to(tmp_path / "data")): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert got == want
