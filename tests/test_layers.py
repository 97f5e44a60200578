"""The repository's static rules, run with the suite so CI holds them: the import contracts in pyproject.toml
(`lint-imports`: layer order, pure modules, no cycles), no import cycle anywhere between our modules, `ruff check`
clean, and no binary file tracked.

What the linter cannot see (a third-party package importing ray or torch on our behalf) stays in
tests/test_import_boundaries.py, which imports the pure modules for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "eval", "actors", "train", "serve", "jobs", "bench")


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return found


def _run(args: list[str]) -> subprocess.CompletedProcess:
    # the checkout's packages, not whatever an editable install elsewhere points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_import_contracts_hold():
    out = _run([_tool("lint-imports"), "--no-cache", "--config", str(REPO / "pyproject.toml")])
    assert out.returncode == 0, f"lint-imports: a contract is broken\n{out.stdout[-6000:]}{out.stderr[-2000:]}"


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child) & modules))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_project_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules = set(graph.modules)
    assert not _cycles(graph, modules), f"import cycles: {_cycles(graph, modules)}"


def test_ruff_is_clean():
    out = _run([_tool("ruff"), "check", "--no-cache", str(REPO)])
    assert out.returncode == 0, f"ruff check:\n{out.stdout[-6000:]}{out.stderr[-2000:]}"


def test_no_binary_file_is_tracked():
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tracked = _run(["git", "ls-files", "-z"]).stdout.split("\0")
    binary = [name for name in tracked
              if name and (REPO / name).is_file() and b"\0" in (REPO / name).read_bytes()[:8192]]
    assert not binary, f"binary files are tracked (keep them out of the repository): {binary}"
