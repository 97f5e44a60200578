"""Jury stage: a panel of judges rates candidates; one output row per (item, judge), aggregated on the driver.

Formats (per judge, `format`):
- `score`: each candidate alone -> an integer 1-5 (`Answer: [k]`, paper 001).
- `best_worst`: all candidates of one (source, policy) at once -> Best/Worst index per aspect (paper 000). The
  candidates are shown in generator order, as in the paper (`candidate_order: fixed`), or in an order shuffled
  from (jury.seed, source id, policy, judge) (`shuffled`, a position-bias control); the order is stored with the
  row and indices are mapped back to the original candidates, so the run is reproducible either way.
- `pairwise`: every pair of candidates, in both orders when `both_orders` -> A / B / tie.

An output the judge's parser cannot read is retried (new seed) up to `max_parse_retries` times, then kept with
`parse_error` set and counted.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd
import ray.data

from actors.chat_worker import ChatWorker
from actors.stage_config import LIGHT_CPU, ModelConfig, check_unique_names, engine_secrets
from core.config import Section, dotted, fail, one_of
from eval.judging.aggregate import shuffle_order, to_original_index
from eval.judging.blocks import render_alignments_section, render_candidates_block, render_parses_section
from eval.judging.grammar import judge_grammar
from eval.judging.menlo_parse import parse_pairwise
from eval.judging.parse import parse_best_worst, parse_score
from eval.prompts import TemplateName, load_template, prompt_path

ASPECTS = ("Lexical", "Structural", "Overall")


@dataclass
class JudgeConfig(ModelConfig):
    # prompt template name in configs/prompts (or a path)
    template: TemplateName = "jury_score"
    # score (each candidate alone, 1-5; paper 001) | best_worst (all of a source's candidates; paper 000) |
    # pairwise (every pair, A / B / tie)
    format: Literal["score", "best_worst", "pairwise"] = "score"
    # re-ask an unparseable verdict this many times with a new seed; 0 = never (paper 000's choice)
    max_parse_retries: int = 2
    retry_temperature: float = 0.7  # lowest temperature of a retry (a greedy retry would repeat itself)
    # decode the verdict under its format's grammar (eval.judging.grammar): every finished answer parses. Off = free
    # text, as the papers ran their judges (the paper pages' Deviations, docs/papers/)
    constrained: bool = True


@dataclass
class JuryConfig(Section):
    """A panel of judges rating candidates, and how their verdicts become one score per candidate."""

    # the judges (a model, prompt template, verdict format each); unique names, one shared format, >= 1
    judges: list[JudgeConfig] = field(default_factory=lambda: [JudgeConfig()])
    # how judge scores become one score per candidate: mean (paper 001), median or majority
    aggregate: Literal["mean", "median", "majority"] = "mean"
    # seed of the candidate-order shuffles (position-bias control)
    seed: int = 0
    # best_worst: "fixed" shows the candidates in generator order (paper 000: 0 Qwen2.5-7B, 1 Llama-3.1-8B,
    # 2 Phi-4, 3 Qwen3-32B, always); "shuffled" permutes them per judgment from `seed` and maps verdicts back
    candidate_order: Literal["fixed", "shuffled"] = "fixed"
    # pairwise: judge (A, B) and (B, A)
    both_orders: bool = True
    # pairwise: two candidates with the same text go to the judge ("judge") or are a tie without a call ("tie",
    # kept as rows with finish_reason "identical_texts" and counted as `identical_ties`)
    identical_pairs: Literal["judge", "tie"] = "judge"

    def check(self, where: str = "") -> None:
        check_unique_names(self.judges, dotted(where, "judges"))
        one_of(self.candidate_order, ("fixed", "shuffled"), dotted(where, "candidate_order"))
        one_of(self.identical_pairs, ("judge", "tie"), dotted(where, "identical_pairs"))
        formats = sorted({j.format for j in self.judges})
        if len(formats) > 1:
            # one panel answers one question; mixing formats would mix incomparable rows
            fail(dotted(where, "judges"), f"all judges must share one format, got {formats}")


# ---------------------------------------------------------------------------------------------------------------
# Checks (run inside the worker to decide retries) — named so Ray can pickle them


def check_score(text: str, row: dict) -> str:
    return parse_score(text).error


def check_best_worst(text: str, row: dict) -> str:
    verdicts = parse_best_worst(text, int(row["n_candidates"]))
    errors = [f"{aspect}: {v['error']}" for aspect, v in verdicts.items() if v["error"]]
    return "; ".join(errors)


def check_pairwise(text: str, row: dict) -> str:
    return parse_pairwise(text).error


CHECKS = {"score": check_score, "best_worst": check_best_worst, "pairwise": check_pairwise}
# finish_reason of a pairwise row decided as a tie because both candidates are the same text (no judge call)
IDENTICAL = "identical_texts"


# ---------------------------------------------------------------------------------------------------------------
# Items: what one judge call looks at


def build_score_items(batch: pd.DataFrame) -> pd.DataFrame:
    out = batch[["id", "policy", "model", "source", "candidate"]].copy()
    out["item"] = out["model"]
    return out


def build_candidate_sets(group: pd.DataFrame) -> pd.DataFrame:
    """One row per (source, policy) with all its candidates, in model-name order (the *original* order).

    Optional judge features travel along when the candidates carry them: `alignment_json` (word-alignment pairs
    per candidate) and `parse` + `source_parse` (PTB parses).
    """
    group = group.sort_values("model")
    row = {
        "id": group["id"].iloc[0], "policy": group["policy"].iloc[0], "source": group["source"].iloc[0],
        "models_json": json.dumps(list(group["model"])), "candidates_json": json.dumps(list(group["candidate"])),
        "n_candidates": len(group), "item": "set", "alignments_json": "", "parses_json": "",
    }
    if "alignment_json" in group:
        row["alignments_json"] = json.dumps([json.loads(a) if a else None for a in group["alignment_json"]])
    if "parse" in group and "source_parse" in group:
        row["parses_json"] = json.dumps({"source": group["source_parse"].iloc[0] or None,
                                         "candidates": [p or None for p in group["parse"]]})
    return pd.DataFrame([row])


def build_pair_items(group: pd.DataFrame, both_orders: bool) -> pd.DataFrame:
    group = group.sort_values("model")
    models, cands = list(group["model"]), list(group["candidate"])
    rows = []
    for i, j in itertools.combinations(range(len(models)), 2):
        orders = [(i, j), (j, i)] if both_orders else [(i, j)]
        for a, b in orders:
            rows.append({"id": group["id"].iloc[0], "policy": group["policy"].iloc[0],
                         "source": group["source"].iloc[0], "model_a": models[a], "model_b": models[b],
                         "candidate_a": cands[a], "candidate_b": cands[b], "item": f"{models[a]}|{models[b]}"})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------
# Rendering and parsing around the worker


def render_judge_requests(batch: pd.DataFrame, judge: str, template: str, fmt: str, sampling_json: str,
                          seed: int, shuffle: bool = True, constrained: bool = False,
                          thinking: bool = False) -> pd.DataFrame:
    tpl = load_template(prompt_path(template))
    out = batch.copy()
    out["judge"] = judge
    messages, orders, samplings = [], [], []
    for row in batch.to_dict("records"):
        if fmt == "score":
            msgs, order = tpl.render(base_sentence=row["source"], new_sentence=row["candidate"]), []
        elif fmt == "best_worst":
            n = int(row["n_candidates"])
            order = shuffle_order(n, seed, f"{row['id']}|{row['policy']}|{judge}") if shuffle else list(range(n))
            msgs = tpl.render(**render_candidate_set(row, order))
        else:
            msgs, order = tpl.render(source=row["source"], candidate_a=row["candidate_a"],
                                     candidate_b=row["candidate_b"]), []
        messages.append(json.dumps(msgs, ensure_ascii=False))
        orders.append(json.dumps(order))
        samplings.append(with_grammar(sampling_json, fmt, int(row.get("n_candidates") or 0), thinking)
                         if constrained else sampling_json)
    out["messages_json"], out["order_json"], out["sampling_json"] = messages, orders, samplings
    return out


def with_grammar(sampling_json: str, fmt: str, n_candidates: int = 0, thinking: bool = False) -> str:
    """The sampling JSON with the grammar of judge format `fmt` within its max_tokens (eval.judging.grammar)."""
    params = json.loads(sampling_json)
    params["grammar"] = judge_grammar(fmt, int(params["max_tokens"]), n_candidates=n_candidates, thinking=thinking)
    return json.dumps(params, sort_keys=True)


def render_candidate_set(row: dict, order: list[int]) -> dict:
    """Template values for a best/worst judge: candidates (and their features) in the shown order."""
    cands = [json.loads(row["candidates_json"])[k] for k in order]
    aligns = json.loads(row["alignments_json"]) if row.get("alignments_json") else None
    parses = json.loads(row["parses_json"]) if row.get("parses_json") else None
    return {
        "source": row["source"], "candidates": render_candidates_block(cands),
        "alignments": render_alignments_section(row["source"], cands, [aligns[k] for k in order] if aligns else None),
        "parses": render_parses_section(parses["source"], [parses["candidates"][k] for k in order])
        if parses else render_parses_section(None, None),
    }


def parse_judgments(batch: pd.DataFrame, fmt: str) -> pd.DataFrame:
    """Turn judge text into values; `parse_error` is kept (never dropped) when the text is unusable."""
    out = batch.drop(columns=["messages_json"])
    out["format"] = fmt
    scores, winners, verdicts, errors = [], [], [], []
    for row in batch.to_dict("records"):
        score, winner, verdict, error = None, "", "", row["check_error"]
        if not row["engine_error"]:
            if fmt == "score":
                parsed = parse_score(row["completion"])
                score, error = parsed.value, parsed.error
            elif fmt == "pairwise":
                parsed = parse_pairwise(row["completion"])
                winner, error = parsed.value or "", parsed.error
            else:
                verdict, error = _best_worst_in_original_order(row)
        scores.append(float(score) if score is not None else None)
        winners.append(winner)
        verdicts.append(verdict)
        errors.append(error)
    out["score"], out["winner"], out["verdict_json"], out["parse_error"] = scores, winners, verdicts, errors
    return out


def _best_worst_in_original_order(row: dict) -> tuple[str, str]:
    order = json.loads(row["order_json"])
    parsed = parse_best_worst(row["completion"], int(row["n_candidates"]))
    mapped, errors = {}, []
    for aspect, v in parsed.items():
        detail = v["error"]
        if v["error"] == "out_of_range":
            # an index the judge made up has no original candidate: kept in the error, never mapped
            best = worst = None
            detail = f"out_of_range (best {v['best']}, worst {v['worst']} of {len(order)})"
        else:
            best, worst = (to_original_index(v[k], order) if v[k] is not None else None for k in ("best", "worst"))
        mapped[aspect] = {"best": best, "worst": worst, "error": v["error"]}
        if detail:
            errors.append(f"{aspect}: {detail}")
    return json.dumps(mapped), "; ".join(errors)


# ---------------------------------------------------------------------------------------------------------------
# The stage plan


def _has_candidate(row: dict) -> bool:
    return not row["generation_error"]


def build_jury_dataset(candidates: ray.data.Dataset, jury: JuryConfig, cache_dir: str,
                       expected_candidates: int = 0) -> ray.data.Dataset:
    """For each judge: items -> rendered requests -> ChatWorker pool -> parsed judgments; unioned.

    Items are built (grouping included) and materialized in blocks of about one batch before any judge pool
    exists, for the same reasons as in the generate stage.

    Best/worst sets with fewer usable candidates than `expected_candidates` (the K generators; at least 2) are not
    shown to the judge: its guideline names K candidates, and one candidate has no best and worst. They are kept
    as rows whose `parse_error` starts with `too_few_candidates` and counted, never dropped.
    """
    usable = candidates.filter(_has_candidate, num_cpus=LIGHT_CPU)
    fmt = jury.judges[0].format
    block_rows = min(j.pool.batch_size for j in jury.judges)
    frame = _items_for(usable, fmt, jury.both_orders)
    tied = pd.DataFrame()
    if fmt == "pairwise" and jury.identical_pairs == "tie" and len(frame):
        same = frame["candidate_a"] == frame["candidate_b"]
        frame, tied = frame[~same], frame[same]
    items = ray.data.from_pandas(frame).repartition(target_num_rows_per_block=block_rows).materialize()
    short = None
    if fmt == "best_worst":
        needed = max(2, expected_candidates)
        short = items.filter(functools.partial(_too_few, needed=needed), num_cpus=LIGHT_CPU).materialize()
        items = items.filter(functools.partial(_enough, needed=needed), num_cpus=LIGHT_CPU).materialize()
    per_judge = []
    for judge in jury.judges:
        if len(tied):
            per_judge.append(ray.data.from_pandas(tied_rows(tied, judge.name)))
        if short is not None and short.count():
            per_judge.append(short.map_batches(unjudged_rows, batch_format="pandas", num_cpus=LIGHT_CPU, fn_kwargs={
                "judge": judge.name, "needed": max(2, expected_candidates)}))
        if not items.count():
            continue
        rendered = items.map_batches(render_judge_requests, batch_format="pandas", num_cpus=LIGHT_CPU, fn_kwargs={
            "judge": judge.name, "template": judge.template, "fmt": judge.format,
            "sampling_json": judge.sampling.to_json(), "seed": jury.seed,
            "shuffle": jury.candidate_order == "shuffled", "constrained": judge.constrained,
            "thinking": judge.engine.thinking})
        judged = rendered.map_batches(
            ChatWorker, batch_format="pandas",
            fn_constructor_kwargs={
                "spec": dataclasses.asdict(judge.engine), "secrets": engine_secrets(judge.engine),
                "cache_dir": cache_dir, "check": CHECKS[judge.format],
                "max_parse_retries": judge.max_parse_retries, "retry_temperature": judge.retry_temperature},
            **judge.pool.map_batches_kwargs())
        per_judge.append(judged.map_batches(parse_judgments, batch_format="pandas", num_cpus=LIGHT_CPU,
                                            fn_kwargs={"fmt": judge.format}))
    if not per_judge:
        raise ValueError("jury: no candidate to judge (every generation failed or the input is empty)")
    return per_judge[0].union(*per_judge[1:]) if len(per_judge) > 1 else per_judge[0]


def _too_few(row: dict, needed: int) -> bool:
    return int(row["n_candidates"]) < needed


def _enough(row: dict, needed: int) -> bool:
    return int(row["n_candidates"]) >= needed


def unjudged_rows(batch: pd.DataFrame, judge: str, needed: int) -> pd.DataFrame:
    """Rows for candidate sets no judge saw, shaped like parsed judgments (zero tokens, no verdict)."""
    out = batch.copy()
    out["judge"], out["order_json"], out["format"] = judge, "[]", "best_worst"
    for column in ("completion", "raw_completion", "reasoning", "finish_reason", "engine_error", "check_error",
                   "winner", "verdict_json", "sampling_json"):
        out[column] = ""
    for column in ("prompt_tokens", "completion_tokens", "attempts"):
        out[column] = 0
    out["cached"], out["worker_seconds"], out["worker_ready_at"], out["score"] = False, 0.0, 0.0, None
    out["parse_error"] = [f"too_few_candidates: {n} usable of {needed} needed" for n in batch["n_candidates"]]
    return out


def tied_rows(batch: pd.DataFrame, judge: str) -> pd.DataFrame:
    """Pairwise rows whose two candidates are the same text, decided as a tie without a judge call (zero tokens)."""
    out = unjudged_rows(batch.assign(n_candidates=2), judge, 2).drop(columns=["n_candidates"])
    out["format"], out["winner"], out["parse_error"], out["finish_reason"] = "pairwise", "tie", "", IDENTICAL
    return out


def _items_for(candidates: ray.data.Dataset, fmt: str, both_orders: bool) -> pd.DataFrame:
    """The judge items, built on the driver: the candidates are a few rows per source (K generators), and a Ray
    Data groupby is a hash shuffle whose tasks cost seconds per stage whatever the size (7-9 s for 8 sets on 2
    loaded cores)."""
    frame = candidates.to_pandas()
    if fmt == "score":
        return build_score_items(frame) if len(frame) else pd.DataFrame()
    build = build_candidate_sets if fmt == "best_worst" else functools.partial(build_pair_items,
                                                                               both_orders=both_orders)
    items = [build(group) for _, group in frame.groupby(["id", "policy"], sort=True)]
    return pd.concat(items, ignore_index=True) if items else pd.DataFrame()


def actor_incarnations(df: pd.DataFrame) -> dict[str, int]:
    """Per judge: how many actor lives produced its rows. Every ChatWorker life stamps its rows with the time its
    model became ready (`worker_ready_at`), so a pool actor that Ray restarted (its node died, it crashed) shows up
    as one more distinct stamp. Rows no actor saw (too_few_candidates: stamp 0) are not counted."""
    seen = df[df["worker_ready_at"] > 0]
    return {str(k): int(v) for k, v in seen.groupby("judge")["worker_ready_at"].nunique().items()}


def summarize_jury(df: pd.DataFrame, seconds: float) -> dict:
    """Per-stage numbers: judgments, parse failures (kept, counted), retries, tokens, throughput, and how many
    actor lives produced the rows (`actor_lives`; a life whose every output was lost with its node is not seen:
    the stage's `actor_restarts`, from Ray's actor table, is the full count)."""
    tokens = int(df["completion_tokens"].sum())
    too_few = df["parse_error"].str.startswith("too_few_candidates")
    identical = int((df["finish_reason"] == IDENTICAL).sum()) if "finish_reason" in df else 0
    lives = actor_incarnations(df)
    return {
        "rows_out": len(df), "parse_failures": int(((df["parse_error"] != "") & ~too_few).sum()),
        "sources_too_few_candidates": int(too_few.sum()), **({"identical_ties": identical} if identical else {}),
        "retried": int((df["attempts"] > 1).sum()), "engine_errors": int((df["engine_error"] != "").sum()),
        "cached": int(df["cached"].sum()), "prompt_tokens": int(df["prompt_tokens"].sum()),
        "completion_tokens": tokens, "actor_seconds": round(float(df["worker_seconds"].sum()), 3),
        "seconds": round(seconds, 3), "rows_per_s": round(len(df) / seconds, 3) if seconds else None,
        "tokens_per_s": round(tokens / seconds, 3) if seconds else None,
        "actor_lives": sum(lives.values()),
    }
