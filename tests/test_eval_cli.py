"""`quorum eval` command line: called as a function and as `python -m eval.cli`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval.cli import main
from eval.textmetrics import score_corpus

REPO = Path(__file__).resolve().parents[1]
ORIG = ["The cat perched on the mat.", "He came and he saw the town.", "It is big."]
SYS = ["The cat sat on the mat.", "He came. He saw the town.", "It is big."]
REFS = [["The cat sat on the mat.", "He came. He saw the city.", "It is large."],
        ["A cat is on the mat.", "He came and saw the town.", "It is big."]]


@pytest.fixture()
def files(tmp_path):
    def write(name, lines):
        path = tmp_path / name
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write("orig.txt", ORIG), write("sys.txt", SYS), [write(f"ref{i}.txt", r) for i, r in enumerate(REFS)]


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_main_prints_corpus_scores_as_the_last_line(files, capsys):
    orig, out, refs = files
    code = main(["--metrics", "sari,bleu,fkgl", "--orig", str(orig), "--sys", str(out), "--refs", *map(str, refs)])
    assert code == 0
    printed = last_json(capsys.readouterr().out)
    assert printed == pytest.approx(score_corpus(["sari", "bleu", "fkgl"], ORIG, SYS, REFS))
    assert set(printed) == {"sari", "sari_add", "sari_keep", "sari_del", "bleu", "fkgl"}


def test_options_reach_the_metrics(files, capsys):
    orig, out, refs = files
    argv = ["eval", "--metrics", "sari,bleu", "--orig", str(orig), "--sys", str(out), "--refs", *map(str, refs),
            "--no-lowercase", "--tokenizer", "none", "--bleu-lowercase"]
    assert main(argv) == 0  # a leading "eval" (the subcommand word) is accepted
    expected = score_corpus(["sari", "bleu"], ORIG, SYS, REFS, lowercase=False, tokenizer="none", bleu_lowercase=True)
    assert last_json(capsys.readouterr().out) == pytest.approx(expected)


def test_sentence_level_file(files, tmp_path, capsys):
    orig, out, refs = files
    target = tmp_path / "scores" / "sentences.jsonl"
    argv = ["--metrics", "sari,exact_copy", "--orig", str(orig), "--sys", str(out), "--refs", *map(str, refs),
            "--sentence-level", str(target)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert [r["exact_copy"] for r in rows] == [0.0, 0.0, 1.0]
    assert set(rows[0]) == {"line", "sari", "sari_add", "sari_keep", "sari_del", "exact_copy"}


def test_mismatched_line_counts_exit_2_naming_files_and_counts(files, tmp_path, capsys):
    orig, out, refs = files
    short = tmp_path / "short.txt"
    short.write_text("one line\n", encoding="utf-8")
    code = main(["--metrics", "sari", "--orig", str(orig), "--sys", str(short), "--refs", *map(str, refs)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{orig}: 3 lines" in err and f"{short}: 1 lines" in err


def test_other_bad_inputs_exit_2(files, tmp_path, capsys):
    orig, out, refs = files
    assert main(["--orig", str(orig), "--sys", str(tmp_path / "missing.txt"), "--refs", str(refs[0])]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err
    assert main(["--metrics", "sari,rouge", "--orig", str(orig), "--sys", str(out), "--refs", str(refs[0])]) == 2
    assert "unknown metric(s) rouge" in capsys.readouterr().err
    assert main(["--metrics", "sari", "--orig", str(orig), "--sys", str(out)]) == 2
    assert "need references" in capsys.readouterr().err
    assert main(["--orig", str(orig)]) == 2  # argparse usage error: --sys missing


def test_unconfigured_lens_exits_3(files, monkeypatch, capsys):
    monkeypatch.delenv("QUORUM_LENS_PATH", raising=False)
    orig, out, refs = files
    assert main(["--metrics", "lens", "--orig", str(orig), "--sys", str(out), "--refs", str(refs[0])]) == 3
    assert "LENS is not configured" in capsys.readouterr().err


def test_python_dash_m(files):
    orig, out, refs = files
    proc = subprocess.run(
        [sys.executable, "-m", "eval.cli", "--metrics", "sari,fkgl", "--orig", str(orig), "--sys", str(out),
         "--refs", *map(str, refs)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout) == pytest.approx(score_corpus(["sari", "fkgl"], ORIG, SYS, REFS))
