"""AgentSimp (paper 004) run-store rows: documents, stage outputs, calls, scores, costs, as plain dicts.

The job (`jobs/agentsimp/simplify.py`) keeps one Parquet table per kind; everything here is pure so tests hand-check it:

- `document_row` / `document_inputs`: a `eval.agentsimp.docs.Document` <-> one row of the `documents` stage.
- `run_rows(doc_id, runs, outcomes_seen)`: the worker's output for one document, one row per configuration with the
  DocumentRun as JSON (`eval.agentsimp.run.run_record`) and its call counts; `shared` counts the calls whose
  key an earlier configuration of the same document already settled (the paragraph stage shared through the
  request cache / the lockstep driver).
- `stage_rows(record)`: every stage's text per document (`paragraph` = -1) and per paragraph, plus each window of
  the iterative architect, so ablations score any intermediate stage.
- `call_rows(record)` and `cost_table(calls)`: one row per call; LLM calls, attempts, fallbacks, tokens and
  `alloc_seconds` per configuration and step ("total" = all steps), then "all" with each distinct call of a document
  once. `alloc_seconds` are allocated, not measured per call: the engine decodes each lockstep round as one batch,
  and the batch's measured engine seconds are shared evenly by its fresh requests (cache hits get 0).
- `score_rows` and `score_table`: scores of every (document, configuration, stage), then per (configuration,
  stage) means with percentile-bootstrap CIs over documents (paper Tables 2-4 layout; rows labelled as the paper).

Pure: no ray, vllm, deepspeed, torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from eval.agentsimp.baselines import BASELINES
from eval.agentsimp.baselines import LABELS as BASELINE_LABELS
from eval.agentsimp.baselines import MEAN as BASELINE_MEAN
from eval.agentsimp.baselines import STAGE as BASELINE_STAGE
from eval.agentsimp.docs import Document
from eval.agentsimp.metrics import PAPER_ROWS, SCORE_KEYS, score_document
from eval.agentsimp.plan import CONFIGURATIONS, DocumentRun
from eval.agentsimp.roles import STEPS
from eval.agentsimp.run import run_record
from eval.agreement import bootstrap_ci

# the scores that get a bootstrap CI in the tables (the others are reported as means)
CI_KEYS = ("sari", "dsari", "fkgl", "bertscore", "compression", "jury")
COST_KEYS = ("calls", "attempts", "fallbacks", "cached", "prompt_tokens", "completion_tokens", "alloc_seconds")


def document_row(document: Document) -> dict:
    """One `documents` row: id, origin, the planners' article, paragraphs, references and verbatim blocks (never sent
    to a model: [paragraphs before it, text] each) as JSON, source text."""
    return {"doc_id": document.id, "origin": document.origin, "article": document.article,
            "paragraphs_json": json.dumps(list(document.paragraphs), ensure_ascii=False),
            "verbatim_json": json.dumps([list(v) for v in document.verbatim_blocks], ensure_ascii=False),
            "references_json": json.dumps(list(document.references), ensure_ascii=False),
            "source": document.text, "n_paragraphs": len(document.paragraphs),
            "n_words": len(document.text.split())}


def document_inputs(row: Mapping) -> tuple[str, str, list[str], list[str]]:
    """(doc id, article, paragraphs, references) of a `documents` row."""
    return (str(row["doc_id"]), str(row["article"]), json.loads(row["paragraphs_json"]),
            json.loads(row["references_json"]))


def run_rows(doc_id: str, runs: Mapping[str, DocumentRun]) -> list[dict]:
    """One row per configuration of one document (configurations in the given order, e.g. the lockstep run's).

    `shared` = calls of this configuration already made for an earlier one (counted once in the run), `cached` =
    attempts served by the request cache (a resumed or repeated run), `fallbacks` = calls that fell back, of which
    `truncated` / `collapsed` fell back through a guard (eval.agentsimp.outputs: cut at the token limit, or an
    architect / proofreader rewrite that shrank its input).
    """
    return record_rows(doc_id, {name: run_record(run) for name, run in runs.items()})


def record_rows(doc_id: str, records: Mapping[str, Mapping]) -> list[dict]:
    """`run_rows` from run records (`run_record`, or a baseline's `eval.agentsimp.baselines.baseline_record`)."""
    seen: set[str] = set()
    rows = []
    for name, record in records.items():
        calls = record["calls"]
        shared = sum(1 for c in calls if c["key"] in seen)
        seen.update(c["key"] for c in calls)
        rows.append({"doc_id": doc_id, "config": name, "label": record["label"], "final": record["final"],
                     "calls": len(calls), "shared": shared, "attempts": sum(c["attempts"] for c in calls),
                     "cached": sum(c["cached"] for c in calls), "fallbacks": sum(c["fell_back"] for c in calls),
                     "truncated": sum(c.get("guard") == "truncated" for c in calls),
                     "collapsed": sum(c.get("guard") == "collapsed" for c in calls),
                     "record_json": json.dumps(record, ensure_ascii=False)})
    return rows


def stage_rows(doc_id: str, record: Mapping) -> list[dict]:
    """Every text of one configuration's run: document stages (paragraph -1), paragraph stages, windows.

    >>> rec = {"config": "pl_direct", "stages": {"cs": "a", "pf": "b"}, "windows": [],
    ...        "paragraphs": [{"index": 0, "original": "o", "stages": {"cs": "a"}, "final": "a"}]}
    >>> [(r["stage"], r["paragraph"], r["text"]) for r in stage_rows("d", rec)]
    [('cs', -1, 'a'), ('pf', -1, 'b'), ('original', 0, 'o'), ('cs', 0, 'a')]
    """
    base = {"doc_id": doc_id, "config": record["config"]}
    rows = [{**base, "stage": stage, "paragraph": -1, "window": -1, "text": text}
            for stage, text in record["stages"].items()]
    for p in record["paragraphs"]:
        rows.append({**base, "stage": "original", "paragraph": p["index"], "window": -1, "text": p["original"]})
        rows += [{**base, "stage": stage, "paragraph": p["index"], "window": -1, "text": text}
                 for stage, text in p["stages"].items()]
    for w in record["windows"]:
        shown = ([w["carried"]] if w["carried"] is not None else []) + list(w["paragraphs"])
        for stage, texts in (("window_in", shown), ("window_out", w["output"]), ("window_kept", w["emitted"])):
            rows.append({**base, "stage": stage, "paragraph": -1, "window": w["index"], "text": "\n\n".join(texts)})
    return rows


def call_rows(doc_id: str, record: Mapping) -> list[dict]:
    """One row per call of one configuration's run, in order (inputs and raw answers stay in record_json)."""
    return [{"doc_id": doc_id, "config": record["config"], "order": k, "role": c["role"], "step": c["step"],
             "unit": c["unit"], "key": c["key"], "attempts": c["attempts"], "fell_back": bool(c["fell_back"]),
             "guard": c.get("guard", ""),
             "errors": "; ".join(c["errors"]), "cached": int(c["cached"]), "prompt_tokens": c["prompt_tokens"],
             "completion_tokens": c["completion_tokens"], "alloc_seconds": float(c["seconds"])}
            for k, c in enumerate(record["calls"])]


def cost_table(calls: Iterable[Mapping]) -> list[dict]:
    """LLM cost per (configuration, step) and per configuration ("total"), then "all" (distinct calls once).

    "all" counts each (document, key) once: what one run of every configuration together costs; the difference
    to the sum of the configurations is what the shared paragraph stage saved.

    >>> rows = [{"doc_id": "d", "config": c, "step": "plan", "key": "k", "attempts": 1, "fell_back": False,
    ...          "cached": 0, "prompt_tokens": 10, "completion_tokens": 2, "alloc_seconds": 1.0} for c in ("a", "b")]
    >>> [(r["config"], r["step"], r["calls"], r["prompt_tokens"]) for r in cost_table(rows)]
    [('a', 'plan', 1, 10), ('a', 'total', 1, 10), ('b', 'plan', 1, 10), ('b', 'total', 1, 10), ('all', 'plan', 1, 10), ('all', 'total', 1, 10)]
    """
    table: dict[tuple[str, str], dict] = {}
    seen: set[tuple[str, str]] = set()
    configs: list[str] = []
    for c in calls:
        if c["config"] not in configs:
            configs.append(c["config"])
        fresh = (c["doc_id"], c["key"]) not in seen
        seen.add((c["doc_id"], c["key"]))
        for config in (c["config"], "all") if fresh else (c["config"],):
            for step in (c["step"], "total"):
                row = table.setdefault((config, step), {"config": config, "step": step, **dict.fromkeys(COST_KEYS, 0)})
                row["calls"] += 1
                row["attempts"] += int(c["attempts"])
                row["fallbacks"] += int(bool(c["fell_back"]))
                row["cached"] += int(c["cached"])
                row["prompt_tokens"] += int(c["prompt_tokens"])
                row["completion_tokens"] += int(c["completion_tokens"])
                row["alloc_seconds"] += float(c["alloc_seconds"])
    order = [*configs, "all"]
    return [table[(c, s)] for c in order for s in (*STEPS, "total") if (c, s) in table]


def score_rows(sources: Mapping[str, str], references: Mapping[str, Sequence[str]], stages: Iterable[Mapping],
               bertscore: Callable[[str, str], float] | None = None, **check) -> list[dict]:
    """Scores of every document-level stage text (rows of `stage_rows` with paragraph -1 and window -1).

    Returns:
        {"doc_id", "config", "stage", **score_document(...)} per (document, configuration, stage).
    With LLM baselines among the configurations, each document also gets an `llm_mean` row: the mean of each
    score over its baseline templates (Appendix B averages the three templates).
    """
    out = []
    for row in stages:
        if row["paragraph"] != -1 or row["window"] != -1:
            continue
        doc = row["doc_id"]
        out.append({"doc_id": doc, "config": row["config"], "stage": row["stage"],
                    **score_document(sources[doc], row["text"], references.get(doc, ()), bertscore, **check)})
    by_doc: dict[str, list[dict]] = {}
    for row in out:
        if row["config"] in BASELINES:
            by_doc.setdefault(row["doc_id"], []).append(row)
    for doc, rows in by_doc.items():
        mean = {key: (sum(v) / len(v) if (v := [r[key] for r in rows if _present(r[key])]) else None)
                for key in SCORE_KEYS}
        out.append({"doc_id": doc, "config": BASELINE_MEAN, "stage": BASELINE_STAGE, **mean})
    return out


def stage_label(config: str, stage: str, last_stage: str) -> str:
    """The paper's row name of a stage: "PL" ... for the last stage, "w/o PF" ... (Tables 3-4), else "".

    A baseline's one stage is its row ("LLM T1" ... "LLM (T1-T3 mean)")."""
    if config in BASELINE_LABELS:
        return BASELINE_LABELS[config] if stage == last_stage else ""
    communication, _, label = CONFIGURATIONS[config]
    if stage == last_stage:
        return label
    return {s: lab for lab, s in PAPER_ROWS[communication]}.get(stage, "")


def score_table(scores: Sequence[Mapping], jury: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Mean of each score per (configuration, stage) over documents, with 95 % bootstrap CIs for `CI_KEYS`.

    Args:
        scores: `score_rows` output, stages in process order per configuration.
        jury: (doc id, config) -> {"jury_<aspect>": score, ..., "jury": mean of the aspects} of the final stage
            (the jury judges the configuration's output, not its intermediate stages).
        n_boot: Bootstrap resamples of documents (0 = no CIs).

    Returns:
        Rows {"config", "label", "stage", "n", <score>, <score>_lo, <score>_hi ...}.
    """
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for row in scores:
        groups.setdefault((row["config"], row["stage"]), []).append(row)
    last = {}
    for config, stage in groups:
        last[config] = stage
    out = []
    for (config, stage), rows in groups.items():
        entry = {"config": config, "label": stage_label(config, stage, last[config]), "stage": stage, "n": len(rows)}
        # None or NaN (a Parquet round trip turns None into NaN) = no value: no reference, no BERTScore
        values = {key: [r[key] for r in rows if _present(r.get(key))] for key in SCORE_KEYS}
        if jury is not None and stage == last[config]:
            aspects = sorted({a for (_, c), by in jury.items() if c == config for a in by})
            for aspect in aspects:
                values[aspect] = [jury[(r["doc_id"], config)][aspect] for r in rows
                                  if _present(jury.get((r["doc_id"], config), {}).get(aspect))]
        for key, vals in values.items():
            entry[key] = float(np.mean(vals)) if vals else None
            if key in CI_KEYS or key.startswith("jury"):
                lo = hi = None
                if vals and n_boot:
                    _, lo, hi = bootstrap_ci(np.mean, np.asarray(vals, dtype=float), n_boot=n_boot, seed=seed)
                entry[f"{key}_lo"], entry[f"{key}_hi"] = lo, hi
        out.append(entry)
    return out


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
