"""`quorum curve`: paper 000 Fig. 3, SARI against the number of training pairs, from one finished run per size.

    for n in 1000 2000 4000 7000; do
        quorum run configs/policy_lexical_cluster.yaml train.max_rows=$n run.id=size$n
    done
    quorum curve runs/policy_simplify/size1000 runs/policy_simplify/size2000 ... --out fig3/

Each run contributes its trained system's SARI with the 95% bootstrap CI and the paired gain over its own vanilla
(`results`), at the number of training rows its `train` stage used. Writes `curve.md` (the table) and `curve.png`
(SARI with CI whiskers against training rows, vanilla as a dashed line). A run without a finished `results` stage
is an error naming it, never a silently shorter curve.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from core.config import ConfigError


def run_point(run_dir: Path) -> dict:
    """One point of the curve: training rows and the trained / vanilla SARI of `run_dir`."""
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(f"{run_dir}: no manifest.json (not a run directory)")
    stages = json.loads(manifest_path.read_text())["stages"]
    for stage in ("train", "results"):
        if stages.get(stage, {}).get("status") != "complete":
            raise ConfigError(f"{run_dir}: stage {stage!r} is not complete; finish the run first")
    results = pd.read_parquet(run_dir / "results").set_index("system")
    if "trained" not in results.index:
        raise ConfigError(f"{run_dir}: results have no 'trained' system")
    trained, vanilla = results.loc["trained"], results.loc["vanilla"]
    return {"run": run_dir.name, "train_rows": int(stages["train"]["summary"]["train_pairs"]),
            "sari": float(trained["sari"]), "sari_lo": float(trained["sari_lo"]), "sari_hi": float(trained["sari_hi"]),
            "gain": float(trained["sari_gain"]), "gain_lo": float(trained["sari_gain_lo"]),
            "gain_hi": float(trained["sari_gain_hi"]), "vanilla_sari": float(vanilla["sari"])}


def plot(curve: pd.DataFrame) -> bytes:
    from eval.report_html import _figure_png, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar(curve["train_rows"], curve["sari"], yerr=[curve["sari"] - curve["sari_lo"],
                                                           curve["sari_hi"] - curve["sari"]],
                marker="o", capsize=3, label="trained")
    ax.plot(curve["train_rows"], curve["vanilla_sari"], linestyle="--", color="gray", label="vanilla")
    ax.set_xlabel("training rows")
    ax.set_ylabel("SARI")
    ax.set_title("SARI vs training data size (paper 000 Fig. 3)")
    ax.legend()
    return _figure_png(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quorum curve", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="finished policy_simplify run directories, one per training size")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    curve = pd.DataFrame([run_point(Path(r)) for r in args.runs]).sort_values("train_rows", ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = curve.to_markdown(index=False, floatfmt=".2f")
    (out / "curve.md").write_text("# SARI vs training rows (paper 000 Fig. 3)\n\n" + table + "\n", encoding="utf-8")
    (out / "curve.png").write_bytes(plot(curve))
    print(table)
    return 0
