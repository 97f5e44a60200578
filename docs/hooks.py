"""Generated blocks of the docs' Markdown sources: the config key tables and the corpus table, written into the
`.md` files (so they read the same on the repository host as on the site) and checked at build time.

    python docs/hooks.py            rewrite every generated block under docs/ that is out of date
    python docs/hooks.py --check    exit 1 naming each stale block (tests/test_docs.py runs this)

A block sits between `<!-- generated: KIND ARG -->` and `<!-- end generated -->`:

- `config-table jobs.policy.simplify:Config`: every key of that dataclass tree, dotted (list items as `N`, dict
  entries as `NAME`), with type, default and what it does (read from source by `docs/config_source.py`); a table of
  more than SPLIT_ROWS rows gets a `###` sub-heading per top-level section.
- `corpora`: the corpus registry `core/corpora.yaml` (`quorum data list`).
- `docstring-table jobs.rehearse_overrides`: the Markdown table in that module's docstring (read from its source, not
  imported), so a page and the code it describes hold one copy of it.

As an mkdocs hook it regenerates every block of a page as it builds it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


def _sibling(name: str) -> ModuleType:
    """A module of docs/, loaded by its path: this file runs as a script, as an mkdocs hook and as a file the tests
    load, and only the first two put docs/ on the import path."""
    spec = importlib.util.spec_from_file_location(f"quorum_docs_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


config_source = _sibling("config_source")
# the reader's names, as tests/test_docs.py reaches them through this module
ConfigTableError, Module, Row, config_rows = (config_source.ConfigTableError, config_source.Module, config_source.Row,
                                              config_source.config_rows)

ROOT = config_source.ROOT
BLOCK = re.compile(r"(<!-- generated: (?P<kind>[\w-]+)(?: (?P<arg>[\w.:]+))? -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.DOTALL)
SPLIT_ROWS = 100  # a key table longer than this gets a sub-heading per top-level section


def _cell(text: str, code: bool = False) -> str:
    """A table cell. A `|` would end the cell (and an escaped one shows as `\\|` in places), so text says "or" and
    code that holds one is written as HTML with an entity."""
    text = " ".join(text.split())
    if code and text:
        if "|" in text:
            return "<code>" + _html(text).replace("|", "&#124;") + "</code>"
        return f"`{text}`"
    # a comment's <think> or <root> is text, not an HTML tag (code spans escape themselves)
    parts = text.split("`")
    for i, part in enumerate(parts):
        if i % 2 == 0:
            parts[i] = _html(part).replace(" | ", " or ").replace("|", "/")
        elif "|" in part:
            parts[i] = "\x00" + _html(part).replace("|", "&#124;") + "\x01"
    text = "`".join(parts)
    return re.sub(r"`?\x00(.*?)\x01`?", r"<code>\1</code>", text)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _table(rows: list[Row]) -> list[str]:
    lines = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for row in rows:
        kind = "section" if row.type == "section" else _cell(row.type, code=True)
        lines.append(f"| `{row.key}` | {kind} | {_cell(row.default, code=True)} | {_cell(row.doc)} |")
    return lines


def render(target: str) -> str:
    """The Markdown of `module:Class`'s key table: one table, or one per top-level section when it is long."""
    rows = config_rows(target)
    if len(rows) <= SPLIT_ROWS:
        return "\n".join(_table(rows)) + "\n"
    groups: list[tuple[str, list[Row]]] = []
    for row in rows:
        head = row.key.split(".")[0]
        name = head if row.type == "section" or "." in row.key else ""
        if groups and groups[-1][0] == name:
            groups[-1][1].append(row)
        else:
            groups.append((name, [row]))
    lines = [f"{len(rows)} keys, by section.", ""]
    for name, group in groups:
        lines += [f"### `{name}`" if name else "### Top-level keys", ""]
        lines += _table(group) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_corpora() -> str:
    """The corpus registry (core/corpora.yaml) as a table; read with PyYAML, no import of the package."""
    import yaml

    data = yaml.safe_load((ROOT / "core" / "corpora.yaml").read_text(encoding="utf-8"))["corpora"]
    how = {"download": "`get --to DIR`", "hub": "hub: steps", "request": "on request: steps"}
    lines = ["| corpus | what | source | licence | read by | `quorum data` |", "|---|---|---|---|---|---|"]
    for name, c in data.items():
        short = re.sub(r"^https?://(www\.)?(github\.com/|huggingface\.co/datasets/)?", "", c["source"]).rstrip("/")
        jobs = ", ".join(f"`{j}`" for j in c["jobs"])
        lines.append(f"| `{name}` | {_cell(c['title'])} | [{short}]({c['source']}) | "
                     f"[{_cell(c['licence'])}]({c['licence_url']}) | {jobs} | {how[c['access']]} |")
    return "\n".join(lines) + "\n"


def render_docstring_table(module: str) -> str:
    """The first Markdown table (consecutive lines starting with '|') of `module`'s docstring."""
    import ast

    path = ROOT / (module.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines, started = [], False
    for line in doc.splitlines():
        if line.startswith("|"):
            lines.append(line)
            started = True
        elif started:
            break
    if not lines:
        raise ConfigTableError(f"{path}: its docstring holds no Markdown table")
    return "\n".join(lines) + "\n"


def generate(kind: str, arg: str | None) -> str:
    if kind == "config-table" and arg and ":" in arg:
        return render(arg)
    if kind == "corpora":
        return render_corpora()
    if kind == "docstring-table" and arg:
        return render_docstring_table(arg)
    raise ConfigTableError(f"unknown generated block {kind!r} {arg or ''}".rstrip())


def update(markdown: str) -> str:
    """`markdown` with every generated block regenerated."""
    return BLOCK.sub(lambda m: m.group(1) + "\n" + generate(m.group("kind"), m.group("arg")) + "\n" + m.group(5),
                     markdown)


def stale_pages(docs: Path = ROOT / "docs") -> list[Path]:
    return [page for page in sorted(docs.rglob("*.md")) if update(page.read_text(encoding="utf-8"))
            != page.read_text(encoding="utf-8")]


def on_page_markdown(markdown: str, page, config, files) -> str:
    # the site always shows the tables of the code it is built from; that the .md sources are current too is
    # tests/test_docs.py's check (`python docs/hooks.py --check`)
    return update(markdown)


def main(argv: list[str]) -> int:
    stale = stale_pages()
    if "--check" in argv:
        for page in stale:
            print(f"{page.relative_to(ROOT)}: generated block out of date (run `python docs/hooks.py`)")
        return 1 if stale else 0
    for page in stale:
        page.write_text(update(page.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
