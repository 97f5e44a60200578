"""`quorum data`: the corpora the jobs read, and getting them from their original source.

    quorum data list [--registry FILE]
    quorum data get NAME [NAME ...] --to DIR [--accept-licence] [--registry FILE]

`list` shows each corpus of the registry (`core/corpora.yaml`): where it comes from, its licence, how it is had
(download, a hub dataset, a licence request) and which jobs and configs read it.

`get` lays a downloadable corpus out as the jobs read it, DIR/<layout>/<file> (`--to ../shared/data` is where the
configs look by default). Each file comes from the corpus's source at a pinned commit and is checked against its
recorded SHA-256 before it takes its name: it is written to `<file>.part` first and renamed only once complete and
verified, so a good copy is never replaced by a partial one, a mismatch is refused (the `.part` is deleted), and an
interrupted download resumes from the `.part` with an HTTP Range request when the command is run again. A file
already present with the recorded sum is kept. The licence is named and must be accepted, with `--accept-licence`
or at the prompt. A hub dataset or a licensed corpus (Newsela) is not downloaded: `get` prints the steps.

`--registry FILE` reads another registry of the same form (a mirror, or the tests' local server).

Exit codes: 0 done, 2 bad input (unknown corpus, licence not accepted, a checksum mismatch, a corpus that needs
manual steps), 1 a download that failed or was interrupted (run the command again to resume).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from core.config import ConfigError
from core.corpora import REGISTRY, Corpus, CorpusFile, RegistryError, load_registry

USAGE = __doc__
CHUNK = 1 << 16
TIMEOUT_S = 60


class DownloadError(RuntimeError):
    """A transfer that failed or stopped early; what arrived is kept in the `.part` file for the next attempt."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _print(text: str = "") -> None:
    print(text, flush=True)


# -- list -------------------------------------------------------------------------------------------------------


def list_corpora(registry_path: str | Path = REGISTRY) -> int:
    registry = load_registry(registry_path)
    rows = [("corpus", "get", "licence", "source", "read by")]
    for c in registry.corpora.values():
        count = f"{len(c.files)} file{'s' if len(c.files) != 1 else ''}"
        how = {"download": f"--to DIR ({count})", "hub": "steps (hub)", "request": "steps (request)"}
        rows.append((c.name, how[c.access], c.licence, c.source, ", ".join(c.jobs)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        _print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    _print()
    _print("quorum data get NAME --to DIR lays a corpus out as DIR/NAME/ (the configs read ../shared/data/NAME).")
    return 0


# -- get --------------------------------------------------------------------------------------------------------


def accept_licence(corpus: Corpus, accepted: bool) -> None:
    """Name the licence; go on only when the user accepts it (flag, or 'y' at a prompt on a terminal)."""
    note = f" ({corpus.licence_note})" if corpus.licence_note else ""
    _print(f"{corpus.name}: licence: {corpus.licence}{note}, {corpus.licence_url}")
    if accepted:
        _print(f"{corpus.name}: licence accepted (--accept-licence)")
        return
    if sys.stdin is not None and sys.stdin.isatty():
        try:
            answer = input(f"Accept the licence of {corpus.name} ({corpus.licence})? [y/N] ").strip().lower()
        except EOFError:
            answer = ""
        if answer in ("y", "yes"):
            _print(f"{corpus.name}: licence accepted")
            return
    raise ConfigError(f"{corpus.name}: the licence ({corpus.licence}, {corpus.licence_url}) was not accepted; "
                      f"read it, then run again with --accept-licence")


def fetch(url: str, part: Path, expected_bytes: int | None) -> None:
    """Download `url` into `part`, resuming from what `part` already holds (HTTP Range)."""
    have = part.stat().st_size if part.exists() else 0
    if expected_bytes is not None and have == expected_bytes:
        return  # complete already; the checksum decides
    if expected_bytes is not None and have > expected_bytes:
        part.unlink()
        have = 0
    request = urllib.request.Request(url, headers={"User-Agent": "quorum-data"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return  # nothing past what we have: the checksum decides
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DownloadError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    with response:
        mode = "ab" if have and response.status == 206 else "wb"  # a server without Range support sends it all
        if mode == "wb":
            have = 0
        length = response.headers.get("Content-Length")
        want = have + int(length) if length and length.isdigit() else None
        with open(part, mode) as out:
            try:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    have += len(block)
            except (OSError, http.client.HTTPException) as exc:  # a dropped connection: IncompleteRead
                raise DownloadError(f"{url}: interrupted after {have} bytes ({exc.__class__.__name__})") from exc
    if want is not None and have < want:
        raise DownloadError(f"{url}: interrupted after {have} of {want} bytes")


def get_file(corpus: Corpus, item: CorpusFile, target_dir: Path) -> str:
    """One file into `target_dir`; returns what happened ('kept', 'verified', 'unverified')."""
    dest = target_dir / item.to
    if dest.exists():
        if item.sha256 is None:
            return "kept (no recorded SHA-256: not verified)"
        digest = sha256_of(dest)
        if digest == item.sha256:
            return "kept (already present, SHA-256 verified)"
        raise ConfigError(f"{dest}: already exists and its SHA-256 {digest} is not the source's {item.sha256}; "
                          f"move it away and run again")
    part = dest.with_name(dest.name + ".part")
    url = f"{corpus.base_url.rstrip('/')}/{item.source}"
    resumed = part.exists() and part.stat().st_size > 0
    fetch(url, part, item.bytes)
    digest = sha256_of(part)
    if item.sha256 is not None and digest != item.sha256:
        part.unlink()
        raise ConfigError(f"{url}: SHA-256 mismatch: got {digest}, the registry records {item.sha256}; nothing was "
                          f"written to {dest} (refused)")
    os.replace(part, dest)
    how = "resumed, " if resumed else ""
    if item.sha256 is None:
        return f"downloaded ({how}no recorded SHA-256: NOT verified)"
    return f"downloaded ({how}SHA-256 verified)"


def get_corpus(corpus: Corpus, to: Path, accepted: bool) -> int:
    if corpus.access != "download":
        _print(f"{corpus.name}: {corpus.title}")
        _print(f"{corpus.name}: source: {corpus.source}; licence: {corpus.licence}")
        _print(f"{corpus.name}: quorum does not download it. Steps:")
        for line in corpus.steps.replace("DIR", str(to)).splitlines():
            _print(f"    {line}")
        raise ConfigError(f"{corpus.name}: not downloadable by `quorum data get`; follow the steps above")
    accept_licence(corpus, accepted)
    target_dir = to / corpus.layout
    target_dir.mkdir(parents=True, exist_ok=True)
    for item in corpus.files:
        _print(f"{corpus.name}: {item.to}: {get_file(corpus, item, target_dir)}")
    state = "verified against the recorded SHA-256 sums" if corpus.verifiable else \
        "NOT verified (some files have no recorded SHA-256)"
    _print(f"{corpus.name}: {len(corpus.files)} files in {target_dir}, {state}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    registry_path: str | Path = REGISTRY
    names: list[str] = []
    to = None
    accepted = False
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("--registry", "--to"):
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ConfigError(f"quorum data {command}: {arg} needs a value")
            if arg == "--registry":
                registry_path = rest[i + 1]
            else:
                to = rest[i + 1]
            i += 2
            continue
        if arg in ("--accept-licence", "--accept-license"):
            accepted = True
        elif arg.startswith("-"):
            raise ConfigError(f"quorum data {command}: unknown flag {arg!r}")
        else:
            names.append(arg)
        i += 1
    try:
        if command == "list":
            if names:
                raise ConfigError(f"quorum data list: unexpected argument {names[0]!r}")
            return list_corpora(registry_path)
        if command != "get":
            raise ConfigError(f"quorum data: unknown command {command!r}; expected list or get")
        registry = load_registry(registry_path)
        if not names:
            raise ConfigError(f"quorum data get: name a corpus ({', '.join(registry.corpora)})")
        unknown = [n for n in names if n not in registry.corpora]
        if unknown:
            raise ConfigError(f"quorum data get: unknown corpus {unknown[0]!r}; known: {', '.join(registry.corpora)}")
        corpora = [registry.corpora[n] for n in names]
        if to is None and any(c.access == "download" for c in corpora):
            raise ConfigError("quorum data get: --to DIR is required (the configs read ../shared/data/NAME: "
                              "--to ../shared/data)")
        for corpus in corpora:
            get_corpus(corpus, Path(to or "DIR"), accepted)
    except RegistryError as exc:
        raise ConfigError(str(exc)) from exc
    except DownloadError as exc:
        print(f"quorum data: download failed: {exc}; what arrived is kept, run the same command again to resume",
              file=sys.stderr)
        return 1
    return 0
