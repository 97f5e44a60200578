"""SynthSimpliEval inputs (paper 001) and the human-rated pair sets, as pure pandas functions.

- Word lists (`configs/data/synth_domains.txt`, `synth_nouns.txt`) -> seeded (domain, concept noun) prompts.
- Request rendering for the writer (`synth_complex`: subject, seed_noun) and the simplifiers (`synth_simplify` or any
  one-variable template): the *pre* functions around `actors.chat_worker.ChatWorker`, like `actors.generate`'s.
- SimpEval 2022 and ASSET human ratings -> one row per (original, simplification) pair with its human score.

Every pair row has `set`, `id` (the source sentence: the bootstrap cluster), `model` (the system), `source`,
`candidate`. Ids carry their set (`synth-0003`, `simpeval-37`, `asset-7`) so pooled statistics never merge two
sentences. This module is pure: it never imports ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import CorpusError
from core.files import read_utf8
from eval.prompts import load_template, prompt_path
from eval.text_clean import clean_simplification

SYNTH, SIMPEVAL, ASSET = "synthetic", "simpeval", "asset"
# SimpEval systems whose outputs were written by people (they double as references for SARI/BLEU)
SIMPEVAL_HUMAN_PREFIX = "Human"
ASSET_ASPECTS = ("fluency", "meaning", "simplicity")


# ---------------------------------------------------------------------------------------------------------------
# Word lists and prompt sampling


def read_word_list(path: str | Path) -> list[str]:
    """One entry per line; blank lines and `#` comments skipped. Duplicates and an empty list raise CorpusError."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    words, seen = [], {}
    for number, line in enumerate(read_utf8(path, CorpusError).splitlines(), start=1):
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word in seen:
            raise CorpusError(f"{path}: line {number}: duplicate entry {word!r} (first on line {seen[word]})")
        seen[word] = number
        words.append(word)
    if not words:
        raise CorpusError(f"{path} is empty (no entries)")
    return words


def sample_prompt_pairs(domains: list[str], nouns: list[str], n: int, seed: int,
                        strategy: str = "stratified") -> pd.DataFrame:
    """Draw n distinct (domain, concept noun) pairs, reproducibly from `seed`.

    The paper does not say how its 200 pairs were drawn. `stratified` (default) spreads the domains evenly: each
    domain appears floor(n/D) or ceil(n/D) times, the extra ones drawn at random, and nouns are drawn without
    replacement while they last. `uniform` draws n distinct cells of the domain x noun grid uniformly.

    Returns:
        Columns id (`synth-0000`...), domain, seed_noun, pair_seed.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n > len(domains) * len(nouns):
        raise ValueError(f"n={n} exceeds the {len(domains)} x {len(nouns)} possible (domain, noun) pairs")
    rng = np.random.default_rng(seed)
    if strategy == "uniform":
        cells = rng.choice(len(domains) * len(nouns), size=n, replace=False)
        picked = [(domains[c // len(nouns)], nouns[c % len(nouns)]) for c in cells]
    elif strategy == "stratified":
        rounds = [rng.permutation(len(domains)) for _ in range(math.ceil(n / len(domains)))]
        domain_idx = np.concatenate(rounds)[:n]
        noun_idx = np.concatenate([rng.permutation(len(nouns)) for _ in range(math.ceil(n / len(nouns)))])[:n]
        picked, used = [], set()
        for d, k in zip(domain_idx, noun_idx):
            while (d, k) in used:  # only possible once nouns repeat; move to the next noun
                k = (k + 1) % len(nouns)
            used.add((d, k))
            picked.append((domains[d], nouns[k]))
    else:
        raise ValueError(f"strategy must be 'stratified' or 'uniform', got {strategy!r}")
    return pd.DataFrame({"id": [f"synth-{i:04d}" for i in range(n)], "domain": [d for d, _ in picked],
                         "seed_noun": [k for _, k in picked], "pair_seed": seed})


# ---------------------------------------------------------------------------------------------------------------
# Pre / post functions around ChatWorker


def template_variables(template: str) -> tuple[str, ...]:
    return load_template(prompt_path(template)).variables


def render_requests(batch: pd.DataFrame, template: str, variables: dict[str, str], model: str,
                    sampling_json: str) -> pd.DataFrame:
    """Render `template` per row, template variable <- row column as `variables` maps them; add the request."""
    tpl = load_template(prompt_path(template))
    out = batch.copy()
    out["model"] = model
    out["messages_json"] = [
        json.dumps(tpl.render(**{var: str(row[col]) for var, col in variables.items()}), ensure_ascii=False)
        for row in batch.to_dict("records")]
    out["sampling_json"] = sampling_json
    return out


def finalize_complex(batch: pd.DataFrame) -> pd.DataFrame:
    """The writer's answer -> `source` (cleaned, first line only); why a row is unusable -> `generation_error`."""
    out = batch.drop(columns=["messages_json"])
    sources, errors = [], []
    for text, engine_error in zip(batch["completion"], batch["engine_error"]):
        cleaned = clean_simplification(text or "")
        first = clean_simplification(next((line for line in cleaned.splitlines() if line.strip()), ""))
        sources.append(first)
        errors.append(f"engine: {engine_error}" if engine_error else ("" if first else "empty_after_cleaning"))
    out["source"], out["generation_error"] = sources, errors
    return out


# ---------------------------------------------------------------------------------------------------------------
# Human-rated sets


def simpeval_pairs(frame: pd.DataFrame, limit: int = 0, rating: str = "raw") -> pd.DataFrame:
    """SimpEval 2022 rows (from `actors.corpus.read_simpeval`) -> pair rows with the human score.

    `human` is the mean of the three ratings: the raw 0-100 ratings (`rating="raw"`) or the file's per-rater
    z-scores (`"zscore"`); a missing rating is left out of that mean and counted in `n_human_missing`.
    `references` lists the human-written simplifications (systems `Human ...`) of the same original, taken from the
    whole file before `limit`; rows written by a human get none (a text cannot be its own reference).
    `limit` keeps the first pairs in file order (0 = all).
    """
    if rating not in ("raw", "zscore"):
        raise ValueError(f"rating must be 'raw' or 'zscore', got {rating!r}")
    path = frame.attrs.get("path", "simpeval")
    key = pd.DataFrame({"id": [f"simpeval-{i}" for i in frame["original_id"]], "model": frame["system"]})
    dupes = key[key.duplicated(keep=False)]
    if len(dupes):
        raise CorpusError(f"{path}: system {dupes['model'].iloc[0]!r} rated twice for original_id "
                          f"{dupes['id'].iloc[0].split('-', 1)[1]}")
    is_human = frame["system"].str.startswith(SIMPEVAL_HUMAN_PREFIX)
    refs_by_id: dict[str, list[str]] = {}
    for sid, text, human in zip(key["id"], frame["generation"], is_human):
        if human:
            refs_by_id.setdefault(sid, []).append(text)
    raw = frame[["rating_1", "rating_2", "rating_3"]].to_numpy(dtype=float)
    zcols = [f"rating_{k}_zscore" for k in (1, 2, 3)]
    if rating == "zscore" and not set(zcols) <= set(frame.columns):
        raise CorpusError(f"{path}: rating='zscore' needs columns {zcols}")
    chosen = raw if rating == "raw" else frame[zcols].to_numpy(dtype=float)
    out = pd.DataFrame({
        "set": SIMPEVAL, "id": key["id"], "model": key["model"], "source": frame["original"],
        "candidate": frame["generation"], "generation_error": "",
        "human": _nanmean_rows(chosen), "n_human_missing": np.isnan(chosen).sum(axis=1),
        "human_r1": raw[:, 0], "human_r2": raw[:, 1], "human_r3": raw[:, 2],
        "sentence_type": frame["sentence_type"],
        "references": [[] if h else refs_by_id.get(i, []) for i, h in zip(key["id"], is_human)],
    })
    return out.head(limit) if limit else out


def asset_pairs(frame: pd.DataFrame, limit: int = 0) -> pd.DataFrame:
    """ASSET human ratings (from `actors.corpus.read_asset_ratings`, one row per worker x aspect) -> pair rows.

    Per (original, simplification) and aspect, the ratings are averaged over workers (missing ones left out and
    counted in `n_human_missing`); `human` is the mean of the three aspect means. The file does not name the
    system, so `model` is `asset-system-<k>` (k-th simplification of that original). `limit` keeps the first pairs
    in file order (0 = all).
    """
    keys = ["original_sentence_id", "original", "simplification"]
    # groupby means skip NaN ratings; a (pair, aspect) with no rating at all stays NaN
    means = frame.groupby([*keys, "aspect"], sort=False)["rating"].mean()
    missing = frame.assign(miss=frame["rating"].isna()).groupby(keys, sort=False)["miss"].sum()
    counts = frame.groupby(keys, sort=False)["rating"].size()
    order = frame[keys].drop_duplicates()
    rows = []
    for sid, original, simp in order.itertuples(index=False):
        k = (sid, original, simp)
        aspects = {a: float(means.get((*k, a), math.nan)) for a in ASSET_ASPECTS}
        values = [v for v in aspects.values() if not math.isnan(v)]
        rows.append({"set": ASSET, "id": f"asset-{sid}", "source": original, "candidate": simp,
                     "generation_error": "", "human": sum(values) / len(values) if values else math.nan,
                     "n_human_missing": int(missing.loc[k]), "n_human_ratings": int(counts.loc[k]),
                     **{f"human_{a}": v for a, v in aspects.items()}})
    out = pd.DataFrame(rows).assign(references=lambda d: [[] for _ in range(len(d))])
    out.insert(2, "model", [f"asset-system-{k + 1}" for k in out.groupby("id").cumcount()])
    return out.head(limit) if limit else out


def _nanmean_rows(table: np.ndarray) -> np.ndarray:
    counts = (~np.isnan(table)).sum(axis=1)
    sums = np.nansum(table, axis=1)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
