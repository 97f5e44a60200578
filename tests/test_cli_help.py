"""`--help` on every `quorum` command: the commands come from the CLI's own table (`jobs.cli.COMMANDS`) and the
subcommands each one's usage line lists, so a command added to the table is covered without touching this file.
`--help` / `-h` prints a usage line and exits 0; an unknown flag prints the usage line and exits 2. Plus what the
parsers must keep: `key=value` overrides and flags in any order, and `quorum run CONFIG --help` listing the keys
of the job page's table."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]


def help_text(argv: list[str], capsys) -> str:
    assert main([*argv, "--help"]) == 0, argv
    return capsys.readouterr().out


def command_lines() -> list[tuple[str, ...]]:
    """Every command of the table, and each subcommand its parser lists (`quorum data {list,get,mirror} ...`)."""
    found = []
    for name in COMMANDS:
        found.append((name,))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main([name, "--help"])
        usage = out.getvalue().split("\n\n", 1)[0]
        for group in re.findall(r"\{([\w,-]+)\} \.\.\.", usage):
            found += [(name, sub) for sub in group.split(",")]
    return found


COMMAND_LINES = command_lines()


def test_the_table_is_what_quorum_help_lists(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: quorum ")
    for name, command in COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(command.summary)}$", out, re.MULTILINE), name
    assert {("data", "get"), ("data", "list"), ("human", "export"), ("human", "import")} <= set(COMMAND_LINES)


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits_0(argv, flag, capsys):
    assert main([*argv, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: quorum {' '.join(argv)}"), out[:200]


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_an_unknown_flag_prints_the_usage_line_and_exits_2(argv, capsys):
    assert main([*argv, "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"^usage: quorum {re.escape(' '.join(argv))}", err, re.MULTILINE), err[-500:]
    assert f"quorum {' '.join(argv)}: error: " in err, err[-500:]


def test_bare_quorum_and_an_unknown_command_exit_2(capsys):
    assert main([]) == 2
    assert "usage: quorum" in capsys.readouterr().err
    assert main(["frob"]) == 2
    assert "invalid choice: 'frob'" in capsys.readouterr().err


def test_the_console_script_help_exits_0():
    """The installed `quorum` (what a user types), not the function: `run --help` and `run -h` once exited 2."""
    script = Path(sys.executable).with_name("quorum")
    for argv in (["run", "--help"], ["run", "-h"], ["data", "get", "--help"]):
        proc = subprocess.run([str(script), *argv], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: quorum {argv[0]}"), proc.stderr[-1000:]


def test_run_config_help_lists_the_keys_of_the_job_page_table(capsys):
    """The rows are the job page's (docs/config_source.py reads them for both): every key, with its type and
    default, in the page's order."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_source_for_test", REPO / "docs" / "config_source.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    out = help_text(["run", str(REPO / "configs" / "demo.yaml")], capsys)
    assert out.startswith("usage: quorum run") and "keys of the policy_simplify job" in out
    assert "docs/jobs/policy-simplify.md" in out
    rows = reader.config_rows("jobs.policy.simplify:Config")
    listed = re.findall(r"^  (\S+?):?(?:  |$)", out.split("keys of the policy_simplify job", 1)[1], re.MULTILINE)
    assert listed == [row.key for row in rows]
    split = next(row for row in rows if row.key == "evaluate.split")
    assert f"  evaluate.split  {split.type}  = {split.default}" in out


def test_run_config_help_with_an_unreadable_config_still_prints_the_usage(tmp_path, capsys):
    out = help_text(["run", str(tmp_path / "nope.yaml")], capsys)
    assert out.startswith("usage: quorum run") and "nope.yaml: cannot list its keys" in out


def test_run_keeps_overrides_and_flags_in_any_order(monkeypatch):
    import jobs.cli

    calls = []
    monkeypatch.setattr(jobs.cli, "run_job", lambda module, argv: calls.append((module.__name__, argv)) or 0)
    config = str(REPO / "configs" / "demo.yaml")
    assert main(["run", config, "--no-resume", "data.limit=8", "--verbose", "generate.0.sampling.seed=-1"]) == 0
    assert calls == [("jobs.policy.simplify",
                      [config, "data.limit=8", "generate.0.sampling.seed=-1", "--no-resume", "--verbose"])]


def test_run_refuses_a_word_that_is_no_override(capsys):
    assert main(["run", str(REPO / "configs" / "demo.yaml"), "data.limit"]) == 2
    assert "an override is key=value, got 'data.limit'" in capsys.readouterr().err


def test_submit_flags_with_and_without_equals():
    from jobs.submit import parse_args

    sub = parse_args(["configs/demo_scores.yaml", "--address=http://h:8265", "data.limit=4", "--env", "A=1",
                      "--env=B=2", "--entrypoint-num-cpus", "0.5", "--no-resume", "--follow", "--no-check"])
    assert (sub.config, sub.address, sub.env, sub.num_cpus) == ("configs/demo_scores.yaml", "http://h:8265",
                                                                {"A": "1", "B": "2"}, 0.5)
    assert sub.overrides == ["data.limit=4", "run.resume=false"] and sub.follow and not sub.check_config


def test_serve_print_config_keeps_both_spellings(tmp_path, capsys):
    grm = str(REPO / "configs" / "grm.yaml")
    assert main(["serve", grm, "--print-config", "serve.port=8124"]) == 0  # the override, not a file name
    assert "port: 8124" in capsys.readouterr().out
    out = tmp_path / "serve.yaml"
    assert main(["serve", grm, f"--print-config={out}", "serve.port=8125"]) == 0
    assert "port: 8125" in out.read_text()
