"""AgentSimp (paper 004): multi-agent document simplification, all four configurations in one run, then evaluation.

Local (embedded default: local Ray, SmolLM2-135M-Instruct as every role and every jury judge):

    quorum run configs/agentsimp_demo.yaml
    python -m jobs.agentsimp.simplify configs/agentsimp_demo.yaml agentsimp.configurations=[pl_iterative] run.id=pl_only

On a cluster (a vLLM backbone on GPUs, the jury on another pool):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" \\
        -- quorum run configs/agentsimp_cluster.yaml

One document, no cluster: `quorum simplify-doc FILE [--html OUT]` (jobs/simplify_doc_cli.py).

Stages (Parquet under <run.root>/agentsimp/<run-id>/, each skipped when complete with the same inputs):
documents (.txt/.md/.html files or a JSONL corpus -> paragraphs; eval.agentsimp.docs) -> runs (Ray Data rows =
documents; `actors.agentsimp_worker.AgentSimpWorker` pools run every configuration's schedule in lockstep, shared
calls once, through the request cache, and Table 2's single-prompt LLM baselines (templates 1-3); one row per
document x configuration or baseline with every stage, window and call)
-> stages (every text per document, paragraph and window) -> calls (one row per LLM call) -> jury (document-level
LLM jury on each configuration's output: coherence, simplicity, faithfulness; actors.jury, score format) -> scores
(SARI, D-SARI, FKGL, BERTScore, compression, summary check per document x configuration x stage) -> table (means
with bootstrap CIs, paper Tables 2-4 rows) -> costs (calls, tokens, seconds per configuration and step). Then
report.md / report.html and W&B tables.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pandas as pd
import pyarrow as pa

from core.jobrun import open_run, record_stages
from core.ray_env import init_ray
from core.runstore import RunStore, write_table
from eval.agentsimp.docs import read_corpus, read_documents
from eval.agentsimp.records import call_rows, cost_table, document_row, score_rows, score_table, stage_rows
from jobs.agentsimp.config import Config, worker_kwargs
from jobs.entry import entry

log = logging.getLogger("quorum.agentsimp")
JOB = "agentsimp"
__all__ = ["Config", "main"]


# ---------------------------------------------------------------------------------------------------------------
# Stages


def load_documents(cfg: Config) -> pd.DataFrame:
    docs = read_documents(cfg.inputs.files(), cfg.inputs.line_paragraphs)
    if cfg.inputs.references_path:
        refs = {d.id: d.references for d in read_corpus(cfg.inputs.references_path, cfg.inputs.line_paragraphs)}
        docs = tuple(dataclasses.replace(d, references=d.references or refs.get(d.id, ())) for d in docs)
    if cfg.inputs.limit:
        docs = docs[: cfg.inputs.limit]
    return pd.DataFrame([document_row(d) for d in docs])


def simplify(cfg: Config, docs: pd.DataFrame, cache_dir: str) -> pd.DataFrame:
    """Every document through every configuration on the backbone's actor pool (documents = Ray Data rows)."""
    import ray.data

    from actors.agentsimp_worker import AgentSimpWorker

    init_ray(cfg.ray)
    size = max(1, cfg.backbone.pool.batch_size)
    ds = ray.data.from_pandas([docs.iloc[i:i + size] for i in range(0, len(docs), size)])
    # a block is one lockstep run of `pool.batch_size` documents through every configuration and emits nothing until
    # all of them are done; on a slow or shared engine (a 72B backbone, iterative windows one after another) that can
    # outlast Ray Data's 30-minute no-progress limit, so the limit is off here (each engine call has its own timeout)
    ds.context.execution_no_progress_timeout_s = -1
    done = ds.map_batches(AgentSimpWorker, batch_format="pandas", fn_constructor_kwargs=worker_kwargs(cfg, cache_dir),
                          **cfg.backbone.pool.map_batches_kwargs())
    order = {name: k for k, name in enumerate(cfg.agentsimp.configurations)}
    out = done.to_pandas()
    return out.sort_values(["doc_id", "config"], key=lambda s: s.map(order) if s.name == "config" else s,
                           ignore_index=True)


def judge(cfg: Config, docs: pd.DataFrame, runs: pd.DataFrame, cache_dir: str) -> pd.DataFrame:
    import ray.data

    from actors.jury import build_jury_dataset

    init_ray(cfg.ray)
    source = dict(zip(docs["doc_id"], docs["source"]))
    items = pd.DataFrame({"id": runs["doc_id"], "policy": runs["config"], "model": runs["config"],
                          "source": runs["doc_id"].map(source), "candidate": runs["final"], "generation_error": ""})
    block = min(j.pool.batch_size for j in cfg.evaluation.jury.judges)
    ds = ray.data.from_pandas([items.iloc[i:i + block] for i in range(0, len(items), block)])
    return build_jury_dataset(ds, cfg.evaluation.jury, cache_dir).to_pandas()


def jury_scores(jury: pd.DataFrame | None) -> dict[tuple[str, str], dict[str, float]]:
    """(doc, config) -> {"jury_<judge>": score, "jury": mean of the parsed judge scores}."""
    if jury is None or jury.empty:
        return {}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for row in jury.itertuples():
        if row.score is not None and row.score == row.score:
            out.setdefault((row.id, row.policy), {})[f"jury_{row.judge}"] = float(row.score)
    for by in out.values():
        by["jury"] = sum(by.values()) / len(by)
    return out


def bertscore_fn(cfg: Config, stages: pd.DataFrame, refs: dict[str, list[str]]):
    """(candidate, reference) -> F1, computed in one batch for every document-level stage text with references."""
    if not cfg.evaluation.bertscore:
        return None
    from eval.metrics.bertscore import document_bertscore, sentence_bertscore

    docs = stages[(stages["paragraph"] == -1) & (stages["window"] == -1)]
    pairs = list(dict.fromkeys((t, r) for d, t in zip(docs["doc_id"], docs["text"]) for r in refs.get(d, ())))
    if not pairs:
        return None
    score = document_bertscore if cfg.evaluation.bertscore_mode == "document" else sentence_bertscore
    scores = score([t for t, _ in pairs], [[r] for _, r in pairs], model_path=cfg.evaluation.bertscore_model_dir or None)
    table = {pair: s.f1 for pair, s in zip(pairs, scores)}
    return lambda candidate, reference: table[(candidate, reference)]


def frame_stage(store: RunStore, name: str, key: object, build) -> object:
    def produce(out_dir: str) -> dict:
        started = time.time()
        df = build()
        write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir)
        return {"rows_out": len(df), "seconds": round(time.time() - started, 3)}

    return store.run_stage(name, key, produce)


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    load_documents(cfg)  # a malformed input fails before the run directory exists
    run = open_run(JOB, cfg, config_path)
    store, cache = run.store, run.cache_dir
    ev = cfg.evaluation
    check = {"min_length_ratio": ev.min_length_ratio, "min_coverage": ev.min_coverage, "min_overlap": ev.min_overlap,
             "dsari_tokenizer": ev.dsari_tokenizer, "sari_deletion": ev.sari_deletion}
    tracker = run.start_tracking(JOB, cfg.wandb)
    try:
        results = [frame_stage(store, "documents", dataclasses.asdict(cfg.inputs), lambda: load_documents(cfg))]
        docs = store.read_stage("documents").to_pandas()
        results.append(frame_stage(store, "runs", {k: v for k, v in worker_kwargs(cfg, "").items()
                                                   if k not in ("secrets", "cache_dir")},
                                   lambda: simplify(cfg, docs, cache)))
        runs = store.read_stage("runs").to_pandas()
        records = [(r.doc_id, json.loads(r.record_json)) for r in runs.itertuples()]
        results.append(frame_stage(store, "stages", {}, lambda: pd.DataFrame(
            [row for doc, rec in records for row in stage_rows(doc, rec)])))
        results.append(frame_stage(store, "calls", {}, lambda: pd.DataFrame(
            [row for doc, rec in records for row in call_rows(doc, rec)])))
        if ev.jury_enabled:
            results.append(frame_stage(store, "jury", dataclasses.asdict(ev.jury), lambda: judge(cfg, docs, runs, cache)))
        jury = store.read_stage("jury").to_pandas() if ev.jury_enabled else None
        stages = store.read_stage("stages").to_pandas()
        refs = {d: json.loads(r) for d, r in zip(docs["doc_id"], docs["references_json"])}
        sources = dict(zip(docs["doc_id"], docs["source"]))
        results.append(frame_stage(store, "scores", {"bertscore": ev.bertscore, "model": ev.bertscore_model_dir,
                                                     "bertscore_mode": ev.bertscore_mode, **check}, lambda: pd.DataFrame(score_rows(
                                                         sources, refs, stages.to_dict("records"),
                                                         bertscore_fn(cfg, stages, refs), **check))))
        scores = store.read_stage("scores").to_pandas()
        results.append(frame_stage(store, "table", {"n_boot": ev.n_boot, "seed": ev.seed}, lambda: pd.DataFrame(
            score_table(scores.to_dict("records"), jury_scores(jury), ev.n_boot, ev.seed))))
        results.append(frame_stage(store, "costs", {}, lambda: pd.DataFrame(
            cost_table(store.read_stage("calls").to_pandas().to_dict("records")))))
        record_stages(results, tracker)
        from jobs.agentsimp.report import write_report

        table = write_report(cfg, store, tracker, runs)
        store.finish({"documents": len(docs), "runs": len(runs)})
    finally:
        tracker.finish()
    return table


if __name__ == "__main__":
    entry("jobs.agentsimp.simplify")
