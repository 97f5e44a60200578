"""Reading the text files users hand us (configs, corpora, system outputs): UTF-8 or a clear error.

Also the one YAML loader (`load_yaml`) and the one JSON Lines row parser (`json_object`) of the project: both refuse
a key given twice in one mapping, which PyYAML and `json.loads` would otherwise resolve silently to the last value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


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
    >>> json_object('{"id": "a", "text": "x", "text": "y"}', "f: line 3")
    Traceback (most recent call last):
    ValueError: f: line 3: key 'text' appears twice in one object (JSON would keep only the last value)
    """
    prefix = f"{where}: " if where else ""
    try:
        record = json.loads(line, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise error(f"{prefix}not valid JSON: {exc.msg} (column {exc.colno})") from None
    except _DuplicateJSONKey as exc:
        raise error(f"{prefix}key {exc.key!r} appears twice in one object (JSON would keep only the last "
                    "value)") from None
    if not isinstance(record, dict):
        raise error(f"{prefix}expected a JSON object, got {type(record).__name__}")
    return record


class _DuplicateJSONKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """`json.loads` object hook (every nesting level): a dict, unless a key repeats."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateJSONKey(key)
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------------------------
# YAML


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names one key twice; `line` / `first_line` are 1-based."""

    def __init__(self, key: Any, first_line: int, line: int):
        super().__init__(problem=f"key {key!r} appears twice (lines {first_line} and {line})")
        self.key, self.first_line, self.line = key, first_line, line


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key given twice in one mapping is an error.

    YAML 1.2 requires keys to be unique, but PyYAML keeps the last value, so a config with `lr` twice would run with
    the second one and nobody would know. Merge keys (`<<: *base`) may still be overridden: only the keys written in
    the mapping itself are compared.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.get(key)
                except TypeError:  # an unhashable key: SafeConstructor names it below
                    continue
                line = key_node.start_mark.line + 1
                if seen is not None:
                    raise DuplicateKeyError(key, seen, line)
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, where: str = "", error: type[Exception] = ValueError) -> Any:
    """`yaml.safe_load(text)` with duplicate keys refused; any problem raises `error` starting with `where` (the
    file; "" = no prefix).

    >>> load_yaml("a: 1\\nb: {c: 2}\\n")
    {'a': 1, 'b': {'c': 2}}
    >>> load_yaml("train:\\n  lr: 1\\n  steps: 2\\n  lr: 3\\n", "job.yaml")
    Traceback (most recent call last):
    ValueError: job.yaml: line 4: key 'lr' appears twice (first at line 2); YAML would keep only the last value
    """
    prefix = f"{where}: " if where else ""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: safe
    except DuplicateKeyError as exc:
        raise error(f"{prefix}line {exc.line}: key {exc.key!r} appears twice (first at line {exc.first_line}); YAML "
                    "would keep only the last value") from None
    except yaml.YAMLError as exc:
        raise error(f"{prefix}invalid YAML: {exc}") from None
