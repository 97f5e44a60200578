"""`quorum run CONFIG --help`: every key of CONFIG's job config, the rows of its job page's table.

The rows come from `docs/config_source.py`, the reader that generates the job pages' key tables from the config
dataclasses' source (type, default, the field's comment), so the terminal and the page say the same. That reader
lives beside the docs it builds and is loaded by its path, as `docs/hooks.py` loads it; an installation without the
repository's `docs/` (a wheel) gets the job page's name instead.
"""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path

from core.config import ConfigError, read_yaml
from jobs.entry import JOBS

READER = Path(__file__).resolve().parents[1] / "docs" / "config_source.py"


def _reader():
    spec = importlib.util.spec_from_file_location("quorum_docs_config_source", READER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_page(job: str) -> str:
    return f"docs/jobs/{job.replace('_', '-')}.md"


def key_lines(job: str, width: int = 100) -> list[str]:
    """The key table of `job`'s config as terminal lines: `key  type  default` and the description under it."""
    rows = _reader().config_rows(f"{JOBS[job]}:Config")
    indent = " " * 6
    lines = []
    for row in rows:
        if row.type == "section":
            lines.append(f"  {row.key}:")
        else:
            lines.append(f"  {row.key}  {row.type}  = {row.default}")
        if row.doc:
            lines += textwrap.wrap(row.doc, width=width, initial_indent=indent, subsequent_indent=indent)
    return lines


def print_config_keys(config_path: str) -> None:
    """Print the keys of the job that `config_path` names (its `job:` key); a config that cannot be read says why,
    after the usage (help never fails)."""
    try:
        job = read_yaml(config_path).get("job")
    except ConfigError as exc:
        print(f"{config_path}: cannot list its keys: {exc}")
        return
    if job not in JOBS:
        print(f"{config_path}: key 'job' must be one of {sorted(JOBS)}, got {job!r}: no keys to list")
        return
    print(f"keys of the {job} job ({config_path} sets some; every other key keeps its default; "
          f"override any with key=value; page: {job_page(job)}):")
    if not READER.is_file():
        print(f"  (the key table is on the job page, {job_page(job)})")
        return
    width = min(100, max(60, shutil.get_terminal_size((100, 20)).columns - 8))
    print("\n".join(key_lines(job, width)))
