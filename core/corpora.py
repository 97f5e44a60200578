"""The registry of corpora the jobs read (`core/corpora.yaml`): where each comes from, its licence, which jobs and
configs read it, its files with their SHA-256 sums and the layout the jobs expect.

Pure: reading and checking the registry, and the hint a missing data path gets (`missing_hint`). Downloading is
`jobs/data_cli.py` (`quorum data`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REGISTRY = Path(__file__).with_name("corpora.yaml")
ACCESS = ("download", "hub", "request")
SHA256 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")


class RegistryError(ValueError):
    """A registry file that is not what `core/corpora.yaml` describes; the message names the file and key."""


@dataclass(frozen=True)
class CorpusFile:
    source: str  # path under the corpus's base_url
    to: str  # file name under DIR/<layout>/
    bytes: int | None
    sha256: str | None  # None: the source file's sum is not known, so a download cannot be verified


@dataclass(frozen=True)
class Corpus:
    name: str
    title: str
    citation: str
    source: str
    licence: str
    licence_url: str
    access: str
    layout: str
    format: str
    jobs: tuple[str, ...]
    configs: tuple[str, ...] = ()
    base_url: str = ""
    files: tuple[CorpusFile, ...] = ()
    steps: str = ""
    licence_note: str = ""
    # a hub dataset's commit, the one its steps download (`hf download --revision`); "" = none recorded: the
    # steps ask for one (`quorum data get NAME --revision COMMIT`)
    revision: str = ""

    @property
    def verifiable(self) -> bool:
        return bool(self.files) and all(f.sha256 for f in self.files)

    def get_command(self, to: str = "DIR") -> str:
        if self.access == "download":
            return f"quorum data get {self.name} --to {to}"
        return f"quorum data get {self.name}"


@dataclass
class Registry:
    path: Path
    corpora: dict[str, Corpus] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Corpus:
        if name not in self.corpora:
            raise KeyError(f"no corpus {name!r} in {self.path}; known: {', '.join(self.corpora)}")
        return self.corpora[name]


def _text(entry: dict, key: str, where: str, required: bool = True) -> str:
    value = entry.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise RegistryError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    return " ".join(value.split()) if key != "steps" else value.rstrip()


def _strings(entry: dict, key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RegistryError(f"{where}.{key}: must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _file(entry: object, where: str) -> CorpusFile:
    if not isinstance(entry, dict):
        raise RegistryError(f"{where}: must be a mapping with source, to, bytes and sha256, got {entry!r}")
    unknown = set(entry) - {"source", "to", "bytes", "sha256"}
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {sorted(unknown)}")
    source, to = entry.get("source"), entry.get("to")
    for key, value in (("source", source), ("to", to)):
        if not isinstance(value, str) or not value or value.startswith("/") or ".." in Path(value).parts:
            raise RegistryError(f"{where}.{key}: must be a relative path inside the corpus, got {value!r}")
    if "/" in to:
        raise RegistryError(f"{where}.to: must be a file name, got {to!r}")
    size = entry.get("bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise RegistryError(f"{where}.bytes: must be an integer >= 0 or null, got {size!r}")
    digest = entry.get("sha256")
    if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
        raise RegistryError(f"{where}.sha256: must be 64 lower-case hex digits or null (not known), got {digest!r}")
    return CorpusFile(source, to, size, digest)


KEYS = {"title", "citation", "source", "licence", "licence_note", "licence_url", "access", "layout", "format", "jobs", "configs",
        "base_url", "files", "steps", "revision"}


def load_registry(path: str | Path = REGISTRY) -> Registry:
    """The registry at `path`; RegistryError names the file and the key of anything malformed."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read the corpus registry: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise RegistryError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("corpora"), dict) or not data["corpora"]:
        raise RegistryError(f"{path}: must be a mapping with a non-empty 'corpora' mapping")
    registry = Registry(path)
    for name, entry in data["corpora"].items():
        where = f"{path}: corpora.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
            raise RegistryError(f"{where}: a corpus name is lower-case letters, digits, '-' and '_'")
        if not isinstance(entry, dict):
            raise RegistryError(f"{where}: must be a mapping")
        unknown = set(entry) - KEYS
        if unknown:
            raise RegistryError(f"{where}: unknown key(s) {sorted(unknown)}")
        access = _text(entry, "access", where)
        if access not in ACCESS:
            raise RegistryError(f"{where}.access: must be one of {', '.join(ACCESS)}, got {access!r}")
        files = tuple(_file(f, f"{where}.files.{i}") for i, f in enumerate(entry.get("files") or []))
        if access == "download":
            if not files:
                raise RegistryError(f"{where}.files: a downloadable corpus lists its files")
            if not re.match(r"https?://", _text(entry, "base_url", where)):
                raise RegistryError(f"{where}.base_url: must be an http(s) URL")
            names = [f.to for f in files]
            if len(set(names)) != len(names):
                raise RegistryError(f"{where}.files: two files are saved under the same name")
        elif not _text(entry, "steps", where, required=False):
            raise RegistryError(f"{where}.steps: a corpus quorum does not download says how to get it")
        if access == "hub":
            if "revision" not in entry:
                raise RegistryError(f"{where}.revision: a hub dataset declares the commit its steps download "
                                    "(null: none recorded)")
            if entry["revision"] is not None and not (isinstance(entry["revision"], str)
                                                      and COMMIT.fullmatch(entry["revision"])):
                raise RegistryError(f"{where}.revision: must be a 40-hex-digit commit or null, got {entry['revision']!r}")
            if "REVISION" not in (entry.get("steps") or ""):
                raise RegistryError(f"{where}.steps: the download step passes --revision REVISION")
        elif "revision" in entry:
            raise RegistryError(f"{where}.revision: only a hub dataset has one")
        layout = _text(entry, "layout", where)
        if "/" in layout or layout in (".", ".."):
            raise RegistryError(f"{where}.layout: must be one directory name, got {layout!r}")
        registry.corpora[name] = Corpus(
            name=name, title=_text(entry, "title", where), citation=_text(entry, "citation", where),
            source=_text(entry, "source", where), licence=_text(entry, "licence", where),
            licence_url=_text(entry, "licence_url", where), access=access, layout=layout,
            format=_text(entry, "format", where), jobs=_strings(entry, "jobs", where),
            configs=_strings(entry, "configs", where), base_url=_text(entry, "base_url", where, required=False),
            files=files, steps=_text(entry, "steps", where, required=False),
            licence_note=_text(entry, "licence_note", where, required=False), revision=entry.get("revision") or "")
    return registry


def corpus_for_path(path: str, registry: Registry | None = None) -> tuple[Corpus, str] | None:
    """(corpus, the DIR to pass to `--to`) when `path` is where a corpus's layout puts it: `DIR/<layout>` or
    `DIR/<layout>/<file>`; None otherwise."""
    registry = registry or load_registry()
    norm = Path(os.path.normpath(path)) if path else None
    if norm is None:
        return None
    for corpus in registry.corpora.values():
        if norm.name == corpus.layout:
            return corpus, str(norm.parent)
        if norm.parent.name == corpus.layout and (not corpus.files or norm.name in {f.to for f in corpus.files}):
            return corpus, str(norm.parent.parent)
    for corpus in registry.corpora.values():  # a corpus had by hand may be saved under any name that says so
        if corpus.access != "download" and corpus.name in norm.name.lower():
            return corpus, str(norm.parent)
    return None


def hint_suffix(path: str) -> str:
    """' (the command that gets it)' for a missing path where a corpus goes, '' otherwise: for error messages."""
    hint = missing_hint(path)
    return f" ({hint})" if hint else ""


def missing_hint(path: str) -> str:
    """What to run to get the corpus a missing data path names ('' when it names none)."""
    try:
        found = corpus_for_path(path)
    except RegistryError:
        return ""
    if found is None:
        return ""
    corpus, to = found
    if corpus.access == "download":
        return f"the {corpus.name} corpus: get it with `{corpus.get_command(to)}`"
    how = "how to request it" if corpus.access == "request" else "how to download and convert it"
    return f"the {corpus.name} corpus: `{corpus.get_command()}` prints {how}"
