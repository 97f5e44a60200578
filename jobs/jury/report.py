"""report.md, report.html and figures of a jury_eval run (paper 001), and what goes to W&B.

`cfg` is `jobs.jury.evaluate.Config` (not imported: that module imports this one).
"""

from __future__ import annotations

import pandas as pd

from core.runstore import RunStore
from eval import report_html as rep
from eval.judging import jury_meta as meta


def report_notes(cfg) -> list[str]:
    human_kind = "raw 0-100 ratings" if cfg.simpeval.rating == "raw" else "per-rater z-scores"
    sims = ", ".join(f"{s.name} = {s.size_b:g}B" for s in cfg.synth.simplifiers) if cfg.synth.enabled else "none"
    notes = [
        (f"Jury: {len(cfg.jury.judges)} judges ({', '.join(j.name for j in cfg.jury.judges)}), 1-5 `Answer: [k]` "
         f"scores aggregated by the {cfg.jury.aggregate}; a judgment without a parsable answer is excluded from "
         "that mean and counted (Jury health)."),
        (f"Human scores: SimpEval = mean of the 3 {human_kind}; ASSET = mean over workers per aspect, then the mean "
         "of fluency, meaning and simplicity. Missing ratings are left out of those means and counted."),
        (f"Synthetic set: {cfg.synth.n if cfg.synth.enabled else 0} (domain, noun) prompts ({cfg.synth.strategy}, "
         f"seed {cfg.synth.seed}); writer {cfg.synth.writer.name}; simplifier sizes: {sims}. {cfg.synth.size_note}"),
        ("Automatic metrics: FKGL of the output, compression ratio and Levenshtein similarity to the source, and "
         "BERTScore F1 against the source (local MiniLM encoder, not comparable to published BERTScore) are "
         "reference-free. SARI and sentence BLEU need references: only SimpEval's non-human systems have them (the "
         "sentence's human-written simplifications); SimpEval's human-written rows, ASSET pairs (their sentences "
         "come from ASSET's held-out test split) and synthetic pairs are n/a there."),
        (f"95% CIs: {cfg.report.n_boot} bootstrap resamples of source sentences (seed {cfg.report.seed}). n/a = "
         "nothing to compute on (e.g. no parsed judgments, a constant scorer)."),
    ]
    if cfg.ablations:
        notes.append(f"Ablation judges ({', '.join(f'{j.name}: {j.template}, T {j.sampling.temperature:g}' for j in cfg.ablations)}) "
                     "are scored like the jury's judges but are not part of the jury mean or the inter-judge ICC "
                     "(paper 001 App. E).")
    return [n.strip() for n in notes]


def write_report(cfg, store: RunStore, tracker, boot: meta.Bootstrap) -> pd.DataFrame:
    """report.md, report.html and figures/*.png in the run directory; tables, images and headlines to W&B."""
    judges, ablations = [j.name for j in cfg.jury.judges], [j.name for j in cfg.ablations]
    scores, stats = store.read_stage("scores").to_pandas(), store.read_stage("stats").to_pandas()
    judgments = store.read_stage("jury").to_pandas()
    if ablations:
        judgments = pd.concat([judgments, store.read_stage("ablations").to_pandas()], ignore_index=True)
    health = meta.parse_health(judgments, judges + ablations)
    systems, overview = meta.system_means(scores, boot), meta.overview(scores)
    matrix = meta.spearman_matrix(scores, [meta.judge_column(j) for j in judges] + [meta.JURY])
    full = meta.full_matrix(scores, judges, ablations, list(cfg.report.metrics))
    markdown, html, figures = rep.build_report("Jury meta-evaluation", report_notes(cfg), overview, health,
                                               systems, stats, matrix, scores, full)
    store.write_text("report.md", markdown)
    store.write_text("report.html", html)
    store.fs.create_dir(f"{store.path}/figures", recursive=True)
    for figure in figures:
        with store.fs.open_output_stream(f"{store.path}/figures/{_slug(figure.title)}.png") as f:
            f.write(figure.png)
    print("\n" + markdown + "\n")
    for name, table in (("overview", overview), ("jury_health", health), ("system_means", systems),
                        ("stats", stats), ("judge_spearman", matrix.reset_index(names="scorer")),
                        ("full_spearman", full.reset_index(names="scorer"))):
        tracker.table(f"report/{name}", table, max_rows=2000)
    if tracker.run is not None:
        import io

        import wandb
        from PIL import Image

        tracker.log({f"report/{_slug(f.title)}": wandb.Image(Image.open(io.BytesIO(f.png)), caption=f.title)
                     for f in figures})
    headline = stats[stats["section"].isin(["inter_judge", "human_vs_jury", "expected_trend", "human_raters"])]
    tracker.summary("stats", {f"{r.section}/{r.set}/{r.a}/{r.statistic}": r.value for r in headline.itertuples()})
    return stats


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")
