"""Throughput of CRAFT's constraint tools on CORD (paper 002), and the search's cost per solved instance.

    python -m bench.craft [--data ../shared/data] [--repeats 3]

`craft_tool_checks_per_s`: every gold call of the 500 CORD instances (1,051 calls: one per constraint, two for
a word-count range) is parsed from its string and checked against the instance's original text with the
reference counting rules (`eval.craft_text.REFERENCE`), i.e. what one tool-feedback round costs the search.
Parsing is included; reading the files is not. The NLTK tokenizer is loaded before timing. Best of
`--repeats` runs. Word counts dominate: NLTK's tokenizer takes a few milliseconds on a 700-token text, the
other checks a fraction of that.

`craft_search_model_calls_per_solved` (model calls the TG-MCTS search makes per instance whose constraints
all hold) is not measured yet: the search is not in the tree. :func:`search_model_calls_per_solved` is the
hook for it; until it is filled, the line is printed as `info ... pending`, never as a number.

Output lines:

    bench craft_tool_checks_per_s = X
    info craft_search_model_calls_per_solved = pending (TG-MCTS not implemented yet)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eval.cord import CordRow, read_cord
from eval.craft_text import word_count
from eval.craft_tools import check

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def check_all(rows: list[CordRow]) -> int:
    """Check every gold call of every row against its original text; return how many checks ran."""
    done = 0
    for row in rows:
        for call in row.gold_calls:
            check(call, row.text, row.text)
            done += 1
    return done


def measure(rows: list[CordRow], repeats: int) -> tuple[int, float]:
    """Number of checks and the best wall time of `repeats` passes over all of them."""
    word_count("Warm up the tokenizer.")  # its first use imports NLTK (about a second)
    best, checks = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        checks = check_all(rows)
        best = min(best, time.perf_counter() - start)
    return checks, best


def search_model_calls_per_solved(rows: list[CordRow]) -> float | None:
    """HOOK, to be filled when TG-MCTS lands: model calls (planner + reviser + feedback) per solved instance.

    Run the search on ``rows`` with the demo models, count every model call, and divide by the number of
    instances whose final revision satisfies all gold calls. Returns None until then, and main() prints
    no number for it.
    """
    return None


def main(argv: list[str] | None = None) -> int:
    """Time the tool checks over CORD and print the `bench` lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding cord/")
    parser.add_argument("--repeats", type=int, default=3, help="passes over all calls; the best is reported")
    args = parser.parse_args(argv)
    folder = args.data / "cord"
    if not folder.is_dir():
        raise SystemExit(f"bench: {folder} not found (pass --data DIR holding cord/)")
    rows = read_cord(folder)
    checks, seconds = measure(rows, args.repeats)
    print(f"info craft_tool_checks = {checks} over {len(rows)} instances")
    print(f"bench craft_tool_checks_per_s = {checks / seconds:.1f}")
    per_solved = search_model_calls_per_solved(rows)
    if per_solved is None:
        print("info craft_search_model_calls_per_solved = pending (TG-MCTS not implemented yet)")
    else:
        print(f"bench craft_search_model_calls_per_solved = {per_solved:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
