"""report.md / report.html of an agentsimp run (paper 004) and its W&B tables.

`cfg` is `jobs.agentsimp.simplify.Config` (not imported: that module imports this one). Tables: the results per
configuration (paper Table 2 layout: SARI, D-SARI, FKGL, BERTScore, the summary check and the jury, with 95 %
bootstrap CIs over documents), the ablation rows per configuration (Tables 3-4: every intermediate stage scored),
the cost per configuration and step, and the run's health (fallbacks, retries, shared and cached calls).
"""

from __future__ import annotations

import pandas as pd

from core.runstore import RunStore
from eval import report_html as rep

MAIN_COLUMNS = ("sari", "dsari", "fkgl", "bertscore", "compression", "length_ratio", "coverage", "is_summary")


def _cell(row, key: str) -> str:
    value = row.get(key)
    if pd.isna(value):
        return rep.NA
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    if pd.isna(lo) or pd.isna(hi):
        return rep.fmt(value, 2)
    return f"{rep.fmt(value, 2)} [{rep.fmt(lo, 2)}, {rep.fmt(hi, 2)}]"


def results_table(table: pd.DataFrame, final_only: bool, costs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rows (configuration, paper label, stage) with `value [lo, hi]` cells; final stages only or every stage.

    With `costs`, the final rows also carry the configuration's total LLM calls, tokens and allocated engine seconds.
    """
    totals = {} if costs is None else {r["config"]: r for r in costs[costs["step"] == "total"].to_dict("records")}
    rows = []
    last = table.groupby("config", sort=False)["stage"].last().to_dict()
    jury_cols = sorted(c for c in table.columns if c.startswith("jury") and not c.endswith(("_lo", "_hi")))
    for row in table.to_dict("records"):
        if final_only and row["stage"] != last[row["config"]]:
            continue
        rows.append({"config": row["config"], "row": row["label"] or "-", "stage": row["stage"], "n": row["n"],
                     **{k: _cell(row, k) for k in MAIN_COLUMNS},
                     **({k: _cell(row, k) for k in jury_cols} if final_only else {}),
                     **({k: totals[row["config"]][k] for k in ("calls", "prompt_tokens", "completion_tokens")}
                        if row["config"] in totals and final_only else {}),
                     **({"alloc_seconds": round(float(totals[row["config"]]["alloc_seconds"]), 1)}
                        if row["config"] in totals and final_only else {})})
    return pd.DataFrame(rows)


def corpus_table(docs: pd.DataFrame) -> pd.DataFrame:
    """Paper Table 1's columns for the run's corpus: documents, paragraphs, words, words per document."""
    words = docs["n_words"] if "n_words" in docs else docs["source"].str.split().str.len()
    return pd.DataFrame([{"documents": len(docs), "paragraphs": int(docs["n_paragraphs"].sum()),
                          "words": int(words.sum()), "words_per_document": round(float(words.mean()), 1)}])


def health_table(runs: pd.DataFrame) -> pd.DataFrame:
    cols = ["calls", "shared", "attempts", "cached", "fallbacks", "truncated", "collapsed"]
    return runs.groupby("config", sort=False)[cols].sum().reset_index()


def notes(cfg, docs: int, refs: int) -> list[str]:
    b = cfg.backbone
    return [
        (f"{docs} documents ({refs} with references); backbone {b.name} ({b.engine.kind}: {b.engine.model}), "
        f"temperature {b.temperature:g}, max tokens {b.max_tokens} per paragraph role and {b.document_max_tokens} "
        f"per document role; JSON roles {'decoded under their grammar' if b.constrained else 'decoded freely'}; "
        f"an invalid answer retried {b.max_retries} times, then the stage falls back to its input (counted); an "
        "answer cut at the token limit, or an architect/proofreader rewrite that collapses its input, falls back at "
        "once (counted as truncated / collapsed)."),
        ("SARI and D-SARI: each reference alone, then the mean over references (paper App. A); documents as single "
        f"segments; D-SARI tokenisation '{cfg.evaluation.dsari_tokenizer}' ('script' = the reference D_SARI.py on "
        "raw text), sentences by Punkt (heading lines are not sentences). BERTScore: F1 with the bundled MiniLM "
        f"encoder, mode '{cfg.evaluation.bertscore_mode}' ('document' = every wordpiece, windowed), mean over "
        "references (not comparable to published BERTScore). FKGL of the output (lower = simpler; Punkt "
        "sentences, as D-SARI). compression = output/source characters; "
        "length_ratio = output/source words; coverage = share of source sentences with >= half their content "
        "words kept; is_summary = share of documents flagged as a summary (eval.agentsimp.metrics.summary_check)."),
        ("LLM T1-T3: the single-prompt baselines of Table 2 (Appendix B, Figs. 6-8) on the same backbone; "
        "LLM (T1-T3 mean): the per-document mean of their scores, the paper's averaged row."),
        ("Jury: one LLM judge per aspect (coherence, simplicity, faithfulness; 1-5) on each configuration's final "
        "document; jury = mean of the aspects. 95% CIs: percentile bootstrap over documents "
        f"({cfg.evaluation.n_boot} resamples). n/a = no reference / nothing parsed."),
        ("Cost: LLM calls, attempts (with retries), prompt/completion tokens and alloc_seconds per configuration "
        "and step as if it ran alone; 'all' counts every distinct call of a document once (what one run of all "
        "configurations together costs). alloc_seconds are allocated, not measured per call: each lockstep round is "
        "one engine batch, whose measured seconds are shared evenly by its fresh requests; cached calls get 0 s."),
    ]


def write_report(cfg, store: RunStore, tracker, runs: pd.DataFrame) -> pd.DataFrame:
    table = store.read_stage("table").to_pandas()
    costs = store.read_stage("costs").to_pandas()
    docs = store.read_stage("documents").to_pandas()
    n_refs = int((docs["references_json"] != "[]").sum())
    final, ablations = results_table(table, True, costs), results_table(table, False)
    costs_view = costs.assign(alloc_seconds=costs["alloc_seconds"].round(1))
    sections = [
        rep.Section("Corpus (paper Table 1 columns)", corpus_table(docs),
                    "words: whitespace tokens of the paragraphs that are simplified (headings and verbatim blocks "
                    "left out)."),
        rep.Section("Results per configuration (paper Table 2 layout)", final,
                    "Cells: mean [95% CI] over documents; calls, tokens and alloc_seconds: the configuration's total "
                    "cost as if it ran alone (see the cost table)."),
        rep.Section("Every stage per configuration (paper Tables 3-4 ablation rows)", ablations,
                    "row: the paper's ablation name scored at that stage (w/o PF = the architect's output, ...)."),
        rep.Section("Cost per configuration and step", costs_view),
        rep.Section("Run health", health_table(runs),
                    "shared: calls an earlier configuration of the same document already made (made once); cached: "
                    "attempts served by the request cache; fallbacks: calls whose stage kept its input (every answer "
                    "invalid, or a guard); truncated: answers cut at the token limit; collapsed: architect or "
                    "proofreader rewrites that shrank their input (both fall back to the input at once)."),
    ]
    title = "AgentSimp (paper 004): document simplification"
    text_notes = notes(cfg, len(docs), n_refs)
    markdown = rep.render_markdown(title, text_notes, sections)
    store.write_text("report.md", markdown)
    store.write_text("report.html", rep.render_html(title, text_notes, sections, []))
    print("\n" + markdown + "\n")
    for name, df in (("results", final), ("stages", ablations), ("costs", costs), ("health", health_table(runs))):
        tracker.table(f"report/{name}", df, max_rows=2000)
    return table
