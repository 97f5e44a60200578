"""The layout: one folder per method inside each layer (docs/architecture.md), small folders, and docs that name only
paths that exist.

The import rules themselves (layers, no cycles, one method package never importing another) are import-linter's
contracts in pyproject.toml, run by tests/test_layers.py; this file checks what import-linter cannot see.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("core", "eval", "actors", "train", "serve", "jobs")
MAX_MODULES = 20
PAPERS = sorted((REPO / "docs" / "papers").glob("0*.md"))


def packages() -> list[Path]:
    """Every package of the layers, and the benchmarks' folders (run as `python -m bench.<name>`)."""
    bench = {p.parent for p in (REPO / "bench").rglob("*.py")}
    return sorted({p.parent for layer in LAYERS for p in (REPO / layer).rglob("__init__.py")} | bench)


def modules(package: Path) -> list[str]:
    return sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")


def test_every_layer_folder_is_a_package():
    for layer in LAYERS:
        for folder in (REPO / layer).rglob("*"):
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                assert (folder / "__init__.py").exists(), f"{folder.relative_to(REPO)} has modules but no __init__.py"


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_package_is_small_and_its_names_carry_no_package_prefix(package):
    names = modules(package)
    assert len(names) <= MAX_MODULES, f"{package.relative_to(REPO)}: {len(names)} modules (at most {MAX_MODULES})"
    # a prefix on three modules is a package that was never made: `craft_agent`, `craft_tree`, `craft_mcts`, ...
    prefixes = Counter(name.split("_")[0] for name in names if "_" in name)
    crowded = {p: [n for n in names if n.startswith(p + "_")] for p, k in prefixes.items() if k >= 3}
    assert not crowded, f"{package.relative_to(REPO)}: modules sharing a prefix: {crowded}"


# a source path a page names: a module (`eval/craft/mcts.py`) or a package folder (`eval/craft/`)
ROOTS = "|".join((*LAYERS, "bench", "tests", "configs", "k8s"))
CODE_PATH = re.compile(rf"(?<![\w/.-])((?:{ROOTS})/(?:[\w-]+/)*(?:[\w-]+\.(?:py|yaml|toml)|))(?![\w/])")


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in CODE_PATH.finditer(text) if m.group(1).endswith((".py", ".yaml", ".toml"))
            or m.group(1).split("/")[0] in LAYERS}


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_source_path_a_page_names_exists(page):
    text = page.read_text(encoding="utf-8")
    # a run directory's folders (`train/run/val_answers/`) are outputs, not source, and so is a config a page tells
    # the reader to write (`configs/my_run.yaml`)
    missing = sorted(p for p in named_paths(text) if not (REPO / p).exists()
                     and "/run/" not in p and not p.startswith("configs/my_"))
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


def test_the_path_check_sees_a_missing_module():
    """Control: the check above would fail on a stale path (as `eval/craft_agent.py` became after the move)."""
    stale = "The quality scorer is `eval/craft_agent.py:quality`; the search is in `eval/craft/`."
    assert named_paths(stale) == {"eval/craft_agent.py", "eval/craft/"}
    assert not (REPO / "eval/craft_agent.py").exists() and (REPO / "eval/craft").is_dir()


WHERE = re.compile(r"^### Where it lives\n\n\| part \| code \|\n\|---\|---\|\n((?:\|.*\|\n)+)", re.MULTILINE)
LINK = re.compile(r"\[`([^`]+)`\]\(((?:\.\./)+)([^)]+)\)")


def where_it_lives(page: Path) -> list[tuple[str, list[str]]]:
    match = WHERE.search(page.read_text(encoding="utf-8"))
    assert match, f"{page.name}: no '### Where it lives' table under 'What quorum builds'"
    rows = []
    for line in match.group(1).splitlines():
        part, code = line.strip("|").split("|", 1)
        links = LINK.findall(code)
        assert links, f"{page.name}: row {part.strip()!r} links no code"
        for text, ups, target in links:
            assert text == target and ups == "../../", f"{page.name}: link {text!r} -> {ups}{target}"
        rows.append((part.strip(), [t for _, _, t in links]))
    return rows


@pytest.mark.parametrize("page", PAPERS, ids=lambda p: p.stem)
def test_a_paper_page_links_its_method_folder(page):
    """From each paper page the method's code is one link away: the table's first row is one package folder that
    holds the method's modules, and every link of the table exists."""
    rows = where_it_lives(page)
    for _, targets in rows:
        for target in targets:
            assert (REPO / target).exists(), f"{page.name}: {target} does not exist"
    first = rows[0][1]
    assert len(first) == 1 and first[0].endswith("/"), f"{page.name}: the first row must be the method's one folder"
    folder = REPO / first[0]
    assert (folder / "__init__.py").exists() and len(modules(folder)) >= 2, f"{page.name}: {first[0]} is no package"


def test_the_site_turns_source_links_into_repository_links():
    """docs/code_links.py: a source link becomes a repository link where repo_url is set, code text where it is not,
    and a link to a path that does not exist is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("quorum_code_links", REPO / "docs" / "code_links.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = "See [`eval/craft/`](../../eval/craft/) and [the engine](../engine.md)."
    assert hook.rewrite(text, "papers/002-craft.md", None) == "See `eval/craft/` and [the engine](../engine.md)."
    assert hook.rewrite(text, "papers/002-craft.md", "https://example.org/q") == (
        "See [`eval/craft/`](https://example.org/q/tree/HEAD/eval/craft) and [the engine](../engine.md).")
    with pytest.raises(hook.CodeLinkError, match="eval/craft_agent.py"):
        hook.rewrite("[x](../../eval/craft_agent.py)", "papers/002-craft.md", None)
