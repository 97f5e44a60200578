"""Generate stage: K generator models x P policies -> one candidate per (source, policy, model).

    rows {id, source}  --expand_policies-->  {id, source, policy}
                       --render_generation_requests-->  + messages_json, sampling_json, model
                       --ChatWorker (actor pool per model)-->  + completion, tokens, ...
                       --finalize_candidates-->  + candidate, generation_error

Each distinct engine gets one actor pool (`pool.concurrency` actors, `pool.num_cpus`/`num_gpus` each,
`pool.batch_size` rows per call). Generators that differ only in sampling (one model decoded K ways, as in the
demo) share the pool of the first of them: the sampling travels with each row, so one loaded model serves them
all instead of K copies competing for the same cores. The output is long-format: one row per candidate.
Failed or empty generations are kept with `generation_error` set, never dropped.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import ray.data

from actors.chat_worker import ChatWorker
from actors.stage_config import LIGHT_CPU, ModelConfig, engine_secrets
from eval.prompts import load_template, prompt_path
from eval.text_clean import clean_simplification


def expand_policies(batch: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """One row per (source, policy)."""
    parts = [batch.assign(policy=p) for p in policies]
    return pd.concat(parts, ignore_index=True)


def render_generation_requests(batch: pd.DataFrame, templates: dict[str, str], model: str,
                               sampling_json: str) -> pd.DataFrame:
    """Render each row's policy prompt (template variable `input` = the source sentence)."""
    loaded = {policy: load_template(prompt_path(name)) for policy, name in templates.items()}
    out = batch.copy()
    out["model"] = model
    out["messages_json"] = [
        json.dumps(loaded[p].render(input=s), ensure_ascii=False) for p, s in zip(batch["policy"], batch["source"])
    ]
    out["sampling_json"] = sampling_json
    return out


def finalize_candidates(batch: pd.DataFrame) -> pd.DataFrame:
    """Clean the answer into `candidate`; name why a row has no usable candidate in `generation_error`."""
    out = batch.drop(columns=["messages_json"])
    out["candidate"] = [clean_simplification(t or "") for t in batch["completion"]]
    errors = []
    for cand, engine_error in zip(out["candidate"], batch["engine_error"]):
        errors.append(f"engine: {engine_error}" if engine_error else ("" if cand else "empty_after_cleaning"))
    out["generation_error"] = errors
    return out


def build_generate_dataset(sources: ray.data.Dataset, generators: list[ModelConfig], templates: dict[str, str],
                           cache_dir: str) -> ray.data.Dataset:
    """The Ray Data plan of the generate stage.

    The policy-expanded input is materialized first, cut into blocks of about one batch: every actor of a pool
    then gets work, and no shuffle task competes with the model pools for CPUs once they exist. The per-model
    branches after it are lazy (they run when the result is consumed).
    """
    policies = list(templates)
    block_rows = min(g.pool.batch_size for g in generators)
    expanded = (sources.map_batches(expand_policies, batch_format="pandas", num_cpus=LIGHT_CPU,
                                    fn_kwargs={"policies": policies})
                .repartition(target_num_rows_per_block=block_rows).materialize())
    per_engine = []
    for members in group_by_engine(generators):
        rendered = [expanded.map_batches(
            render_generation_requests, batch_format="pandas", num_cpus=LIGHT_CPU,
            fn_kwargs={"templates": templates, "model": gen.name, "sampling_json": gen.sampling.to_json()},
        ) for gen in members]
        requests = rendered[0].union(*rendered[1:]) if len(rendered) > 1 else rendered[0]
        lead = members[0]
        completed = requests.map_batches(
            ChatWorker, batch_format="pandas",
            fn_constructor_kwargs={"spec": dataclasses.asdict(lead.engine), "secrets": engine_secrets(lead.engine),
                                   "cache_dir": cache_dir},
            **lead.pool.map_batches_kwargs(lead.name),
        )
        per_engine.append(completed.map_batches(finalize_candidates, batch_format="pandas", num_cpus=LIGHT_CPU))
    return per_engine[0].union(*per_engine[1:]) if len(per_engine) > 1 else per_engine[0]


def group_by_engine(generators: list[ModelConfig]) -> list[list[ModelConfig]]:
    """Generators grouped by identical engine spec, in first-appearance order."""
    groups: dict[str, list[ModelConfig]] = {}
    for gen in generators:
        groups.setdefault(json.dumps(dataclasses.asdict(gen.engine), sort_keys=True), []).append(gen)
    return list(groups.values())


def summarize_generation(df: pd.DataFrame, seconds: float) -> dict:
    """Per-stage numbers for the manifest and the console: rows, failures, tokens, throughput."""
    failed = int((df["generation_error"] != "").sum())
    tokens = int(df["completion_tokens"].sum())
    return {
        "rows_out": len(df), "failed": failed, "cached": int(df["cached"].sum()),
        "prompt_tokens": int(df["prompt_tokens"].sum()), "completion_tokens": tokens,
        "actor_seconds": round(float(df["worker_seconds"].sum()), 3),
        "seconds": round(seconds, 3), "rows_per_s": round(len(df) / seconds, 3) if seconds else None,
        "tokens_per_s": round(tokens / seconds, 3) if seconds else None,
    }
