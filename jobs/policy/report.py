"""summary.md of a policy_simplify run (paper 000): Table 3, the judge signal, the results table and the costs.

`cfg` is `jobs.policy.simplify.Config` (not imported: that module imports this one).
"""

from __future__ import annotations

import pandas as pd

from core.runstore import RunStore
from eval.judging.jury_tables import candidate_scores, system_table
from jobs.policy.references import SIGNAL_BOOT
from jobs.policy.stages import cost_table


def training_data_label(cfg) -> str:
    """What the trained adapter learned from, as every table names it (oracle pairs are a control, not a judge)."""
    if not cfg.train.enabled:
        return "none"
    if cfg.references_only:
        n = cfg.train.references_per_source or "all"
        return f"Parallel: SFT on references ({n} per source)"
    source = {"jury": "jury", "scorer": cfg.selector.name, "reference": "ORACLE (reference SARI)"}[cfg.selector.kind]
    if cfg.train.trainer.loss == "sft":
        return f"SFT_Think: SFT on chosen candidates, {source} selector"
    return f"{cfg.train.trainer.loss} pairs, {source} selector"


def report(cfg, store: RunStore, tracker) -> pd.DataFrame:
    """summary.md: jury scores per model (score juries) or pairs, judge signal, results and costs."""
    stages = store.manifest["stages"]
    if "generate" in stages:
        candidates = store.read_stage("generate").to_pandas()
        tracker.table("samples", candidates[["id", "policy", "model", "source", "candidate"]])
    table = pd.DataFrame()
    if not cfg.preference_run:
        judgments = store.read_stage("jury").to_pandas()
        table = system_table(candidates, candidate_scores(judgments, cfg.jury.aggregate), seed=cfg.jury.seed)
        sections = [("Jury scores per policy and model", table)]
    else:
        from train.preference.pairs import preference_distribution

        sections = []
        if "pairs" in stages:
            pairs = store.read_stage("pairs").to_pandas()
            oracle = " - ORACLE pairs (reference SARI), a control" if cfg.selector.kind == "reference" else ""
            sections.append((f"Preferred / dispreferred per model (paper 000 Table 3){oracle}",
                             preference_distribution(pairs)))
        if "judge_signal" in stages:
            from eval.judging.oracle import judge_signal, oracle_distribution

            rows = store.read_stage("judge_signal").to_pandas()
            signal = judge_signal(rows, n_boot=SIGNAL_BOOT, seed=cfg.jury.seed)
            sections.append((("Judge signal: panel Best / Worst = the reference oracle's (95% bootstrap CIs; chance "
                             "= a uniform pick among the shown candidates)"), signal))
            sections.append(("Oracle Table 3: how often each model is the reference oracle's Best / Worst",
                             oracle_distribution(rows)))
        if "results" in stages:
            table = store.read_stage("results").to_pandas()
            labels = {"vanilla": "-", "trained": training_data_label(cfg),
                      **{m.name: "baseline system (own engine)" for m in cfg.evaluate.extra_systems}}
            table.insert(1, "training_data", [labels.get(s, "extra adapter") for s in table["system"]])
            sections.append((f"Evaluation ({cfg.train.policy} policy): vanilla vs trained, 95% bootstrap CIs", table))
        sections.append(("Cost per stage", cost_table(store.manifest)))
    markdown = "\n\n".join(f"## {title}\n\n{frame.to_markdown(index=False, floatfmt='.3f')}"
                             for title, frame in sections)
    store.write_text("summary.md", markdown + "\n")
    print("\n" + markdown + "\n")
    for title, frame in sections:
        tracker.table(title.split(" (")[0].split(":")[0].lower().replace(" ", "_").replace("/", ""), frame)
    return table
