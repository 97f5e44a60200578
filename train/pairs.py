"""Preference pairs from best/worst judgments (paper 000 step 2b), the train/dev split and Table 3.

Pure pandas over the jury stage's rows; no Ray.

Rules (the paper leaves these open; ours, documented and counted):
- The aspect that matches the policy decides: lexical-paraphrasing -> `Lexical`, overall-rewriting -> `Overall`
  (`POLICY_ASPECT`, overridable).
- With several judges, their verdicts are combined with `eval.aggregate.vote_best_worst` (plurality of Best,
  tie-break by fewer Worst votes, then lower index; a tie is flagged in `judge_meta`, the pair is kept).
- A verdict whose aspect failed to parse, or whose Best == Worst, is an invalid vote: excluded from the vote and
  counted. A source with no valid vote gets no pair (status `no_valid_verdict`).
- If the chosen and rejected texts are identical (two models wrote the same sentence) there is nothing to learn:
  no pair (status `identical_texts`).
Every source appears in the returned status table, pair or not.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

from eval.aggregate import vote_best_worst
from eval.prompts import PromptTemplate, load_template, prompt_path

POLICY_ASPECT = {"lexical": "Lexical", "overall": "Overall"}
PAIR_COLUMNS = ["id", "source", "prompt", "chosen", "rejected", "chosen_model", "rejected_model", "policy",
                "judge_meta", "split"]


def assign_split(source_id: str, dev_fraction: float, seed: int = 0) -> str:
    """Stable train/dev split by source id (a hash, so every pair of one source lands on the same side)."""
    digest = hashlib.sha256(f"{seed}:{source_id}".encode()).digest()
    return "dev" if int.from_bytes(digest[:8], "big") / 2**64 < dev_fraction else "train"


def build_pairs(judgments: pd.DataFrame, prompts: dict[str, str], dev_fraction: float = 0.125, seed: int = 0,
                policy_aspect: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pairs and a per-source status table from best/worst jury rows.

    Args:
        judgments: jury rows with id, policy, source, judge, models_json, candidates_json, verdict_json.
        prompts: policy -> training prompt template (configs/prompts name, variable `input`; paper 000 trains
            and evaluates with the system instruction only, e.g. `simplify_lexical_zeroshot`).
        dev_fraction: share of sources held out for dev.
        seed: split seed.
        policy_aspect: policy -> aspect name; defaults to `POLICY_ASPECT`.

    Returns:
        (pairs with `PAIR_COLUMNS`, status table with id, policy, status, n_votes, n_invalid).
    """
    aspects = policy_aspect or POLICY_ASPECT
    templates = {policy: load_template(prompt_path(name)) for policy, name in prompts.items()}
    pairs, statuses = [], []
    for (sid, policy), group in judgments.groupby(["id", "policy"], sort=True):
        aspect = aspects.get(policy)
        if aspect is None:
            raise ValueError(f"policy {policy!r} has no judge aspect (known: {sorted(aspects)})")
        pair, status = _pair_for_source(group, aspect, templates[policy])
        statuses.append({"id": sid, "policy": policy, **status})
        if pair:
            pairs.append({**pair, "split": assign_split(sid, dev_fraction, seed)})
    return pd.DataFrame(pairs, columns=PAIR_COLUMNS), pd.DataFrame(statuses)


def _pair_for_source(group: pd.DataFrame, aspect: str, template: PromptTemplate) -> tuple[dict | None, dict]:
    first = group.iloc[0]
    models, candidates = json.loads(first["models_json"]), json.loads(first["candidates_json"])
    votes, judges, invalid = [], [], 0
    for row in group.itertuples():
        verdict = json.loads(row.verdict_json).get(aspect) if row.verdict_json else None
        if not verdict or verdict["error"] or verdict["best"] is None or verdict["worst"] is None:
            invalid += 1
            continue
        votes.append((verdict["best"], verdict["worst"]))
        judges.append(row.judge)
    status = {"n_votes": len(votes), "n_invalid": invalid}
    if not votes:
        return None, {**status, "status": "no_valid_verdict"}
    vote = vote_best_worst(votes, len(candidates))
    if vote.best is None or vote.worst is None:
        return None, {**status, "status": "no_valid_verdict"}
    chosen, rejected = candidates[vote.best], candidates[vote.worst]
    if chosen.strip() == rejected.strip():
        return None, {**status, "status": "identical_texts"}
    meta = {"aspect": aspect, "judges": judges, "votes": votes, "tie": vote.tie, "n_invalid": invalid}
    pair = {
        "id": first["id"], "source": first["source"], "policy": first["policy"],
        "prompt": json.dumps(template.render(input=first["source"]), ensure_ascii=False),
        "chosen": chosen, "rejected": rejected, "chosen_model": models[vote.best],
        "rejected_model": models[vote.worst], "judge_meta": json.dumps(meta),
    }
    return pair, {**status, "status": "tie" if vote.tie else "ok"}


def preference_distribution(pairs: pd.DataFrame) -> pd.DataFrame:
    """Paper 000 Table 3: per policy and model, how often it was preferred / dispreferred (counts and %)."""
    rows = []
    for policy, group in pairs.groupby("policy", sort=True):
        models = sorted(set(group["chosen_model"]) | set(group["rejected_model"]))
        n = len(group)
        for model in models:
            chosen = int((group["chosen_model"] == model).sum())
            rejected = int((group["rejected_model"] == model).sum())
            rows.append({"policy": policy, "model": model, "preferred": chosen, "dispreferred": rejected,
                         "preferred_pct": 100.0 * chosen / n, "dispreferred_pct": 100.0 * rejected / n})
    return pd.DataFrame(rows, columns=["policy", "model", "preferred", "dispreferred", "preferred_pct",
                                       "dispreferred_pct"])
