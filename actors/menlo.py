"""MENLO judge stage: protocol items x judges -> ChatWorker actor pools -> grades parsed with the shared parser.

Items arrive rendered (`messages_json`, from eval.judging.menlo_data.build_items); this module adds each judge's sampling,
runs one `ChatWorker` pool per judge (Ray Data), and parses every answer with eval.judging.menlo_parse: pointwise calls with
`parse_menlo_grade`, pairwise calls with `parse_menlo_grades` (the parser of the GRM service and the RL reward).
Grades are mapped back to the pair's original A/B identity. An answer without extractable grades is retried (new
seed) up to `max_parse_retries` times, then kept with `parse_error` set: no row is ever dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd
import ray.data

from actors.chat_worker import ChatWorker
from actors.jury import with_grammar
from actors.stage_config import LIGHT_CPU, ModelConfig, engine_secrets
from eval.judging.menlo_data import to_original
from eval.judging.menlo_parse import parse_menlo_grade, parse_menlo_grades


@dataclass
class MenloJudgeConfig(ModelConfig):
    # re-ask a judge whose answer has no extractable grade (new seed, at least retry_temperature); 0 = never
    max_parse_retries: int = 0
    retry_temperature: float = 0.7  # lowest temperature of a retry (a greedy retry would repeat itself)
    # decode MENLO's `<think>` + grade blocks under their grammar (eval.judging.grammar): every finished answer has
    # its grades. Off = free text, as paper 003 ran its judges (docs/papers/003-menlo.md, Deviations)
    constrained: bool = True


def parse_for_mode(text: str | None, mode: str):
    """The shared MENLO parser for a protocol mode (pointwise: one block; pairwise: A and B)."""
    return parse_menlo_grade(text) if mode == "pointwise" else parse_menlo_grades(text)


def check_menlo(text: str, row: dict) -> str:
    """ChatWorker retry check: the extraction error of the row's mode ("" = usable)."""
    return parse_for_mode(text, row["mode"]).error


def attach_judge(batch: pd.DataFrame, judge: str, sampling_json: str, constrained: bool = False) -> pd.DataFrame:
    out = batch.copy()
    out["judge"] = judge
    # the grammar follows each row's protocol mode (one grade block pointwise, A and B pairwise)
    out["sampling_json"] = ([with_grammar(sampling_json, mode) for mode in out["mode"]] if constrained
                            else sampling_json)
    # the worker's request id: lets a hosted endpoint's logs point back at the item
    out["id"] = out["item_id"]
    return out


def parse_menlo_judgments(batch: pd.DataFrame) -> pd.DataFrame:
    """Completion -> pred_a / pred_b (original identity), parse_error, format_ok, format_errors; rows kept.

    The verbatim output (`raw_completion`) is parsed, so the `<think>` tags count in the format check.
    """
    out = batch.drop(columns=["messages_json", "sampling_json", "id"])
    pred_a, pred_b, errors, format_ok, format_errors = [], [], [], [], []
    for row in batch.to_dict("records"):
        text = row["raw_completion"] or row["completion"]
        parsed = parse_for_mode(text, row["mode"])
        a, b = to_original(row["unit"], parsed.grade_a, parsed.grade_b)
        if row["mode"] == "pairwise" and parsed.error:
            a = b = None  # a half-read pairwise answer does not count as one grade (and no preference)
        engine_error = row["engine_error"]
        pred_a.append(float(a) if a is not None else None)
        pred_b.append(float(b) if b is not None else None)
        errors.append(f"engine_error: {engine_error}" if engine_error else parsed.error)
        format_ok.append(bool(parsed.format_ok) and not engine_error)
        format_errors.append("; ".join(parsed.format_errors))
    out["pred_a"], out["pred_b"], out["parse_error"] = pred_a, pred_b, errors
    out["format_ok"], out["format_errors"] = format_ok, format_errors
    return out


def build_menlo_dataset(items: ray.data.Dataset, judges: list[MenloJudgeConfig], cache_dir: str) -> ray.data.Dataset:
    """For each judge: items + sampling -> ChatWorker pool -> parsed judgments; the judges' outputs unioned."""
    per_judge = []
    for judge in judges:
        requests = items.map_batches(attach_judge, batch_format="pandas", num_cpus=LIGHT_CPU, fn_kwargs={
            "judge": judge.name, "sampling_json": judge.sampling.to_json(), "constrained": judge.constrained})
        judged = requests.map_batches(
            ChatWorker, batch_format="pandas",
            fn_constructor_kwargs={
                "spec": dataclasses.asdict(judge.engine), "secrets": engine_secrets(judge.engine),
                "cache_dir": cache_dir, "check": check_menlo,
                "max_parse_retries": judge.max_parse_retries, "retry_temperature": judge.retry_temperature},
            **judge.pool.map_batches_kwargs())
        per_judge.append(judged.map_batches(parse_menlo_judgments, batch_format="pandas", num_cpus=LIGHT_CPU))
    return per_judge[0].union(*per_judge[1:]) if len(per_judge) > 1 else per_judge[0]


def summarize_judgments(df: pd.DataFrame, seconds: float) -> dict:
    """Stage numbers: judge calls, parse failures (kept, counted), format violations, retries, tokens, speed."""
    tokens = int(df["completion_tokens"].sum())
    return {
        "rows_out": len(df), "parse_failures": int((df["parse_error"] != "").sum()),
        "format_violations": int((~df["format_ok"]).sum()), "retried": int((df["attempts"] > 1).sum()),
        "engine_errors": int((df["engine_error"] != "").sum()), "cached": int(df["cached"].sum()),
        "prompt_tokens": int(df["prompt_tokens"].sum()), "completion_tokens": tokens,
        "seconds": round(seconds, 3), "rows_per_s": round(len(df) / seconds, 3) if seconds else None,
        "tokens_per_s": round(tokens / seconds, 3) if seconds else None,
    }
