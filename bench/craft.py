"""Throughput of CRAFT's constraint tools on CORD (paper 002), and the search's cost per solved instance.

    python -m bench.craft [--data ../shared/data] [--repeats 3] [--run runs/craft/craft_demo]

`craft_tool_checks_per_s`: every gold call of the 500 CORD instances (1,051 calls: one per constraint, two for
a word-count range) is parsed from its string and checked against the instance's original text with the
reference counting rules (`eval.craft.text.REFERENCE`), i.e. what one tool-feedback round costs the search.
Parsing is included; reading the files is not. The NLTK tokenizer is loaded before timing. Best of
`--repeats` runs. Word counts dominate: NLTK's tokenizer takes a few milliseconds on a 700-token text, the
other checks a fraction of that.

`craft_search_model_calls_per_solved`: LLM calls the TG-MCTS search sent to a model (planner, reviser, E.8
feedback; request-cache hits excluded) summed over the constrained instances of a finished `jobs/craft` run,
divided by the instances whose search answer meets every gold constraint (`eval.craft.results.calls_per_solved`).
It is read from that run's `runs` stage (`--run`, default `runs/craft/craft_demo`, the demo's run directory), not
measured here: a search costs minutes of model time. With no such run the line is `info ... pending`; with no
solved instance the value is `inf`.

Output lines:

    bench craft_tool_checks_per_s = X
    bench craft_search_model_calls_per_solved = Y
    info craft_search_from = RUN_DIR (N solved of M instances, C calls)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eval.craft.cord import CordRow, read_cord
from eval.craft.text import word_count
from eval.craft.tools import check

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


def search_model_calls_per_solved(run_dir: Path) -> tuple[float, int, int, int] | None:
    """(calls per solved instance, solved, instances, calls) of the run's TG-MCTS rows; None without such a run."""
    import pandas as pd

    from eval.craft.results import calls_per_solved, constraint_checks

    if not (run_dir / "runs").exists():
        return None
    runs = pd.read_parquet(run_dir / "runs")
    runs = runs[(runs["system"] == "mcts") & (runs["level"] > 0)]
    if runs.empty:
        return None
    checks = constraint_checks(runs)
    solved = int(checks.groupby("id")["satisfied"].all().sum())
    return calls_per_solved(runs, checks, "mcts"), solved, runs["id"].nunique(), int(runs["llm_calls"].sum())


def main(argv: list[str] | None = None) -> int:
    """Time the tool checks over CORD and print the `bench` lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding cord/")
    parser.add_argument("--repeats", type=int, default=3, help="passes over all calls; the best is reported")
    parser.add_argument("--run", type=Path, default=Path("runs/craft/craft_demo"),
                        help="a finished jobs/craft run directory (for the search's calls per solved instance)")
    args = parser.parse_args(argv)
    folder = args.data / "cord"
    if not folder.is_dir():
        raise SystemExit(f"bench: {folder} not found (pass --data DIR holding cord/)")
    rows = read_cord(folder)
    checks, seconds = measure(rows, args.repeats)
    print(f"info craft_tool_checks = {checks} over {len(rows)} instances")
    print(f"bench craft_tool_checks_per_s = {checks / seconds:.1f}")
    search = search_model_calls_per_solved(args.run)
    if search is None:
        print(f"info craft_search_model_calls_per_solved = pending (no finished craft run with mcts at {args.run})")
    else:
        per_solved, solved, instances, calls = search
        print(f"bench craft_search_model_calls_per_solved = {per_solved:.1f}")
        print(f"info craft_search_from = {args.run} ({solved} solved of {instances} instances, {calls} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
