"""Paper 000 stages that read the sources' human references: the positive controls and the judge-signal figure.

- `stage_oracle_select`: best/worst by sentence SARI against the references (`selector.kind: reference`); its
  pairs carry `oracle = true` and every table that shows them says so.
- `stage_sft_data`: SFT rows for `train.loss: sft` — the chosen candidates (paper 000's SFT_Think) or the references
  (its Parallel baseline, `train.targets: references`).
- `stage_judge_signal`: in a best/worst jury run on a corpus with references, how often the panel's Best / Worst is
  the oracle's, beside chance (1/K with ties), and Table 3 beside the oracle's.

References come from the corpus (TurkCorpus, ASSET: the same list for every policy) or from `data.references_path`
(JSONL rows `{id, references, policies}`, each reference tagged with the policy it was written for, as in the demo's
`configs/data/demo_references.jsonl`). The pure pieces live in `eval/judging/oracle.py` and `train/preference/pairs.py`.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pyarrow as pa

from core.errors import CorpusError
from core.runstore import RunStore, StageResult, write_table
from jobs.policy.stages import demo_eval_set

REFERENCE_FORMATS = ("turkcorpus", "asset")
# bootstrap resamples of the judge-signal CIs: fixed, not evaluate.n_boot, because the stage sits before pairs and
# training in the run's hash chain and an evaluation knob must not retrain anything
SIGNAL_BOOT = 1000


def corpus_has_references(data) -> bool:
    """Whether the sources of `data` (a DataConfig) come with human references."""
    return data.format in REFERENCE_FORMATS or bool(data.references_path)


def references_json(data, policies: list[str], kept: pd.DataFrame) -> list[str]:
    """Per kept source, `{policy: [references]}` as JSON (empty JSON object when the corpus has none)."""
    if data.format in REFERENCE_FORMATS:
        return [json.dumps({p: list(refs) for p in policies}, ensure_ascii=False) for refs in kept["references"]]
    if not data.references_path:
        return ["{}"] * len(kept)
    by_policy = {p: {r["id"]: list(r["references"]) for r in demo_eval_set(
        data.references_path, data.path, p).to_dict("records")} for p in policies}
    out = []
    for sid in kept["id"]:
        missing = [p for p in policies if sid not in by_policy[p]]
        if missing:
            raise CorpusError(f"data.references_path: {data.references_path}: source {sid!r} of {data.path} has no "
                              f"reference for policies {missing}")
        out.append(json.dumps({p: by_policy[p][sid] for p in policies}, ensure_ascii=False))
    return out


def reference_lookup(sources: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """(id, policy) -> references, from the sources stage's `references_json` column."""
    lookup = {}
    for sid, blob in zip(sources["id"], sources["references_json"]):
        for policy, refs in json.loads(blob).items():
            lookup[(sid, policy)] = refs
    return lookup


def stage_oracle_select(store: RunStore) -> StageResult:
    """The `select` stage of `selector.kind: reference`: oracle best/worst rows from the generations."""
    from eval.judging.oracle import oracle_verdict_rows

    def produce(out_dir: str) -> dict:
        candidates = store.read_stage("generate").to_pandas()
        refs = reference_lookup(store.read_stage("sources").to_pandas())
        rows = oracle_verdict_rows(candidates, refs)
        write_table(pa.Table.from_pandas(rows, preserve_index=False), out_dir)
        return {"rows_out": len(rows), "no_verdict": int((rows["parse_error"] != "").sum()), "oracle": True}

    return store.run_stage("select", {"kind": "reference", "metric": "sentence_sari"}, produce)


def stage_judge_signal(store: RunStore, seed: int, n_boot: int = SIGNAL_BOOT) -> StageResult:
    """Agreement of the jury's panel Best / Worst with the reference oracle (+ both Table 3s)."""
    from eval.judging.oracle import judge_signal, oracle_distribution, oracle_verdict_rows, signal_rows
    from train.preference.pairs import panel_choices

    def produce(out_dir: str) -> dict:
        candidates = store.read_stage("generate").to_pandas()
        refs = reference_lookup(store.read_stage("sources").to_pandas())
        rows = signal_rows(panel_choices(store.read_stage("jury").to_pandas()), oracle_verdict_rows(candidates, refs))
        table = judge_signal(rows, n_boot=n_boot, seed=seed)
        write_table(pa.Table.from_pandas(rows, preserve_index=False), out_dir)
        store.write_text("judge_signal.md", table.to_markdown(index=False, floatfmt=".3f") + "\n")
        store.write_text("oracle_distribution.md",
                         oracle_distribution(rows).to_markdown(index=False, floatfmt=".1f") + "\n")
        summary = {"rows_out": len(rows)}
        for entry in table.to_dict("records"):
            for key in ("coverage", "best_agreement", "best_lo", "best_hi", "best_chance", "worst_agreement",
                        "worst_lo", "worst_hi", "worst_chance"):
                summary[f"{entry['policy']}_{key}"] = round(float(entry[key]), 4)
        return summary

    return store.run_stage("judge_signal", {"n_boot": n_boot, "seed": seed, "metric": "sentence_sari"}, produce)


def stage_sft_data(store: RunStore, train_cfg, pairs_cfg, verdicts: str) -> StageResult:
    """SFT rows: from the pairs' chosen texts (`targets: pairs`) or from the references (`targets: references`)."""
    from train.preference.pairs import sft_rows_from_pairs, sft_rows_from_references

    def produce(out_dir: str) -> dict:
        if train_cfg.targets == "references":
            sources = store.read_stage("sources").to_pandas()
            refs = reference_lookup(sources)
            sources = sources.assign(references=[refs[(sid, train_cfg.policy)] for sid in sources["id"]])
            rows = sft_rows_from_references(sources, train_cfg.policy, pairs_cfg.prompts[train_cfg.policy],
                                            train_cfg.references_per_source, pairs_cfg.dev_fraction, pairs_cfg.seed)
        else:
            pairs = store.read_stage("pairs").to_pandas()
            rows = sft_rows_from_pairs(pairs[pairs["policy"] == train_cfg.policy])
        write_table(pa.Table.from_pandas(rows, preserve_index=False), out_dir)
        return {"rows_out": len(rows), "train": int((rows["split"] == "train").sum()),
                "dev": int((rows["split"] == "dev").sum()), "targets": train_cfg.targets,
                "oracle": bool(rows["oracle"].any()) if len(rows) else False}

    key = {"targets": train_cfg.targets, "per_source": train_cfg.references_per_source, "policy": train_cfg.policy,
           "pairs": dataclasses.asdict(pairs_cfg), "verdicts": verdicts}
    return store.run_stage("sft_data", key, produce)
