"""`quorum eval`: score system outputs against sources and references, like `easse evaluate`.

Usage (files hold one sentence, or one document, per line, aligned line by line):

    python -m eval.cli --metrics sari,bleu,fkgl --orig src.txt --sys out.txt --refs ref0.txt ref1.txt \
        [--lowercase/--no-lowercase] [--tokenizer 13a] [--bleu-lowercase/--no-bleu-lowercase] \
        [--sentence-level out.jsonl]

The defaults are those of `easse evaluate` (lowercase=True, tokenizer 13a, BLEU lowercased too), so the
scores match the numbers papers print; `--no-bleu-lowercase` gives cased BLEU (the Python default of
`eval.metrics.text.corpus_bleu`, as in EASSE's own `corpus_bleu`).

The last line printed is one JSON object with the corpus scores (keys as in
`eval.metrics.text`). `--sentence-level` also writes one JSON object per input line. Exit codes:
0 success, 2 bad input (a file missing, empty or not UTF-8, line counts that differ, an unknown
metric or tokenizer, an unwritable --sentence-level path: checked before scoring), 3 a metric
that cannot run here (e.g. LENS without a configured checkpoint).

`main(argv)` takes the arguments without the program name; a leading "eval" (the subcommand
word of `quorum eval ...`) is skipped, so the console script may pass its argv either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.files import read_utf8
from eval.metrics.lens import MetricUnavailable
from eval.metrics.text import METRICS, score_corpus, score_sentences
from eval.metrics.textnorm import TOKENIZERS

EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `quorum eval`."""
    parser = argparse.ArgumentParser(
        prog="quorum eval", description="Score simplification outputs (EASSE-compatible)."
    )
    parser.add_argument("--metrics", default="sari,bleu,fkgl", help=f"comma-separated, from: {','.join(METRICS)}")
    parser.add_argument("--orig", required=True, type=Path, help="source sentences, one per line")
    parser.add_argument("--sys", required=True, type=Path, help="system outputs, one per line")
    parser.add_argument("--refs", nargs="*", default=[], type=Path, help="reference files, one per reference stream")
    parser.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                        help="lowercase before tokenising (SARI and surface metrics; default on)")
    parser.add_argument("--bleu-lowercase", action=argparse.BooleanOptionalAction, default=True,
                        help="lowercase for BLEU (default on, as `easse evaluate`)")
    parser.add_argument("--tokenizer", default="13a", choices=TOKENIZERS, help="tokenizer (default 13a)")
    parser.add_argument("--sentence-level", type=Path, default=None, metavar="OUT.jsonl",
                        help="also write per-sentence scores to this JSONL file")
    return parser


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file without their line endings (a final newline adds no line).

    Raises:
        ValueError: the file is not UTF-8 (naming the file and line).
    """
    text = read_utf8(path)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _load_inputs(args: argparse.Namespace) -> tuple[list[str], list[str], list[list[str]] | None]:
    paths = [args.orig, args.sys, *args.refs]
    for path in paths:
        if not path.is_file():
            problem = "is not a file" if path.exists() else "does not exist"
            raise ValueError(f"input file {path} {problem}")
    texts = [read_lines(p) for p in paths]
    for path, lines in zip(paths, texts):
        if not lines:
            raise ValueError(f"input file {path} is empty (no lines to score)")
    counts = {str(p): len(t) for p, t in zip(paths, texts)}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{p}: {n} lines" for p, n in counts.items())
        raise ValueError(f"line counts differ: {listing}")
    return texts[0], texts[1], (texts[2:] or None)


def _partial_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def _check_writable(path: Path) -> None:
    """Fail before scoring, not after: create the directory and the temporary file the scores go to."""
    try:
        if path.is_dir():
            raise OSError(f"{path} is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        _partial_path(path).touch()
    except OSError as err:
        raise ValueError(f"--sentence-level: cannot write {path}: {err}") from None


def _write_sentence_scores(path: Path, rows: list[dict]) -> None:
    """Written under a temporary name and renamed: a partial file is never mistaken for the scores."""
    partial = _partial_path(path)
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"line": i + 1, **row}) + "\n" for i, row in enumerate(rows))
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Run `quorum eval` with the given arguments; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        argv = argv[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits on --help and on usage errors; report a code instead
        return int(stop.code or 0)
    metrics = [m for m in args.metrics.split(",") if m.strip()]
    options = {"lowercase": args.lowercase, "tokenizer": args.tokenizer, "bleu_lowercase": args.bleu_lowercase}
    try:
        orig, out, refs = _load_inputs(args)
        if args.sentence_level is not None:
            _check_writable(args.sentence_level)
        corpus = score_corpus(metrics, orig, out, refs, **options)
        if args.sentence_level is not None:
            _write_sentence_scores(args.sentence_level, score_sentences(metrics, orig, out, refs, **options))
    except MetricUnavailable as err:
        print(f"quorum eval: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (ValueError, TypeError) as err:
        print(f"quorum eval: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
