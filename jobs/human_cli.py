"""`quorum human export|import`: the human-evaluation round trip of papers 000 (Table 4), 001 (§3.2, Fig. 1) and
003 (Table 7).

    quorum human export runs/policy_simplify/<run-id> --out human/ --n 60 --seed 0
    # give human/sheet.csv to each annotator (never key.csv); each returns it with the `rating` column filled 1-5
    quorum human import human/ alice.csv bob.csv carol.csv

`export` reads a finished run: a policy_simplify run's evaluation outputs (`eval_generate`: every system's output
per source; Table 4), a jury_eval run's synthetic pairs (`scores`: each writer's simplification with its size
and jury score; Fig. 1), or a policy_grpo run's validation answers (`train/run/val_answers`, written by
`grpo.val_metric: vs_baseline`: the trained policy's answer and the base model's per held-out prompt, at the best
adapter's step; Table 7's second stage, where humans compare the two). It writes `sheet.csv` (blind, shuffled) and `key.csv` (what the item ids mean). `import`
checks every filled sheet against the key (exit 2 naming the file, line and column on any bad rating) and writes
`human_eval.md` and `human_items.csv`: the mean rating per system with 95% CIs, and with two or more annotators
ICC(2,1), plus Spearman of the mean human rating with the key's numeric columns (size_b, jury); with the two
systems of a policy_grpo export, Table 7's win / tie / loss of `trained` against `base` from the ratings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from core.config import ConfigError
from core.files import json_object, read_utf8
from eval.judging import human_eval as he


def run_outputs(run_dir: Path) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """(outputs with id, source, system, output, extra key columns) of a finished run directory."""
    if (run_dir / "eval_generate").is_dir():  # policy_simplify: vanilla, trained, extra adapters
        df = pd.read_parquet(run_dir / "eval_generate")
        out = df.assign(system=df["model"], output=df["candidate"].fillna(""))
        return out[out["generation_error"] == ""], ("policy",)
    if (run_dir / "scores").is_dir():  # jury_eval: the synthetic set's writers
        df = pd.read_parquet(run_dir / "scores")
        df = df[(df["set"] == "synthetic") & (df["generation_error"] == "")]
        return df.assign(system=df["model"], output=df["candidate"]), ("size_b", "jury")
    if (run_dir / "train" / "run" / "val_answers").is_dir():  # policy_grpo: trained vs base per val prompt
        return grpo_answers(run_dir / "train" / "run"), ("grm_margin",)
    raise ConfigError(f"{run_dir}: not a policy_simplify run (eval_generate/), a jury_eval run (scores/) or a "
                      "policy_grpo run with vs_baseline validation (train/run/val_answers/); export reads a finished "
                      "run directory")


def grpo_answers(train_run: Path) -> pd.DataFrame:
    """The validation answers of the best adapter's step (the last check without best.json) as two systems per
    prompt: `trained` and `base` (the LoRA-disabled initial policy). Failed judgments stay in: humans rate them."""
    best = train_run / "best_adapter" / "best.json"
    steps = sorted((train_run / "val_answers").glob("step_*"))
    if not steps:
        raise ConfigError(f"{train_run / 'val_answers'}: no validation answers yet (is the run finished?)")
    folder = steps[-1]
    if best.is_file():
        folder = train_run / "val_answers" / f"step_{json.loads(best.read_text())['step']:06d}"
        if not folder.is_dir():
            raise ConfigError(f"{folder}: the best adapter's validation answers are missing")
    records = [json_object(line, f"{path}: line {number}", ConfigError) for path in sorted(folder.glob("rank*.jsonl"))
               for number, line in enumerate(read_utf8(path, ConfigError).split("\n"), 1) if line.strip()]
    rows = []
    for r in records:
        source = "\n\n".join(m["content"] for m in json.loads(r["prompt_messages"]) if m["role"] == "user")
        # the margin is the trained answer's over the base answer: the base's is its negative
        margin = r["grm_margin"] if r["grm_margin"] is not None else float("nan")
        rows += [{"id": r["id"], "source": source, "system": "trained", "output": r["answer"], "grm_margin": margin},
                 {"id": r["id"], "source": source, "system": "base", "output": r["baseline_answer"],
                  "grm_margin": -margin}]
    return pd.DataFrame(rows)


def export(args) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    if args.n < 0:
        raise ConfigError(f"--n: must be >= 0 (0 = all sources), got {args.n}")
    outputs, keep = run_outputs(run_dir)
    try:
        sheet, key = he.make_sheet(outputs, args.n, args.seed, keep=keep)
    except ValueError as exc:
        raise ConfigError(f"--n: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (("key.csv", key), ("sheet.csv", sheet)):  # temp name, then rename: never half a file
        tmp = out / f".{name}.tmp"
        table.to_csv(tmp, index=False)
        tmp.replace(out / name)
    print(f"quorum: {len(sheet)} items ({key['id'].nunique()} sources x {key['system'].nunique()} systems): "
          f"{out / 'sheet.csv'} for annotators, {out / 'key.csv'} kept back")
    return 0


def import_(args) -> int:
    folder = Path(args.dir)
    key_path = folder / "key.csv"
    if not key_path.is_file():
        raise ConfigError(f"{key_path}: no key (run `quorum human export` first)")
    key = pd.read_csv(key_path, dtype={"item_id": str, "id": str, "system": str})
    stems = [Path(p).stem for p in args.ratings]
    if len(set(stems)) != len(stems):
        raise ConfigError(f"ratings: file names {stems} repeat a stem; each annotator's file needs its own name")
    try:
        ratings = pd.concat([he.read_ratings(p, key) for p in args.ratings], ignore_index=True)
    except he.RatingsError as exc:
        raise ConfigError(str(exc)) from None
    items = he.per_item(key, ratings)
    against = tuple(c for c in ("size_b", "jury", "grm_margin") if c in items.columns)
    means = he.system_means(items, args.n_boot, args.seed)
    stats = he.statistics(items, against, args.n_boot, args.seed)
    versus = he.pairwise_outcomes(items, "trained", "base") if set(key["system"]) == {"trained", "base"} else None
    counts = (f"{len(ratings)} ratings, {ratings['annotator'].nunique()} annotators, {key['id'].nunique()} sources; "
              "95% CIs by bootstrap over sources.")
    text = ["# Human evaluation", "", counts, "", "## Mean rating per system (1-5; normalised = (mean - 1) / 4)",
            "", means.to_markdown(index=False, floatfmt=".3f"), ""]
    if versus is not None:
        text += ["## Trained vs base policy per prompt (MENLO Table 7: win = higher mean human rating)", "",
                 versus.to_markdown(index=False, floatfmt=".3f"), ""]
    if len(stats):
        text += ["## Agreement", "", stats.to_markdown(index=False, floatfmt=".3f"), ""]
    items.to_csv(folder / "human_items.csv", index=False)
    (folder / "human_eval.md").write_text("\n".join(text), encoding="utf-8")
    print("\n".join(text))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quorum human", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(parsers=sub.choices)  # an unknown flag is reported with its subcommand's usage
    exp = sub.add_parser("export", help="blind rating sheet and its key from a finished run")
    exp.add_argument("run_dir")
    exp.add_argument("--out", required=True)
    exp.add_argument("--n", type=int, default=60, help="sources to sample (paper 000: 60; 0 = all)")
    exp.add_argument("--seed", type=int, default=0)
    imp = sub.add_parser("import", help="filled sheets -> human_eval.md")
    imp.add_argument("dir", help="the export folder (holds key.csv)")
    imp.add_argument("ratings", nargs="+", help="filled sheets, one per annotator (named by file stem)")
    imp.add_argument("--n-boot", type=int, default=1000)
    imp.add_argument("--seed", type=int, default=0)
    args, extra = parser.parse_known_args(argv)
    if extra:
        args.parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return export(args) if args.command == "export" else import_(args)
