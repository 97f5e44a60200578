"""Throughput of corpus SARI, BLEU and FKGL on the TurkCorpus tune set (2000 sentences, 8 references).

    python -m bench.metrics [--data ../shared/data] [--repeats 3]

Each metric scores the turk.0 references as the system output against the sources and turk.1-7
as references (FKGL reads only the outputs). Timings include tokenisation: sacrebleu's tokenizer
cache and our syllable cache are cleared before every run. The best of `--repeats` runs is reported, as lines

    bench sari_sentences_per_s = X
    bench bleu_sentences_per_s = X
    bench fkgl_sentences_per_s = X
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eval.metrics.sari import corpus_sari
from eval.metrics.text import corpus_bleu, corpus_fkgl, count_syllables

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file without line endings."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def load_turkcorpus(data: Path) -> tuple[list[str], list[list[str]]]:
    """Sources and the 8 reference streams of the TurkCorpus tune set."""
    folder = data / "turkcorpus"
    if not folder.is_dir():
        raise SystemExit(f"bench: {folder} not found (pass --data DIR holding turkcorpus/)")
    orig = read_lines(folder / "tune.8turkers.tok.norm")
    refs = [read_lines(folder / f"tune.8turkers.tok.turk.{i}") for i in range(8)]
    return orig, refs


def _clear_caches() -> None:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    Tokenizer13a.__call__.cache_clear()
    count_syllables.cache_clear()


def measure(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls of fn, each after clearing the caches."""
    best = float("inf")
    for _ in range(repeats):
        _clear_caches()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the three timings and print one `bench ... = X` line per metric."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding turkcorpus/")
    parser.add_argument("--repeats", type=int, default=3, help="runs per metric; the best is reported")
    args = parser.parse_args(argv)
    orig, refs = load_turkcorpus(args.data)
    system, others = refs[0], refs[1:]
    timings = {
        "sari": measure(lambda: corpus_sari(orig, system, others), args.repeats),
        "bleu": measure(lambda: corpus_bleu(system, others), args.repeats),
        "fkgl": measure(lambda: corpus_fkgl(system), args.repeats),
    }
    for name, seconds in timings.items():
        print(f"bench {name}_sentences_per_s = {len(orig) / seconds:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
