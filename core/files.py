"""Reading the text files users hand us (configs, corpora, system outputs): UTF-8 or a clear error."""

from __future__ import annotations

from pathlib import Path


def read_utf8(path: Path, error: type[Exception] = ValueError) -> str:
    """The file's text; a byte that is not UTF-8 raises `error` naming the file and the line it is on.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
    >>> _ = p.write_bytes(b"ok\\nbad \\xff\\n")
    >>> read_utf8(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...x.txt: line 2: not valid UTF-8 (invalid start byte)
    """
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{path}: line {line}: not valid UTF-8 ({exc.reason})") from None


def json_object(line: str, where: str, error: type[Exception] = ValueError) -> dict:
    """One JSONL line as a dict; anything else raises `error` starting with `where` (e.g. "corpus.jsonl: line 3";
    "" = no prefix, for a caller that adds its own).

    >>> json_object('{"a": 1}', "f: line 1")
    {'a': 1}
    >>> json_object('[1]', "f: line 2")
    Traceback (most recent call last):
    ValueError: f: line 2: expected a JSON object, got list
    """
    import json

    prefix = f"{where}: " if where else ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{prefix}not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise error(f"{prefix}expected a JSON object, got {type(record).__name__}")
    return record
