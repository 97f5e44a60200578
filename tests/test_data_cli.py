"""`quorum data` and the corpus registry: a real HTTP server on 127.0.0.1 serves small fixture copies (no network),
with Range support, a file whose bytes disagree with the registry and a connection that drops mid-file; and on a
clean clone (no ../shared) every config of the README's table either loads or stops with one message naming
`quorum data get`."""

from __future__ import annotations

import glob
import hashlib
import http.server
import importlib
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from core.config import ConfigError, read_yaml, require_file, with_defaults
from core.corpora import REGISTRY, RegistryError, corpus_for_path, load_registry, missing_hint
from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

FILES = {
    "tiny/a.txt": b"alpha line one\nalpha line two\n" * 50,
    "tiny/b.txt": b"bravo\n" * 300,
    "bad/c.txt": b"these bytes are not the ones the registry records\n",
}


class Server:
    """Serves FILES; honours `Range: bytes=N-`; `drop` makes the next GET of a path stop after half its bytes."""

    def __init__(self):
        self.requests: list[tuple[str, str | None]] = []
        self.drop: set[str] = set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.lstrip("/")
                outer.requests.append((path, self.headers.get("Range")))
                if path not in FILES:
                    self.send_error(404)
                    return
                body = FILES[path]
                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if match:
                    start = int(match.group(1))
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if path in outer.drop:
                    outer.drop.discard(path)
                    self.wfile.write(body[start:start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_registry(tmp_path: Path, url: str, unknown_sum: bool = False) -> Path:
    files = [{"source": "tiny/a.txt", "to": "a.txt", "bytes": len(FILES["tiny/a.txt"]), "sha256": sha(FILES["tiny/a.txt"])},
             {"source": "tiny/b.txt", "to": "b.txt", "bytes": len(FILES["tiny/b.txt"]),
              "sha256": None if unknown_sum else sha(FILES["tiny/b.txt"])}]
    common = {"title": "t", "citation": "c", "source": url, "licence": "CC BY-NC 4.0", "licence_url": url,
              "access": "download", "base_url": url, "format": "lines", "jobs": ["policy_simplify"]}
    data = {"corpora": {
        "tiny": {**common, "layout": "tiny", "files": files},
        "broken": {**common, "layout": "broken",
                   "files": [{"source": "bad/c.txt", "to": "c.txt", "bytes": None, "sha256": "0" * 64}]},
        "licensed": {**common, "access": "request", "layout": "licensed", "base_url": "", "steps": "1. ask DIR"},
    }}
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def server():
    with Server() as srv:
        yield srv


def data(registry: Path, *args: str) -> int:
    return cli_main(["data", *args, "--registry", str(registry)])


# -- get --------------------------------------------------------------------------------------------------------


def test_get_lays_the_corpus_out_and_verifies_every_file(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "d"), "--accept-licence") == 0
    assert (tmp_path / "d" / "tiny" / "a.txt").read_bytes() == FILES["tiny/a.txt"]
    assert (tmp_path / "d" / "tiny" / "b.txt").read_bytes() == FILES["tiny/b.txt"]
    assert not list((tmp_path / "d" / "tiny").glob("*.part"))
    out = capsys.readouterr().out
    assert "licence: CC BY-NC 4.0" in out and "licence accepted" in out
    assert "2 files in" in out and "verified against the recorded SHA-256 sums" in out
    # again: the good copies are kept, nothing is downloaded
    server.requests.clear()
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "d"), "--accept-licence") == 0
    assert server.requests == []
    assert "kept (already present, SHA-256 verified)" in capsys.readouterr().out


def test_a_checksum_mismatch_is_refused_and_nothing_takes_the_name(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    assert data(registry, "get", "broken", "--to", str(tmp_path / "d"), "--accept-licence") == 2
    err = capsys.readouterr().err
    assert "SHA-256 mismatch" in err and "0" * 64 in err and sha(FILES["bad/c.txt"]) in err
    assert not (tmp_path / "d").exists()  # neither the file, nor a .part, nor a directory


def test_an_interrupted_download_keeps_what_arrived_and_resumes_with_a_range_request(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    server.drop.add("tiny/a.txt")
    to = tmp_path / "d"
    assert data(registry, "get", "tiny", "--to", str(to), "--accept-licence") == 1
    err = capsys.readouterr().err
    assert "interrupted" in err and "run the same command again to resume" in err
    part = to / ".tiny.download" / "a.txt.part"
    assert not (to / "tiny").exists(), "a partial corpus never takes the real name"
    assert 0 < part.stat().st_size < len(FILES["tiny/a.txt"])
    half = part.stat().st_size
    server.requests.clear()
    assert data(registry, "get", "tiny", "--to", str(to), "--accept-licence") == 0
    assert ("tiny/a.txt", f"bytes={half}-") in server.requests
    assert (to / "tiny" / "a.txt").read_bytes() == FILES["tiny/a.txt"]
    assert not part.exists() and not part.parent.exists()
    assert "a.txt: downloaded (resumed, SHA-256 verified)" in capsys.readouterr().out


def test_a_good_copy_is_never_replaced(tmp_path, server, capsys):
    """A file already there with another sum is refused (not overwritten); a good one is kept as it is."""
    registry = write_registry(tmp_path, server.url)
    (tmp_path / "d" / "tiny").mkdir(parents=True)
    (tmp_path / "d" / "tiny" / "a.txt").write_bytes(b"my own edits\n")
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "d"), "--accept-licence") == 2
    assert "already exists and its SHA-256" in capsys.readouterr().err
    assert (tmp_path / "d" / "tiny" / "a.txt").read_bytes() == b"my own edits\n"


def test_an_unknown_source_sum_is_never_called_verified(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url, unknown_sum=True)
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "d"), "--accept-licence") == 0
    out = capsys.readouterr().out
    assert "b.txt: downloaded (no recorded SHA-256: NOT verified)" in out
    assert "NOT verified (some files have no recorded SHA-256)" in out
    assert "verified against the recorded" not in out


def test_the_licence_must_be_accepted(tmp_path, server, capsys, monkeypatch):
    registry = write_registry(tmp_path, server.url)
    monkeypatch.setattr("sys.stdin", None)  # not a terminal: no prompt
    assert data(registry, "get", "tiny", "--to", str(tmp_path / "d")) == 2
    err = capsys.readouterr().err
    assert "licence (CC BY-NC 4.0" in err and "--accept-licence" in err
    assert server.requests == []


def test_a_corpus_that_cannot_be_downloaded_prints_its_steps(tmp_path, server, capsys):
    registry = write_registry(tmp_path, server.url)
    assert data(registry, "get", "licensed", "--to", str(tmp_path / "d")) == 2
    captured = capsys.readouterr()
    assert f"1. ask {tmp_path / 'd'}" in captured.out
    assert "not downloadable" in captured.err
    assert server.requests == []


@pytest.mark.parametrize("args, message", [
    (["get", "nope", "--to", "x"], "unknown corpus 'nope'"),
    (["get", "tiny"], "--to DIR is required"),
    (["get"], "the following arguments are required: NAME"),
    (["get", "tiny", "--to"], "argument --to: expected one argument"),
    (["frob"], "invalid choice: 'frob'"),
    (["list", "--nope"], "quorum data list: error: unrecognized arguments: --nope"),
])
def test_bad_arguments_exit_2_with_one_message(tmp_path, args, message, capsys):
    registry = write_registry(tmp_path, "http://127.0.0.1:9")
    assert data(registry, *args) == 2
    assert message in capsys.readouterr().err


def test_a_broken_registry_names_the_file_and_key(tmp_path, capsys):
    bad = tmp_path / "r.yaml"
    bad.write_text("corpora:\n  x: {title: t, citation: c, source: s, licence: l, licence_url: u, access: download,"
                   " base_url: 'http://h', layout: x, format: f, jobs: [j],"
                   " files: [{source: a, to: a, bytes: 1, sha256: 'abc'}]}\n")
    with pytest.raises(RegistryError, match=r"r\.yaml: corpora\.x\.files\.0\.sha256"):
        load_registry(bad)
    assert cli_main(["data", "list", "--registry", str(bad)]) == 2
    assert "corpora.x.files.0.sha256" in capsys.readouterr().err


# -- the real registry ------------------------------------------------------------------------------------------


def test_the_registry_lists_every_corpus_the_docs_name_with_source_and_licence(capsys):
    registry = load_registry()
    assert {"turkcorpus", "asset", "simpeval", "cord", "menlo", "coedit", "newsela"} <= set(registry.corpora)
    for corpus in registry.corpora.values():
        assert corpus.source.startswith("https://") and corpus.licence and corpus.jobs
        if corpus.access == "download":
            assert corpus.verifiable, f"{corpus.name}: every downloadable file has its source's SHA-256"
            assert re.search(r"/[0-9a-f]{40}$", corpus.base_url), f"{corpus.name}: the source is a pinned commit"
    assert registry["newsela"].access == "request" and "newsela.com" in registry["newsela"].steps
    assert cli_main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in registry.corpora:
        assert re.search(rf"^{name}\s", out, re.MULTILINE)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="no ../shared/data beside the checkout")
def test_the_recorded_sums_are_those_of_the_source_files():
    """The development copies in ../shared/data are byte-identical to the sources' files at the pinned commits."""
    for corpus in load_registry().corpora.values():
        for item in corpus.files:
            path = SHARED_DATA / corpus.layout / item.to
            assert path.is_file(), path
            assert hashlib.sha256(path.read_bytes()).hexdigest() == item.sha256, path
            assert path.stat().st_size == item.bytes, path


def test_each_corpus_lists_the_configs_that_read_it():
    """`configs:` of core/corpora.yaml is what configs/*.yaml (with their jobs' defaults) read."""
    from core.paths import _path_entries
    from jobs.entry import JOBS

    registry = load_registry()
    found: dict[str, set[str]] = {name: set() for name in registry.corpora}
    for config in sorted(glob.glob(str(REPO / "configs" / "*.yaml"))):
        raw = read_yaml(config)
        module = importlib.import_module(JOBS[raw.pop("job")])
        for _key, value in _path_entries(with_defaults(module.Config, raw)):
            hit = corpus_for_path(value, registry)
            if hit and "shared" in value:
                found[hit[0].name].add(str(Path(config).relative_to(REPO)))
    for name, corpus in registry.corpora.items():
        if corpus.access == "download":
            assert set(corpus.configs) == found[name], name


# -- the hint a missing data path gets --------------------------------------------------------------------------


@pytest.mark.parametrize("path, command", [
    ("../shared/data/cord", "quorum data get cord --to ../shared/data"),
    ("../shared/data/simpeval/simpeval_2022.csv", "quorum data get simpeval --to ../shared/data"),
    ("/mnt/shared/data/asset/human_ratings.csv", "quorum data get asset --to /mnt/shared/data"),
    ("/mnt/shared/data/turkcorpus", "quorum data get turkcorpus --to /mnt/shared/data"),
    ("/data/newsela/newsela.jsonl", "quorum data get newsela"),
    ("/mnt/shared/data/newsela_200.jsonl", "quorum data get newsela"),
])
def test_a_missing_corpus_path_names_the_command_that_gets_it(path, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing beside it
    with pytest.raises(ConfigError) as info:
        require_file(path, "data.path")
    message = str(info.value)
    assert message.startswith(f"data.path: file not found: {path}")
    assert f"`{command}" in message


def test_a_missing_path_that_is_no_corpus_gets_no_hint():
    assert missing_hint("configs/data/nope.jsonl") == ""
    with pytest.raises(ConfigError, match=r"^data\.path: file not found: nope\.jsonl$"):
        require_file("nope.jsonl", "data.path")


def readme_table_configs() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text.split("## Papers, jobs and configs", 1)[1].split("\n## ", 1)[0]
    return sorted(set(re.findall(r"`(configs/[\w.]+\.yaml)`", table)))


@pytest.mark.parametrize("config", readme_table_configs())
def test_on_a_clean_clone_each_readme_config_loads_or_names_quorum_data_get(config, tmp_path, monkeypatch, capsys):
    """A checkout with nothing beside it: the config loads (no job runs), or `quorum` stops with exit 2 and one
    line naming the `quorum data get` command for the missing corpus."""
    from jobs.entry import job_module

    clone = tmp_path / "clone" / "quorum"
    shutil.copytree(REPO / "configs", clone / "configs")
    monkeypatch.chdir(clone)
    monkeypatch.delenv("QUORUM_HOME", raising=False)
    from core.config import load_config, split_command
    from core.paths import path_overrides

    module = job_module(config)
    path, overrides, _flags = split_command([config])
    try:
        overrides += path_overrides(module.Config, path, overrides)
        cfg = load_config(module.Config, path, overrides)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        assert re.search(r"`quorum data get \w+( --to \.\./shared/data)?`", message), message
    else:
        check_data = getattr(getattr(cfg, "evaluate", None), "check_data", None)
        if check_data is not None:
            check_data()  # the evaluation set: the demo references stand in for a missing default
    assert REGISTRY.is_file()


@pytest.mark.parametrize("config, corpus", [("configs/craft_demo.yaml", "cord"),
                                            ("configs/jury_eval_demo.yaml", "simpeval")])
def test_quorum_run_on_a_clean_clone_exits_2_with_one_line_naming_the_command(config, corpus, tmp_path):
    """The real CLI, in a checkout with nothing beside it: exit 2 before any work, one line on stderr."""
    import subprocess
    import sys

    clone = tmp_path / "clone" / "quorum"
    shutil.copytree(REPO / "configs", clone / "configs")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "run", config], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("quorum: error: ") and f"`quorum data get {corpus} --to ../shared/data`" in lines[0]
    assert not (clone / "runs").exists(), "nothing ran"
