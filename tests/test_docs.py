"""The docs site and the README: a strict build, the pages' outlines, and the commands a newcomer copies.

No job runs here: each command is checked for what it names (entry point, config, override keys, files).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def load_hooks():
    spec = importlib.util.spec_from_file_location("quorum_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()

PAPER_SECTIONS = [
    ("the paper", r"the paper\b"),
    ("what quorum builds", r"what quorum builds"),
    ("how to run it", r"how to run|running it"),
    ("tables and figures", r"(every )?tables? and figures"),
    ("deviations", r"deviations"),
    ("what the CPU demo shows", r"what the (cpu )?demo shows"),
    ("what is not built", r"(what is )?not built"),
]


# -- the site ---------------------------------------------------------------------------------------------------


def test_mkdocs_build_strict_passes(tmp_path):
    """A broken link, a missing anchor, a page outside the nav or a config table that cannot be generated fails."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                          env={"PATH": str(Path(sys.executable).parent), "NO_MKDOCS_2_WARNING": "1",
                               "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (tmp_path / "site" / "jobs" / "policy-simplify" / "index.html").exists()


def test_the_docs_hook_imports_neither_ray_nor_torch():
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('h', 'docs/hooks.py'); "
            "h = importlib.util.module_from_spec(s); s.loader.exec_module(h); h.render('jobs.policy.simplify:Config'); "
            "print(sorted(m for m in ('ray', 'torch', 'transformers', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def h2_headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [line[3:].strip().lower() for line in text.splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("page", sorted((DOCS / "papers").glob("0*.md")), ids=lambda p: p.stem)
def test_every_paper_page_has_the_seven_outline_sections_in_order(page):
    headings = h2_headings(page)
    found = []
    for name, pattern in PAPER_SECTIONS:
        hits = [i for i, h in enumerate(headings) if re.match(pattern, h)]
        assert hits, f"{page.name}: no '## {name}' section (has {headings})"
        found.append(hits[0])
    assert found == sorted(found), f"{page.name}: the outline sections are out of order: {headings}"


def test_there_is_a_paper_page_per_paper():
    papers = {p.name.split("-")[0] for p in (REPO.parent / "shared" / "papers").glob("*.paper.txt")}
    pages = {p.name.split("-")[0] for p in (DOCS / "papers").glob("0*.md")}
    assert {"000", "001", "002", "003", "004"} <= pages
    assert papers <= pages or not papers


def job_modules() -> dict[str, str]:
    from jobs.cli import JOBS

    return dict(JOBS)


def test_every_job_has_a_page_with_a_generated_key_table():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for job, module in job_modules().items():
        page = DOCS / "jobs" / f"{job.replace('_', '-')}.md"
        assert page.exists(), f"job {job}: no docs page {page.relative_to(REPO)}"
        assert f"jobs/{page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"
        blocks = [(m.group("kind"), m.group("arg")) for m in hooks.BLOCK.finditer(page.read_text(encoding="utf-8"))]
        assert ("config-table", f"{module}:Config") in blocks, f"{page.name}: no generated key table of {module}:Config"
        rendered = hooks.render(f"{module}:Config")
        rows = [line for line in rendered.splitlines() if line.startswith("| `")]
        assert len(rows) >= 20, f"{page.name}: only {len(rows)} generated rows"
        assert "| `run.root` |" in rendered or job == "serve_grm"


def test_the_generated_tables_in_the_markdown_sources_are_current():
    """The key tables and the corpus table are in the .md files (readable on the repository host too), and
    `python docs/hooks.py --check` finds none out of date."""
    proc = subprocess.run([sys.executable, "docs/hooks.py", "--check"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data_page = (DOCS / "data.md").read_text(encoding="utf-8")
    assert "<!-- generated: corpora -->" in data_page and "| `newsela` |" in data_page
    # the rehearsal's cuts: one copy, the module's docstring, rendered into the page that explains them
    submitting = (DOCS / "submitting.md").read_text(encoding="utf-8")
    assert hooks.render_docstring_table("jobs.rehearse_overrides") in submitting
    assert "| the shared request cache (`run.request_cache`) | off |" in submitting
    with pytest.raises(hooks.ConfigTableError, match="holds no Markdown table"):
        hooks.render_docstring_table("jobs.entry")


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_tables_show_values_and_no_escaped_pipes(page):
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            assert "\\|" not in line, f"{page.name}: a literal \\| in a table: {line[:100]}"
            cells = line.split(" | ")
            if len(cells) >= 4 and cells[0].startswith("| `") and page.parent.name == "jobs":
                default = cells[2]
                assert not re.search(r"`[A-Z][A-Z0-9_]{3,}`|`_?[a-z_]+\(\)`|`list\([A-Z_]+\)`", default), \
                    f"{page.name}: a default shown as a name, not a value: {line[:120]}"


def test_a_long_key_table_has_a_sub_heading_per_section():
    text = (DOCS / "jobs" / "policy-simplify.md").read_text(encoding="utf-8")
    for section in ("run", "data", "generate", "jury", "train", "evaluate"):
        assert f"### `{section}`" in text


def test_the_key_table_follows_the_dataclasses(tmp_path, monkeypatch):
    """Types, defaults, nested sections, list items, inherited fields and comments come from the source."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text(
        "from dataclasses import dataclass, field\n\n"
        "@dataclass\nclass Inner:\n"
        "    # how many\n    n: int = 3\n"
        "    tags: list[str] = field(default_factory=list)\n\n"
        "@dataclass\nclass Base:\n    inner: Inner = field(default_factory=Inner)\n")
    (pkg / "job.py").write_text(
        "from dataclasses import dataclass, field\nfrom typing import Annotated\n"
        "from fakepkg.base import Base, Inner\nfrom fakepkg import base as b\n\n"
        "Name = Annotated[str, 'check']\n\n"
        "@dataclass\nclass Config(Base):\n"
        "    items: list[Inner] = field(default_factory=lambda: [Inner()])\n"
        "    name: Name = 'x'  # the name\n"
        "    rate: float | None = None\n"
        "    \"\"\"a rate, or none\"\"\"\n"
        "    more: b.Inner = field(default_factory=b.Inner)\n")
    monkeypatch.setattr(hooks.config_source, "ROOT", tmp_path)  # where the source reader looks for modules
    monkeypatch.setattr(hooks.Module, "_cache", {})
    rows = {r.key: r for r in hooks.config_rows("fakepkg.job:Config")}
    assert list(rows) == ["inner", "inner.n", "inner.tags", "items", "items.N.n", "items.N.tags", "name", "rate",
                          "more", "more.n", "more.tags"]
    assert rows["inner.n"] == hooks.Row("inner.n", "int", "3", "how many")
    assert rows["inner.tags"].default == "[]"
    assert rows["items"].default == "[Inner()]"
    assert rows["name"] == hooks.Row("name", "str", "'x'", "the name")
    assert rows["rate"] == hooks.Row("rate", "float", "None", "a rate, or none")
    with pytest.raises(hooks.ConfigTableError):
        hooks.config_rows("fakepkg.job:Missing")


# -- the README -------------------------------------------------------------------------------------------------

README = REPO / "README.md"


def test_readme_is_one_screenful_of_product():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert len(text.encode()) <= 14 * 1024
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[1].strip() == "On a fresh machine (Python 3.11, no GPU needed), from the repository root:"
    assert lines[2].strip() == "./setup.sh && .venv/bin/quorum run configs/demo.yaml"
    assert lines[3].strip() == "./setup.sh && .venv/bin/python -m pytest -q -n 2"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date"
    assert not re.search(r"\b(session|sessions) \d+|\bissue \d+", text, re.IGNORECASE), "a work-log reference"
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes: {hashes}"


def test_every_figure_the_readme_quotes_has_its_row_in_the_benchmarks_page():
    text = README.read_text(encoding="utf-8")
    bench = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    figures = re.findall(r"\b\d+ min \d+ s\b|\b\d+(?:\.\d+)? (?:tokens/s|s|ms|req/s)\b", text)
    assert figures, "the README quotes the demo's and the suite's time"
    for figure in figures:
        rows = [line for line in bench.splitlines() if line.startswith("|") and figure in line]
        assert rows, f"README figure {figure!r} has no row in docs/benchmarks.md"


# -- the commands a newcomer copies -----------------------------------------------------------------------------

# programs that are not ours: only the files they name are checked
EXTERNAL = {"ray", "pip", "curl", "kubectl", "docker", "export", "source", ".", "rm", "cd", "git", "tail", "mkdocs",
            "python3.11", "wandb", "serve"}
REPO_ROOTS = {"configs", "docs", "tests", "bench", "k8s", "jobs", "core", "eval", "actors", "train", "serve"}
# the subcommands `jobs/cli.py` dispatches: its table
QUORUM_COMMANDS = set(importlib.import_module("jobs.cli").COMMANDS)


def shell_blocks(path: Path) -> list[str]:
    """The fenced ```sh / ```bash blocks and the 4-space indented blocks of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, flags=re.DOTALL)
    outside = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    blocks += re.findall(r"(?:^|\n\n)((?:    \S.*\n?)+)", outside)
    return blocks


def shell_commands(path: Path) -> list[str]:
    commands = []
    for block in shell_blocks(path):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                commands.extend(c.strip() for c in re.split(r"&&|\|\||;|\||(?<![>&])&(?!&)", line) if c.strip())
    return commands


def is_placeholder(token: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?", token)) or token.startswith(("[", "<")) or \
        token in ("...", "RUN/...")


def config_keys(module: str) -> list[list[str]]:
    return [row.key.split(".") for row in hooks.config_rows(f"{module}:Config")], \
        {row.key for row in hooks.config_rows(f"{module}:Config") if row.type.startswith("dict")}


def key_exists(module: str, key: str) -> bool:
    keys, dict_keys = config_keys(module)
    parts = key.split(".")
    for row in keys:
        if len(row) > len(parts):
            continue
        matches = all(r == p or (r == "N" and p.isdigit()) or r == "NAME" for r, p in zip(row, parts))
        if matches and (len(row) == len(parts) or ".".join(row) in dict_keys):
            return True
    return False


def check_path(token: str, where: str) -> None:
    path = token.split("=", 1)[-1]
    first = path.split("/", 1)[0]
    if "/" in path and first in REPO_ROOTS and "*" not in path and "<" not in path:
        assert (REPO / path).exists(), f"{where}: {path} does not exist"


def check_quorum(args: list[str], where: str) -> None:
    args = [a for a in args if not is_placeholder(a)]
    assert args and args[0] in QUORUM_COMMANDS, f"{where}: unknown quorum command {args[:1]}"
    if args[0] in ("run", "submit", "serve", "stage-models"):
        if len(args) < 2:
            return  # the synopsis line
        check_job(args[1], args[2:], where)
    for token in args[1:]:
        check_path(token, where)


def check_job(config: str, rest: list[str], where: str) -> None:
    import yaml

    from jobs.cli import JOBS

    assert (REPO / config).exists(), f"{where}: config {config} does not exist"
    job = yaml.safe_load((REPO / config).read_text())["job"]
    module = JOBS[job]
    previous = ""
    for token in rest:
        flag_value = previous.startswith("--") and "=" not in token  # `--address URL`
        previous = token
        if token.startswith("-") or is_placeholder(token) or flag_value:
            continue
        assert "=" in token, f"{where}: {token!r} is not a dotted.key=value override"
        key = token.split("=", 1)[0]
        assert key_exists(module, key), f"{where}: {key!r} is not a key of {module}:Config"
        check_path(token, where)


def check_command(command: str, where: str) -> None:
    command = re.sub(r"(?<=\s)\[[^]]*\]", "", command)  # a synopsis' optional parts: [key=value ...]
    tokens = shlex.split(command)
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # VAR=value before the program
    if not tokens:
        return
    program, args = tokens[0], tokens[1:]
    name = program.rsplit("/", 1)[-1]
    if program.startswith("./"):
        assert (REPO / program).exists(), f"{where}: {program} does not exist"
    elif name == "quorum":
        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert "quorum" in scripts, f"{where}: no `quorum` entry point in pyproject.toml"
        check_quorum(args, where)
        return
    elif name.startswith("python") and name != "python3.11" and args[:1] == ["-m"]:
        module = args[1]
        if module.split(".")[0] in REPO_ROOTS:
            assert (REPO / (module.replace(".", "/") + ".py")).exists(), f"{where}: no module {module}"
            if module.startswith("jobs.") and len(args) > 2 and not is_placeholder(args[2]):
                check_job(args[2], args[3:], where)
        else:
            assert importlib.util.find_spec(module) is not None, f"{where}: {module} is not installed"
    elif name == "ray" and "--" in args:
        inner = args[args.index("--") + 1:]
        check_command(shlex.join(inner), where)
    elif name not in EXTERNAL and not name.startswith("python"):
        raise AssertionError(f"{where}: unknown program {program!r}")
    for token in args:
        check_path(token, where)


def newcomer_pages() -> list[Path]:
    return [README, DOCS / "install.md", DOCS / "running-jobs.md", *sorted((DOCS / "jobs").glob("*.md")),
            DOCS / "papers" / "000-policy-simplification.md", DOCS / "papers" / "001-synthsimplieval-jury.md",
            DOCS / "papers" / "003-menlo.md"]


@pytest.mark.parametrize("page", newcomer_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shell_command_names_what_exists(page):
    commands = shell_commands(page)
    if page in (README, DOCS / "install.md"):
        assert any("quorum run configs/demo.yaml" in c for c in commands), "the quick start is missing"
    for command in commands:
        check_command(command, f"{page.relative_to(REPO)}: {command[:80]}")


def test_the_command_checker_fails_on_what_does_not_exist():
    for bad in ("quorum run configs/nope.yaml", "quorum run configs/demo.yaml data.nope=1",
                "quorum frobnicate", ".venv/bin/python -m jobs.nope configs/demo.yaml", "./nope.sh",
                "ray job submit --address http://127.0.0.1:8265 -- quorum run configs/demo.yaml jury.nope=1",
                "python -m pytest -q tests/test_nope.py"):
        with pytest.raises(AssertionError):
            check_command(bad, bad)
    check_command("quorum run configs/demo.yaml generate.0.sampling.temperature=0.7 policies.lexical=x", "ok")


@pytest.mark.parametrize("page", [README, DOCS / "install.md"], ids=lambda p: p.name)
def test_every_file_the_page_names_in_code_exists(page):
    """Configs, modules and files named inline (`configs/demo.yaml`), as the tables of the README name them."""
    for span in re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")):
        for token in span.split():
            check_path(token.rstrip(",;:)"), f"{page.name}: `{span}`")


def test_user_documents_name_no_issue_numbers():
    """User documents describe the product as it is: the work's history (issue numbers) stays in the issue notes."""
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    paths = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "configs").rglob("*.yaml"))]
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in paths
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)
    assert pattern.search("fixed in issue 41") and pattern.search("Issues 39")  # the pattern catches the forms used
