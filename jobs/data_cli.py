"""`quorum data`: the corpora the jobs read, and getting them from their original source.

    quorum data list [--registry FILE]
    quorum data get NAME [NAME ...] --to DIR [--accept-licence] [--registry FILE]
    quorum data get menlo [--revision COMMIT]
    quorum data mirror DIR --base-url URL --out FILE [--registry FILE]

`list` shows each corpus of the registry (`core/corpora.yaml`): where it comes from, its licence, how it is had
(download, a hub dataset, a licence request) and which jobs and configs read it.

`get` lays a downloadable corpus out as the jobs read it, DIR/<layout>/<file> (`--to ../shared/data` is where the
configs look by default). Each file comes from the corpus's source at a pinned commit and is checked against its
recorded SHA-256. The files are downloaded into a hidden folder beside the target, DIR/.<layout>.download/, each to
`<file>.part` first and renamed once complete and verified; only when every file of the corpus is there and
verified does DIR/<layout> take them (one rename), so a failed or interrupted download never leaves a directory
that looks like a corpus. A mismatch is refused (the `.part` is deleted); an interrupted download resumes from its
`.part` with an HTTP Range request when the command is run again. Files already in DIR/<layout> with the recorded
sum are kept. The licence is named and must be accepted, with `--accept-licence` or at the prompt. A hub dataset
or a licensed corpus (Newsela) is not downloaded: `get` prints the steps, for a hub dataset at one commit
(`--revision COMMIT`, or the registry's `revision`).

`mirror` writes a registry that reads the downloadable corpora from a mirror: DIR laid out by `get` (every file
verified first), served at URL (any static HTTP server), so that `get ... --registry FILE` works inside a network
that cannot reach the sources. `--registry FILE` reads another registry of the same form (a mirror's, or the
tests' local server's).

Exit codes: 0 done, 2 bad input (unknown corpus, licence not accepted, a checksum mismatch, a corpus that needs
manual steps, an unknown flag), 1 a download that failed or was interrupted (run the command again to resume).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from core.config import ConfigError
from core.corpora import COMMIT, REGISTRY, Corpus, CorpusFile, RegistryError, load_registry

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


def staging_dir(to: Path, corpus: Corpus) -> Path:
    """Where a corpus's files gather until all of them are there and verified: hidden, beside DIR/<layout>."""
    return to / f".{corpus.layout}.download"


def print_steps(corpus: Corpus, to: Path, revision: str) -> None:
    revision = revision or corpus.revision
    _print(f"{corpus.name}: {corpus.title}")
    _print(f"{corpus.name}: source: {corpus.source}; licence: {corpus.licence}")
    _print(f"{corpus.name}: quorum does not download it. Steps:")
    steps = re.sub(r"\bDIR\b(?!=)", str(to), corpus.steps)  # not "with DIR=/mnt/shared/data"
    if corpus.access == "hub":
        steps = steps.replace("REVISION", revision or "REVISION")
    for line in steps.splitlines():
        _print(f"    {line}")
    if corpus.access == "hub" and not revision:
        dataset = re.sub(r"^https://huggingface\.co/datasets/", "", corpus.source).rstrip("/")
        _print(f"{corpus.name}: quorum records no revision of {dataset}: choose the commit you will use "
               f"({corpus.source.rstrip('/')}/commits/main), run `quorum data get {corpus.name} --revision COMMIT` "
               f"for the steps at that commit, and keep it with your results (without one, `main` is whatever "
               f"the hub serves that day)")


def get_corpus(corpus: Corpus, to: Path, accepted: bool, revision: str = "") -> int:
    if corpus.access != "download":
        print_steps(corpus, to, revision)
        raise ConfigError(f"{corpus.name}: not downloadable by `quorum data get`; follow the steps above")
    accept_licence(corpus, accepted)
    target, staging = to / corpus.layout, staging_dir(to, corpus)
    missing = []
    for item in corpus.files:
        if (target / item.to).exists():
            _print(f"{corpus.name}: {item.to}: {get_file(corpus, item, target)}")  # kept, or refused
        else:
            missing.append(item)
    if missing:
        created = [p for p in (staging, *staging.parents) if not p.exists()]
        staging.mkdir(parents=True, exist_ok=True)
        try:
            for item in missing:
                _print(f"{corpus.name}: {item.to}: {get_file(corpus, item, staging)}")
        except BaseException as exc:
            for folder in created:  # nothing arrived: leave no folder behind (what did arrive stays, to resume)
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            if isinstance(exc, DownloadError):
                kept = f"what arrived is kept in {staging}; run the same command again to resume" \
                    if staging.exists() else f"nothing was written to {to}; run the same command again"
                raise DownloadError(f"{exc}; {target} was not created or changed, {kept}") from exc
            raise
        if not target.exists():
            os.replace(staging, target)  # the corpus appears whole, in one rename
        else:
            for item in missing:
                os.replace(staging / item.to, target / item.to)
            staging.rmdir()
    state = "verified against the recorded SHA-256 sums" if corpus.verifiable else \
        "NOT verified (some files have no recorded SHA-256)"
    _print(f"{corpus.name}: {len(corpus.files)} files in {target}, {state}")
    return 0


# -- mirror -----------------------------------------------------------------------------------------------------


def write_mirror(registry_path: str | Path, source: Path, base_url: str, out: Path) -> int:
    """A registry whose downloadable corpora found complete under `source` read from `base_url`/<layout>/<file>."""
    if not re.match(r"https?://", base_url):
        raise ConfigError(f"--base-url: must be an http(s) URL, got {base_url!r}")
    registry = load_registry(registry_path)
    raw = yaml.safe_load(Path(registry_path).read_text(encoding="utf-8"))
    mirrored = []
    for corpus in registry.corpora.values():
        if corpus.access != "download" or not (source / corpus.layout).is_dir():
            continue
        for item in corpus.files:
            path = source / corpus.layout / item.to
            if not path.is_file():
                raise ConfigError(f"{path}: missing: {corpus.name} is incomplete in {source} (`quorum data get "
                                  f"{corpus.name} --to {source}` completes it)")
            if item.sha256 is not None and sha256_of(path) != item.sha256:
                raise ConfigError(f"{path}: its SHA-256 is not the source's {item.sha256}; not mirrored")
        entry = raw["corpora"][corpus.name]
        entry["base_url"] = f"{base_url.rstrip('/')}/{corpus.layout}"
        entry["files"] = [{**f, "source": f["to"]} for f in entry["files"]]
        mirrored.append(corpus.name)
    if not mirrored:
        raise ConfigError(f"{source}: holds no corpus laid out by `quorum data get` (DIR/<layout>/<file>)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(f"# a mirror of {Path(registry_path).name}: {', '.join(mirrored)} from {base_url} (the files of "
                   f"{source}, SHA-256 verified)\n" + yaml.safe_dump(raw, sort_keys=False, width=120),
                   encoding="utf-8")
    load_registry(tmp)  # what it wrote reads back
    os.replace(tmp, out)
    _print(f"quorum data: {out}: {', '.join(mirrored)} from {base_url}; serve {source} there, then "
           f"`quorum data get NAME --to DIR --registry {out}`")
    return 0


# -- the command line -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    head, usage, details = __doc__.split("\n\n", 2)
    parser = argparse.ArgumentParser(prog="quorum data", allow_abbrev=False, description=head.split(": ", 1)[1],
                                     epilog=f"usage of each:\n{usage}\n\n{details}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--registry", default=str(REGISTRY), metavar="FILE",
                        help="a registry of the same form (a mirror's) instead of core/corpora.yaml")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,get,mirror}")
    parser.set_defaults(parsers=sub.choices)  # an unknown flag is reported with its subcommand's usage
    sub.add_parser("list", parents=[common], allow_abbrev=False, help="each corpus: source, licence, jobs",
                   description="Each corpus of the registry: its source, licence, how it is had and who reads it.")
    get = sub.add_parser("get", parents=[common], allow_abbrev=False, help="download and verify corpora",
                         description="Download corpora from their sources, verify them and lay them out as "
                                     "DIR/<layout>/<file>; print the steps for the others.")
    get.add_argument("names", nargs="+", metavar="NAME", help="corpora (`quorum data list` names them)")
    get.add_argument("--to", metavar="DIR", help="where the corpora go, as DIR/<layout> (the configs read "
                                                 "../shared/data: --to ../shared/data)")
    get.add_argument("--accept-licence", "--accept-license", dest="accepted", action="store_true",
                     help="accept each corpus's licence (named before anything is downloaded)")
    get.add_argument("--revision", default="", metavar="COMMIT",
                     help="a hub dataset's commit: its steps download that one")
    mirror = sub.add_parser("mirror", parents=[common], allow_abbrev=False, help="a registry reading from a mirror",
                            description="Write a registry whose downloadable corpora come from a mirror: DIR laid "
                                        "out by `get`, served at URL.")
    mirror.add_argument("source", metavar="DIR", help="a directory laid out by `quorum data get --to DIR`")
    mirror.add_argument("--base-url", required=True, metavar="URL", help="where DIR is served (http or https)")
    mirror.add_argument("--out", required=True, metavar="FILE", help="the registry to write")
    return parser


def main(argv: list[str]) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        args.parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "list":
            return list_corpora(args.registry)
        if args.command == "mirror":
            return write_mirror(args.registry, Path(args.source), args.base_url, Path(args.out))
        registry = load_registry(args.registry)
        unknown = [n for n in args.names if n not in registry.corpora]
        if unknown:
            raise ConfigError(f"quorum data get: unknown corpus {unknown[0]!r}; known: {', '.join(registry.corpora)}")
        corpora = [registry.corpora[n] for n in args.names]
        if args.revision and not (COMMIT.fullmatch(args.revision) and all(c.access == "hub" for c in corpora)):
            raise ConfigError("quorum data get: --revision takes a hub dataset's 40-hex-digit commit (the "
                              "downloadable corpora are pinned by the registry)")
        if args.to is None and any(c.access == "download" for c in corpora):
            raise ConfigError("quorum data get: --to DIR is required (the configs read ../shared/data/NAME: "
                              "--to ../shared/data)")
        for corpus in corpora:
            get_corpus(corpus, Path(args.to or "DIR"), args.accepted, args.revision)
    except RegistryError as exc:
        raise ConfigError(str(exc)) from exc
    except DownloadError as exc:
        print(f"quorum data: download failed: {exc}", file=sys.stderr)
        return 1
    return 0
