"""Preference pairs from best/worst judgments (paper 000 step 2b), the train/dev split and Table 3.

Pure pandas over the jury stage's rows; no Ray.

Rules (the paper leaves these open; ours, documented and counted):
- The aspect that matches the policy decides: lexical-paraphrasing -> `Lexical`, overall-rewriting -> `Overall`
  (`POLICY_ASPECT`, overridable).
- With several judges, their verdicts are combined with `eval.judging.aggregate.vote_best_worst` (plurality of Best,
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
import random

import pandas as pd

from eval.judging.aggregate import vote_best_worst
from eval.prompts import PromptTemplate, load_template, prompt_path

POLICY_ASPECT = {"lexical": "Lexical", "overall": "Overall"}
# `oracle`: the pair was picked with the references (the positive control), never a judge's preference
PAIR_COLUMNS = ["id", "source", "prompt", "chosen", "rejected", "chosen_model", "rejected_model", "policy",
                "judge_meta", "oracle", "split"]


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


def _panel_vote(group: pd.DataFrame, aspect: str) -> tuple:
    """(vote or None, status dict, valid votes, their judges): the panel's verdict on one candidate set."""
    votes, judges, invalid = [], [], 0
    for row in group.itertuples():
        verdict = json.loads(row.verdict_json).get(aspect) if row.verdict_json else None
        if not verdict or verdict["error"] or verdict["best"] is None or verdict["worst"] is None:
            invalid += 1
            continue
        votes.append((verdict["best"], verdict["worst"]))
        judges.append(row.judge)
    status = {"n_votes": len(votes), "n_invalid": invalid}
    if not votes and all(str(e).startswith("too_few_candidates") for e in group.get("parse_error", [""])):
        return None, {**status, "status": "too_few_candidates"}, votes, judges
    if not votes:
        return None, {**status, "status": "no_valid_verdict"}, votes, judges
    vote = vote_best_worst(votes, len(json.loads(group.iloc[0]["candidates_json"])))
    if vote.best is None or vote.worst is None:
        return None, {**status, "status": "no_valid_verdict"}, votes, judges
    return vote, {**status, "status": "tie" if vote.tie else "ok"}, votes, judges


def _pair_for_source(group: pd.DataFrame, aspect: str, template: PromptTemplate) -> tuple[dict | None, dict]:
    first = group.iloc[0]
    models, candidates = json.loads(first["models_json"]), json.loads(first["candidates_json"])
    vote, status, votes, judges = _panel_vote(group, aspect)
    if vote is None:
        return None, status
    chosen, rejected = candidates[vote.best], candidates[vote.worst]
    if chosen.strip() == rejected.strip():
        return None, {**status, "status": "identical_texts"}
    meta = {"aspect": aspect, "judges": judges, "votes": votes, "tie": vote.tie, "n_invalid": status["n_invalid"]}
    pair = {
        "id": first["id"], "source": first["source"], "policy": first["policy"],
        "prompt": json.dumps(template.render(input=first["source"]), ensure_ascii=False),
        "chosen": chosen, "rejected": rejected, "chosen_model": models[vote.best],
        "rejected_model": models[vote.worst], "judge_meta": json.dumps(meta),
        "oracle": any(str(j).startswith("oracle:") for j in judges),
    }
    return pair, status


def panel_choices(judgments: pd.DataFrame, policy_aspect: dict[str, str] | None = None) -> pd.DataFrame:
    """The panel's Best / Worst model per (id, policy) by the same vote as the pairs (None where there is none).

    Returns:
        id, policy, best_model, worst_model, status (as in the pairs status table).
    """
    aspects = policy_aspect or POLICY_ASPECT
    rows = []
    for (sid, policy), group in judgments.groupby(["id", "policy"], sort=True):
        vote, status, _, _ = _panel_vote(group, aspects[policy])
        models = json.loads(group.iloc[0]["models_json"])
        rows.append({"id": sid, "policy": policy, "best_model": models[vote.best] if vote else None,
                     "worst_model": models[vote.worst] if vote else None, "status": status["status"]})
    return pd.DataFrame(rows, columns=["id", "policy", "best_model", "worst_model", "status"])


def judge_disagreement(judgments: pd.DataFrame, policy_aspect: dict[str, str] | None = None) -> pd.DataFrame:
    """Paper 000 §4.2's think vs no-think comparison for every two judges of a panel: of the (source, policy) sets
    both judged validly, the share whose preference pair differs (`disagree`; paper: > 40 %) and whose pairs are
    directly opposite, one's preferred being the other's rejected (`opposite`; paper: ~20 %).

    Returns:
        judge_a, judge_b, policy, n (sets both judged), disagree, opposite (fractions; NaN when n = 0).
    """
    judges = sorted(judgments["judge"].unique())
    choices = {j: panel_choices(judgments[judgments["judge"] == j], policy_aspect).set_index(["id", "policy"])
               for j in judges}
    rows = []
    for i, a in enumerate(judges):
        for b in judges[i + 1:]:
            both = choices[a].join(choices[b], lsuffix="_a", rsuffix="_b", how="inner")
            both = both[both["best_model_a"].notna() & both["best_model_b"].notna()]
            for policy, group in both.groupby(level="policy"):
                differ = ((group["best_model_a"] != group["best_model_b"])
                          | (group["worst_model_a"] != group["worst_model_b"]))
                opposite = ((group["best_model_a"] == group["worst_model_b"])
                            | (group["worst_model_a"] == group["best_model_b"]))
                n = len(group)
                rows.append({"judge_a": a, "judge_b": b, "policy": policy, "n": n,
                             "disagree": float(differ.mean()) if n else float("nan"),
                             "opposite": float(opposite.mean()) if n else float("nan")})
    return pd.DataFrame(rows, columns=["judge_a", "judge_b", "policy", "n", "disagree", "opposite"])


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


# ---------------------------------------------------------------------------------------------------------------
# SFT rows: the paper's SFT_Think (the judge's chosen candidates) and Parallel (human references) baselines

SFT_COLUMNS = ["id", "source", "prompt", "target", "policy", "origin", "oracle", "split"]


def sft_rows_from_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """SFT_Think: one row per pair, the chosen candidate as the target (the rejected one is not used)."""
    rows = pairs.assign(target=pairs["chosen"], origin="chosen:" + pairs["chosen_model"].astype(str))
    return rows[SFT_COLUMNS].reset_index(drop=True)


def sft_rows_from_references(sources: pd.DataFrame, policy: str, template_name: str, per_source: int = 1,
                             dev_fraction: float = 0.125, seed: int = 0) -> pd.DataFrame:
    """Parallel: SFT on the sources' human references, `per_source` of them (0 = all) in file order.

    Paper 000 trains its Parallel baseline on one reference per source (footnote 6: several degraded results)
    without saying which; we take the first, so the choice is reproducible and the knob can take more. Empty
    references are skipped and a source with none left raises, naming it: a silent drop would shrink the set.

    Args:
        sources: columns id, source, references (a list per row).
        policy: the policy the rows train (its name is stored on each row).
        template_name: the training prompt template (configs/prompts, variable `input`).
        per_source: references used per source; 0 = all.
        dev_fraction, seed: the same source-hash split as the preference pairs.
    """
    if per_source < 0:
        raise ValueError(f"references_per_source: must be >= 0, got {per_source}")
    template = load_template(prompt_path(template_name))
    rows = []
    for sid, source, refs in zip(sources["id"], sources["source"], sources["references"]):
        usable = [r for r in refs if isinstance(r, str) and r.strip()]
        if not usable:
            raise ValueError(f"source {sid!r}: no non-empty reference to train on")
        prompt = json.dumps(template.render(input=source), ensure_ascii=False)
        split = assign_split(sid, dev_fraction, seed)
        for k, ref in enumerate(usable[:per_source] if per_source else usable):
            rows.append({"id": sid, "source": source, "prompt": prompt, "target": ref, "policy": policy,
                         "origin": f"reference:{k}", "oracle": False, "split": split})
    return pd.DataFrame(rows, columns=SFT_COLUMNS)


def subsample(rows: list[dict], n: int, seed: int = 0) -> list[dict]:
    """`n` of `rows` drawn without replacement by `seed`, in their original order (paper 000 Fig. 3 trains on 1k-7k
    of its 8k pairs); n = 0 keeps all. The draw for a smaller n is not a prefix of a larger one's: each size is its
    own sample, as separate training runs of the paper are.

    >>> [r["i"] for r in subsample([{"i": k} for k in range(5)], 3, seed=1)]
    [0, 1, 4]
    """
    if n == 0:
        return list(rows)
    if n > len(rows):
        raise ValueError(f"asked for {n} training rows, only {len(rows)} exist")
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[k] for k in keep]
