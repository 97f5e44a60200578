"""`quorum plan CONFIG [key=value ...] [--cluster FILE]`: what a job config takes on the cluster it is written for,
and whether it can run there, before a GPU is paid for. No Ray, no GPU, seconds.

    quorum plan configs/judge_grpo_cluster.yaml
    quorum plan configs/jury_eval_cluster.yaml --cluster k8s/raycluster.yaml

The cluster is a Ray cluster launcher config (default: the repository's `cluster.yaml`, or the file named by
`QUORUM_CLUSTER`) or a KubeRay manifest (`k8s/raycluster.yaml`, `k8s/rayjob.yaml`, `k8s/rayservice.yaml`):
its node types, their GPUs and GPU model (`core.cluster_nodes`). The plan prints

- stages: per stage, what it places at once (Ray Train workers, Ray Data pools, Serve replicas, the driver), on
  which node type, and how many of those nodes;
- GPU memory: per GPU and phase, every trainer's worker (`train.memory_budget`: a GRPO worker beside its colocated
  rollout engine, a preference / SFT worker's update against its `gpu_type`) and every vLLM engine (Ray Data pools'
  actors, Serve replicas: `train.engine_memory`), the KV cache also as full sequences of the engine's
  `max_model_len`; with optimizer offload, a note with its estimated cost per optimizer step (`train.offload_cost`);
- timeouts: the collective timeout against the worst reward wait of each phase, Serve's request and shutdown
  timeouts;
- storage: where results, checkpoints, adapters and models live, and whether the hub models are staged.

What cannot run is refused, exit 2, naming the keys: the config's own checks (`core.config.load_config`: the
trainers' memory budgets, reward waits, Serve timeouts), a stage no node type can hold, a vLLM engine its GPUs cannot
hold, an adapter above vLLM's largest `max_lora_rank`. `quorum run` and `quorum submit` make the same check (`preflight`)
before any work for a config that names shared storage (a cluster config).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from core.config import ConfigError, load_config
from jobs.placement import gpus_at_once, largest
from jobs.plan_check import CLUSTER_ENV, Report, build_report, cluster_path, refusal


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    if not rows:
        return ""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [f"{title}", "  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[-1]]
    for row in rows:
        lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + str(row[-1]))
    return "\n".join(lines) + "\n"


def render(report: Report, config: str) -> str:
    out = [f"quorum plan: {config} on {report.cluster}\n",
           _table("Stages (each line is held at once; stages run one after another)", ("what", "nodes"),
                  report.stages),
           _table("GPU memory per GPU (GiB)", ("engine / worker", "takes", "of which"), report.memory),
           _table("Timeouts", ("key", "value", "meaning"), report.timeouts),
           _table("Storage", ("key", "path", "holds"), report.storage)]
    text = "\n".join(part for part in out if part)
    return text + "".join(f"note: {n}\n" for n in report.notes)


def load(config: str, overrides: list[str]) -> tuple[Any, list[str]]:
    """The validated config, and notes; a cluster config whose input files live only on the cluster's storage is
    built without the config's own checks (said in a note: the plan's checks still run)."""
    from core.config import apply_override, build, read_yaml, with_defaults
    from jobs.entry import job_module

    module = job_module(config)
    try:
        return load_config(module.Config, config, overrides), []
    except ConfigError as exc:
        if "not found" not in str(exc) and "no such file" not in str(exc):
            raise
        data = read_yaml(config)
        data.pop("job", None)
        data = with_defaults(module.Config, data)
        for override in overrides:
            apply_override(data, override)
        if not (data.get("ray") or {}).get("shared_storage"):
            raise
        return build(module.Config, data), [(f"the config's own checks were skipped: they need the cluster's files "
                                            f"({exc})")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quorum plan", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", metavar="CONFIG.yaml", help="the job's YAML config")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the config's keys")
    parser.add_argument("--cluster", default="", metavar="FILE",
                        help=f"cluster.yaml or a KubeRay manifest (default: ${CLUSTER_ENV}, else the repository's "
                             "cluster.yaml)")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg, notes = load(args.config, args.overrides)
        path = cluster_path(args.cluster)
        report = build_report(cfg, path)
    except ConfigError as exc:
        print(f"quorum plan: refused: {exc}", file=sys.stderr)
        return 2
    report.notes[:0] = notes
    print(render(report, args.config), end="")
    if report.problems:
        print(f"quorum plan: refused: {refusal(report.problems, str(path))}", file=sys.stderr)
        return 2
    unchecked = sum(1 for row in report.memory if row[1] == "-")
    print(f"quorum plan: fits {path}" + (f" ({unchecked} GPU memory figures not checked: see the notes)"
                                        if unchecked else ""))
    return 0



def load_unchecked(path: str) -> Any:
    """The job config of `path` with its defaults, without the checks that need its input files (a cluster config
    names files on the cluster's shared storage)."""
    from core.config import build, read_yaml, with_defaults
    from jobs.entry import job_module

    cls = job_module(path).Config
    data = read_yaml(path)
    data.pop("job", None)
    return build(cls, with_defaults(cls, data))


def markdown_table(paths: list[str]) -> str:
    """docs/cluster.md's table: per config, the group of asks with the most GPUs and their GPUs."""
    from core.resource_fit import describe

    rows = ["| config | the most it holds at once | GPUs |", "|---|---|---|"]
    for path in paths:
        cfg = load_unchecked(path)
        low, high = gpus_at_once(cfg)
        held = " + ".join(describe(ask) for ask in largest(cfg))
        gpus = f"{low:g}" + (f" (up to {high:g} as the reward service scales out)" if high > low else "")
        rows.append(f"| `{path}` | {held} | {gpus} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.exit(main())
