"""Best/worst by a scalar scorer instead of an LLM judge (the LENS-SALSA-style baseline of paper 000).

A `ScoreWorker` actor pool gives every candidate one number; `scorer_verdicts` then picks, per (source,
policy), the highest-scoring candidate as Best and the lowest as Worst, for every aspect, and writes rows of the
same shape as the best/worst jury's, so `train.preference.pairs.build_pairs` takes either.

Scorers (reference-free, since the candidate pool has no references):
- `lens_salsa`: LENS-SALSA from a local checkpoint (`QUORUM_LENS_SALSA_PATH` or `checkpoint`); the paper's
  baseline.
- `meaning_simplicity`: an offline stand-in that needs nothing beyond the bundled MiniLM: BERTScore-F1 of the
  candidate against its source (meaning kept) minus `fkgl_weight` x FKGL of the candidate (reading level).
  A copy of the source keeps all meaning but no simplicity; a fluent, shorter, plainer candidate wins.

Ties (equal scores) go to the lower original index, so the verdict is reproducible; all-equal scores (e.g.
one usable candidate) give no verdict and the set is counted, never silently paired.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd
import ray.data

from actors.stage_config import LIGHT_CPU, PoolConfig
from core.config import Section, dotted, one_of

ASPECTS = ("Lexical", "Structural", "Overall")


@dataclass
class SelectorConfig(Section):
    # jury: best/worst from the LLM jury (paper 000); scorer: from a scalar scorer below; reference: the oracle
    # positive control, sentence SARI against the sources' references (eval/judging/oracle.py; needs a corpus with them)
    kind: str = "jury"
    # meaning_simplicity | lens_salsa
    scorer: str = "meaning_simplicity"
    # per FKGL grade; 0.03 ranks a grade-7 paraphrase (MiniLM F1 0.56) above a copy of its grade-23 source
    fkgl_weight: float = 0.03
    # lens_salsa checkpoint; "" reads QUORUM_LENS_SALSA_PATH
    checkpoint: str = ""
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_cpus=0.5, batch_size=64))

    def check(self, where: str = "") -> None:
        one_of(self.kind, ("jury", "scorer", "reference"), dotted(where, "kind"))
        one_of(self.scorer, ("meaning_simplicity", "lens_salsa"), dotted(where, "scorer"))

    @property
    def name(self) -> str:
        return f"scorer:{self.scorer}"


class ScoreWorker:
    """Ray Data actor: one scalar per usable candidate (`selector_score`; NaN for failed generations)."""

    def __init__(self, scorer: str, fkgl_weight: float, checkpoint: str):
        self.scorer, self.fkgl_weight, self.checkpoint = scorer, fkgl_weight, checkpoint or None
        if scorer == "lens_salsa":
            from eval.metrics.lens import load_metric

            load_metric("lens_salsa", self.checkpoint)  # fail at actor start, with what to set

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        out = batch.copy()
        usable = (batch["generation_error"] == "") & (batch["candidate"].str.strip() != "")
        sources, cands = list(batch.loc[usable, "source"]), list(batch.loc[usable, "candidate"])
        scores = pd.Series(float("nan"), index=batch.index)
        if cands:
            scores[usable] = self._score(sources, cands)
        out["selector_score"] = scores.to_numpy()
        return out

    def _score(self, sources: list[str], cands: list[str]) -> list[float]:
        if self.scorer == "lens_salsa":
            from eval.metrics.lens import score_lens_salsa

            return score_lens_salsa(sources, cands, model_path=self.checkpoint)
        from eval.metrics.bertscore import sentence_bertscore
        from eval.metrics.text import sentence_fkgl

        meaning = sentence_bertscore(cands, [[s] for s in sources])
        return [m.f1 - self.fkgl_weight * sentence_fkgl(c) for m, c in zip(meaning, cands)]


def scorer_verdicts(group: pd.DataFrame, judge: str) -> pd.DataFrame:
    """One best/worst row per (source, policy), shaped like the jury's best/worst rows."""
    group = group.sort_values("model")
    scores = [None if pd.isna(s) else float(s) for s in group["selector_score"]]
    valid = [i for i, s in enumerate(scores) if s is not None]
    error = ""
    if len(valid) < 2 or len({scores[i] for i in valid}) < 2:
        verdict, error = {a: {"best": None, "worst": None, "error": "no score spread"} for a in ASPECTS}, \
            "fewer than two distinct candidate scores"
    else:
        best = max(valid, key=lambda i: (scores[i], -i))
        worst = min(valid, key=lambda i: (scores[i], i))
        verdict = {a: {"best": best, "worst": worst, "error": ""} for a in ASPECTS}
    row = {"id": group["id"].iloc[0], "policy": group["policy"].iloc[0], "source": group["source"].iloc[0],
           "judge": judge, "format": "best_worst", "models_json": json.dumps(list(group["model"])),
           "candidates_json": json.dumps(list(group["candidate"])), "scores_json": json.dumps(scores),
           "verdict_json": json.dumps(verdict), "parse_error": error}
    return pd.DataFrame([row])


def build_selector_dataset(candidates: ray.data.Dataset, cfg: SelectorConfig) -> ray.data.Dataset:
    scored = candidates.map_batches(
        ScoreWorker, batch_format="pandas",
        fn_constructor_kwargs={"scorer": cfg.scorer, "fkgl_weight": cfg.fkgl_weight, "checkpoint": cfg.checkpoint},
        **cfg.pool.map_batches_kwargs())
    return scored.groupby(["id", "policy"]).map_groups(scorer_verdicts, batch_format="pandas", num_cpus=LIGHT_CPU,
                                                       fn_kwargs={"judge": cfg.name})


def summarize_selection(df: pd.DataFrame, seconds: float) -> dict:
    return {"rows_out": len(df), "no_verdict": int((df["parse_error"] != "").sum()), "seconds": round(seconds, 3)}
