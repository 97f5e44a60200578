"""Every `quorum run|submit|serve|stage-models|plan ...`, `python -m jobs.<job> ...` and `ray job submit ... -- quorum ...`
command of README.md and docs/ (every page: cluster, submitting and paper pages included) loads its config with its
overrides through the real loader, as the job would (path resolution, `load_config`, the model-staging check). No
job runs.

The setup is the documented one, built in a sandbox:

- a checkout with `configs/`, and beside it `../shared/data/<corpus>/...` as `quorum data get NAME --to
  ../shared/data` lays the downloadable corpora out (empty files: only their names are checked at load time);
- the cluster guide's shared filesystem (docs/cluster.md, "Shared storage"): `/mnt/shared/quorum` is QUORUM_HOME
  (submitted jobs get it from "$RUNTIME_ENV"), `/mnt/shared/quorum/runs` the run root, `/mnt/shared/hf` the
  Hugging Face cache into which `quorum stage-models` staged the config's hub models, `/mnt/shared/data` the
  corpora (the registry's layouts, and any file a command names there). `/mnt/shared` in a command or a config is
  the sandbox's copy of it; nothing else outside the sandbox exists for a command;
- a `ray job submit` driver runs in Ray's copy of the working directory (nothing beside it), with $RUNTIME_ENV's
  QUORUM_HOME, as a submitted job;
- what an earlier documented run writes (an adapter under `runs/` or `/mnt/shared/quorum/runs/`, named by a later
  command) is there.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from core.config import ConfigError, load_config, read_yaml, split_command
from core.corpora import load_registry
from core.model_store import check_models_staged, models_by_repo
from core.paths import HOME_ENV, SUBMITTED_JOB_ENV, path_overrides

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ADDRESS = "http://127.0.0.1:8265"
LOADED = ("run", "submit", "serve", "stage-models", "plan")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def shell_lines(path: Path) -> list[str]:
    """The commands of the fenced sh/bash/shell blocks and the 4-space indented blocks, continuations joined."""
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, flags=re.DOTALL)
    outside = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    blocks += [re.sub(r"^    ", "", b, flags=re.MULTILINE) for b in re.findall(r"(?:^|\n\n)((?:    \S.*\n?)+)", outside)]
    lines = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#\s.*$", "", line).strip()
            if line:
                lines.extend(c.strip() for c in re.split(r"&&|\|\||;|\||(?<![>&])&(?!&)", line) if c.strip())
    return lines


def is_placeholder(token: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?", token)) or token.startswith(("[", "<")) or \
        token in ("...", "key=value", "dotted.key=value") or "..." in token


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, tokens) of each command that names a config to load."""
    found = []
    for page in pages():
        rel = page.relative_to(REPO)
        for line in shell_lines(page):
            try:
                tokens = shlex.split(line)
            except ValueError:
                continue
            while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
                tokens = tokens[1:]
            if not tokens:
                continue
            name = tokens[0].rsplit("/", 1)[-1]
            inner = tokens
            if name == "ray" and tokens[1:3] == ["job", "submit"] and "--" in tokens:
                inner = tokens[tokens.index("--") + 1:]
                name = inner[0].rsplit("/", 1)[-1] if inner else ""
            if name == "quorum" and len(inner) > 2 and inner[1] in LOADED and not is_placeholder(inner[2]) or name.startswith("python") and inner[1:2] == ["-m"] and len(inner) > 3 and \
                    inner[2].startswith("jobs.") and not is_placeholder(inner[3]):
                found.append((f"{rel}: {line[:110]}", tokens))
    return found


COMMANDS = doc_commands()


def test_the_pages_have_commands_to_check():
    where = {w.split(":")[0] for w, _ in COMMANDS}
    assert len(COMMANDS) >= 40, len(COMMANDS)
    for page in ("README.md", "docs/cluster.md", "docs/submitting.md", "docs/papers/002-craft.md",
                 "docs/papers/004-agentsimp.md", "docs/jobs/judge-sft.md"):
        assert page in where, f"no command found on {page}"


# -- the data steps: `quorum data ...` and `hf download ...` ------------------------------------------------------


def data_steps() -> list[tuple[str, list[str]]]:
    """(where, tokens) of each `quorum data` and `hf download` command: in the pages' shell blocks and inline code,
    and in the registry's steps, which `quorum data get NAME` prints."""
    found = []
    for page in pages():
        rel = page.relative_to(REPO)
        inline = [" ".join(span.split()) for span in  # a span may wrap across lines
                  re.findall(r"`((?:quorum\s+data|hf\s+download)\s[^`]+)`", page.read_text(encoding="utf-8"))]
        for line in [*shell_lines(page), *inline]:
            try:
                tokens = shlex.split(line)
            except ValueError:
                continue
            # `quorum data get` alone in a sentence names the command; with arguments it is one to run
            if tokens[:2] == ["hf", "download"] or tokens[:2] == ["quorum", "data"] and (
                    tokens[2:3] == ["list"] or len(tokens) > 3):
                found.append((f"{rel}: {line[:110]}", tokens))
    for corpus in load_registry().corpora.values():
        for line in corpus.steps.splitlines():
            if line.strip().startswith("hf download"):
                found.append((f"core/corpora.yaml: {corpus.name}: {line.strip()[:90]}", shlex.split(line)))
    return found


DATA_STEPS = data_steps()


def test_the_data_steps_are_found_where_users_read_them():
    where = {w.split(":")[0] for w, _ in DATA_STEPS}
    assert {"README.md", "docs/data.md", "docs/troubleshooting.md", "docs/cluster.md", "core/corpora.yaml"} <= where
    assert any(t[:2] == ["hf", "download"] for w, t in DATA_STEPS if w.startswith("docs/data.md"))


def hf_download_command():
    """The `hf download` command of the Hugging Face CLI quorum's environment installs (its arguments parsed, never
    run: the hub is the world's edge)."""
    import click
    from huggingface_hub.cli.hf import app

    command = app.get_command(click.Context(app, info_name="hf"), "download")
    return getattr(command, "materialize", lambda: command)()


@pytest.mark.parametrize("where, tokens", DATA_STEPS, ids=[w for w, _ in DATA_STEPS])
def test_every_data_step_runs_as_written(where, tokens):
    """`quorum data ...` parses with quorum's own parser, names corpora of the registry, has `--to` where a corpus is
    downloaded and puts it at DIR/<corpus> (not DIR/<corpus>/<corpus>); `hf download` is the environment's CLI with
    options it takes, a hub corpus of the registry, a pinned `--revision` and `--local-dir .../<corpus>`."""
    from jobs.data_cli import build_parser

    registry = load_registry()
    layouts = {c.layout for c in registry.corpora.values()}
    if tokens[0] == "hf":
        assert (Path(sys.executable).parent / "hf").is_file(), "`hf` is not in quorum's environment"
        import click

        try:
            hf_download_command().make_context("download", tokens[2:])
        except click.UsageError as exc:
            pytest.fail(f"{where}\n  hf download refuses it: {exc}", pytrace=False)
        hub = {re.sub(r"^https://huggingface\.co/datasets/", "", c.source).rstrip("/"): c
               for c in registry.corpora.values() if c.access == "hub"}
        assert tokens[2] in hub, f"{where}: {tokens[2]} is no hub dataset of the registry"
        options = dict(zip(tokens[3::2], tokens[4::2]))
        assert options.get("--repo-type") == "dataset", f"{where}: needs --repo-type dataset"
        revision = options.get("--revision", "")
        assert revision == "REVISION" or re.fullmatch(r"[0-9a-f]{40}", revision), f"{where}: no pinned --revision"
        assert Path(options.get("--local-dir", "")).name == hub[tokens[2]].layout, f"{where}: --local-dir .../<corpus>"
        return
    try:
        args = build_parser().parse_args([t for t in tokens[2:] if not re.search(r"[][]|\.\.\.", t)])  # a synopsis
    except SystemExit:
        pytest.fail(f"{where}\n  quorum data refuses it (see the usage above)", pytrace=False)
    if args.command != "get":
        return
    names = [n for n in args.names if not is_placeholder(n)]
    assert set(names) <= set(registry.corpora), f"{where}: unknown corpus in {names}"
    if any(registry.corpora[n].access == "download" for n in names):
        assert args.to, f"{where}: a corpus that is downloaded needs --to DIR"
    if args.to:
        assert Path(args.to).name not in layouts, f"{where}: --to {args.to} nests each corpus one level too deep"
    if args.revision:
        assert all(registry.corpora[n].access == "hub" for n in names), f"{where}: --revision is for hub datasets"


def test_the_coedit_cluster_path_is_spelled_one_way():
    """The CoEdIT sources file the cluster commands read, wherever a page, config or the registry names it."""
    spellings = set()
    for path in [*pages(), *sorted((REPO / "configs").glob("*.yaml")), REPO / "core" / "corpora.yaml"]:
        spellings |= set(re.findall(r"/mnt/shared/\S*coedit\S*\.jsonl", path.read_text(encoding="utf-8")))
    assert spellings == {"/mnt/shared/data/coedit/coedit_sources.jsonl"}


# -- the sandbox ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("docs-commands")
    mnt = root / "mnt" / "shared"
    checkout = root / "home" / "user" / "quorum"
    upload = root / "tmp" / "ray" / "session" / "runtime_resources" / "working_dir"
    for workdir in (checkout, upload):
        shutil.copytree(REPO / "configs", workdir / "configs")
        for config in (workdir / "configs").glob("*.yaml"):  # the cluster configs' /mnt/shared is the sandbox's
            config.write_text(config.read_text(encoding="utf-8").replace("/mnt/shared", str(mnt)), encoding="utf-8")
    for data in (checkout.parent / "shared" / "data", mnt / "data"):
        for corpus in load_registry().corpora.values():
            for item in corpus.files:
                (data / corpus.layout).mkdir(parents=True, exist_ok=True)
                (data / corpus.layout / item.to).write_text("")
    for directory in ("quorum/runs", "hf"):
        (mnt / directory).mkdir(parents=True, exist_ok=True)
    (root / "empty-hf").mkdir()
    return {"root": root, "mnt": mnt, "checkout": checkout, "upload": upload}


def stage(repos, hf_home: Path) -> None:
    """What `quorum stage-models` leaves in the cache: huggingface_hub's layout with config.json and weights."""
    for repo in repos:
        base = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
        snapshot = base / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text("0" * 40)
        (snapshot / "config.json").write_text("{}")
        (snapshot / "model.safetensors").write_text("")


def remap(token: str, mnt: Path) -> str:
    return token.replace("/mnt/shared", str(mnt))


def touch_named_data(overrides: list[str], mnt: Path, workdir: Path) -> None:
    """Files a command names under /mnt/shared/data are the user's corpora, there as the guide says; an adapter
    under a run root was written by the documented run before it."""
    for override in overrides:
        value = override.split("=", 1)[-1].strip("[]'\"")
        for part in value.split(","):
            path = Path(part.strip())
            if path.is_relative_to(mnt / "data") and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.suffix:
                    path.write_text("")
                else:
                    path.mkdir()
            in_runs = path.is_relative_to(mnt / "quorum" / "runs") or (not path.is_absolute() and path.parts[:1] == ("runs",))
            if in_runs and path.name == "adapter":
                adapter = path if path.is_absolute() else workdir / path
                adapter.mkdir(parents=True, exist_ok=True)
                (adapter / "adapter_config.json").write_text("{}")
                (adapter / "adapter_model.safetensors").write_text("")


def load(where: str, tokens: list[str], sandbox: dict[str, Path], monkeypatch) -> None:
    from jobs.entry import job_module

    mnt, checkout = sandbox["mnt"], sandbox["checkout"]
    tokens = [remap(t, mnt) for t in tokens]
    submitted = tokens[0].rsplit("/", 1)[-1] == "ray"
    if submitted:
        flags = tokens[:tokens.index("--")]
        assert flags[flags.index("--address") + 1] == ADDRESS if "--address" in flags else False, \
            f"{where}: ray job submit needs --address {ADDRESS} (the cluster guide's dashboard address)"
        for flag, value in (("--working-dir", "."), ("--runtime-env-json", "$RUNTIME_ENV")):
            assert flag in flags and flags[flags.index(flag) + 1] == value, f"{where}: needs {flag} {value}"
        assert "--entrypoint-num-cpus" in flags, f"{where}: needs --entrypoint-num-cpus (the driver's CPU)"
        tokens = tokens[tokens.index("--") + 1:]
    name = tokens[0].rsplit("/", 1)[-1]
    if name == "quorum":
        sub, args = tokens[1], tokens[2:]
    else:  # python -m jobs.<job> CONFIG ...
        sub, args = "run", tokens[3:]
    args = [a for a in args if not is_placeholder(a)]
    workdir = sandbox["upload"] if submitted else checkout
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HF_HOME", str(sandbox["root"] / "empty-hf"))  # nothing staged on this machine
    for var in (HOME_ENV, SUBMITTED_JOB_ENV, "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    if sub == "plan":  # the plan itself: it must print its table and find the config fits (exit 0)
        from jobs.plan import main as plan_main

        assert plan_main([str(REPO / a) if a.startswith("k8s/") else a for a in args]) == 0, where
        return
    if sub == "submit":
        from jobs.submit import parse_args, plan

        submission = parse_args(args)
        touch_named_data(submission.overrides, mnt, workdir)
        _stage_for(submission.config, submission.overrides, sandbox)
        plan(submission, job_module, environ={HOME_ENV: str(mnt / "quorum")})
        return
    config, overrides, _flags = split_command(args)
    touch_named_data(overrides, mnt, workdir)
    if submitted:  # the driver runs in the job, with $RUNTIME_ENV's QUORUM_HOME (the cluster guide's)
        monkeypatch.setenv(HOME_ENV, str(mnt / "quorum"))
        monkeypatch.setenv(SUBMITTED_JOB_ENV, "{}")
    if sub == "serve":
        from jobs.serve_grm import ServeConfig as cls
    else:
        cls = job_module(config).Config
    overrides = overrides + path_overrides(cls, config, overrides)
    cfg = load_config(cls, config, overrides)
    if sub == "stage-models":
        return  # it is what stages them
    _stage_for(config, overrides, sandbox)
    ray = getattr(cfg, "ray", None)
    if ray is not None:
        check_models_staged(dataclasses.asdict(cfg), ray.models, config)


def _stage_for(config: str, overrides: list[str], sandbox: dict[str, Path]) -> None:
    """A config whose models live in the shared cache (ray.models.hf_home under /mnt/shared) had them staged there
    with `quorum stage-models`, as the cluster guide has it; a local cache stays empty."""
    from core.config import apply_override

    data = read_yaml(config)
    for override in overrides:
        try:
            apply_override(data, override)
        except ConfigError:
            pass
    hf_home = ((data.get("ray") or {}).get("models") or {}).get("hf_home") or ""
    if hf_home and Path(hf_home).is_relative_to(sandbox["mnt"]):
        from core.config import with_defaults
        from jobs.entry import job_module

        cls = job_module(config).Config if read_yaml(config).get("job") != "serve_grm" else None
        full = with_defaults(cls, {k: v for k, v in data.items() if k != "job"}) if cls else data
        stage(models_by_repo({k: v for k, v in full.items() if k != "ray"}), Path(hf_home))


@pytest.mark.parametrize("where, tokens", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_the_docs_loads_its_config(where, tokens, sandbox, monkeypatch):
    try:
        load(where, tokens, sandbox, monkeypatch)
    except (ConfigError, AssertionError) as exc:
        message = str(exc).replace(str(sandbox["mnt"]), "/mnt/shared").replace(str(sandbox["checkout"]), "CHECKOUT")
        pytest.fail(f"{where}\n  refused: {message}", pytrace=False)
    finally:
        os.environ.pop(SUBMITTED_JOB_ENV, None)
