"""Stages of `jobs.craft.selftrain` (CRAFT planner self-training, paper 002 §5.1.2 / Algorithm 1).

instances (dev set + training pool of constrained texts) -> sft_data -> sft (LoRA SFT) -> dev_0 -> per round r:
r<r>_candidates (K sampled actions per state, scored with Eq. 1) -> r<r>_pairs (best/worst) -> r<r>_train
(CPO-SimPO = SimPO + NLL, from the previous adapter) -> r<r>_dev (greedy actions on the dev set, mean S_a).
Every stage is a run-store stage: a second run with the same config reuses each finished one.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pandas as pd
import pyarrow as pa

from actors.craft_selftrain_worker import PlannerActionWorker, greedy
from core.errors import ConfigError, CorpusError
from core.files import json_object, read_utf8
from core.runstore import RunStore, StageResult, write_table
from eval.craft.cord import read_cord
from eval.craft.instances import (
    RawText,
    constraint_mix,
    contradictions,
    first_sentences,
    make_instance,
    read_raw_texts,
)
from eval.craft.react import parse_planner_output
from eval.craft.selftrain import ActionScore, dev_summary, oracle_step, pick_pair, sft_rows
from train.preference.trainer import train_stage

INSTANCE_COLUMNS = ("id", "split", "text", "instruction", "gold_calls_json", "keep_ids", "n_constraints",
                    "constraint_types")


def _instance_row(instance, split: str) -> dict:
    return {"id": instance.id, "split": split, "text": instance.text, "instruction": instance.instruction,
            "gold_calls_json": json.dumps(instance.gold_calls), "keep_ids": instance.keep_ids,
            "n_constraints": len(instance.constraints), "constraint_types": [c.type for c in instance.constraints]}


def build_instances(data, round_no: int, texts: pd.DataFrame) -> list:
    """Round ``round_no``'s training instances (0 = the SFT set): a seeded sample of the pool's texts, each with
    M ~ U{0..max_constraints} fresh constraints (Algorithm 1 line 2: new samples and constraints per iteration)."""
    rng = random.Random(f"{data.seed}:{round_no}")
    ids = list(texts.index)
    chosen = rng.sample(ids, min(data.train_texts, len(ids)))
    return [make_instance(f"{texts.at[i, 'id']}#r{round_no}", texts.at[i, "text"], rng,
                          rng.randint(0, data.max_constraints), slack=data.slack, round_to=data.round_to)
            for i in chosen]


def _raw_texts(data) -> tuple[list, dict]:
    """D_r's texts (CORD rows of ``data.levels`` or plain texts) within the paper's 350-1,000-word filter, and the
    counts of what was read, kept and skipped (logged in the stage summary)."""
    if data.format == "text":
        return read_raw_texts(data.path, data.min_words, data.max_words)
    rows = [RawText(r.id, r.text, r.source) for r in read_cord(data.path, levels=data.levels)]
    counts = {"read": len(rows), "kept": 0, "too_short": 0, "too_long": 0, "empty": 0}
    kept = []
    for row in rows:
        n = len(row.text.split())
        reason = "empty" if n == 0 else "too_short" if data.min_words and n < data.min_words else \
            "too_long" if data.max_words and n > data.max_words else ""
        counts[reason or "kept"] += 1
        kept += [] if reason else [row]
    return kept, counts


def stage_instances(store: RunStore, data) -> StageResult:
    """The raw texts D_r (CORD rows of ``data.levels``, cut to ``max_sentences``), split into a fixed dev set with
    sampled constraints and a training pool of bare texts."""
    def produce(out_dir: str) -> dict:
        rows, read = _raw_texts(data)
        rng = random.Random(data.seed)
        rng.shuffle(rows)
        if len(rows) < data.dev_texts + 1:
            raise ConfigError(f"data: {len(rows)} texts in {data.path} (levels {data.levels}) cannot give "
                              f"{data.dev_texts} dev texts and a training pool")
        dev_rng = random.Random(f"{data.seed}:dev")
        dev = [make_instance(r.id, first_sentences(r.text, data.max_sentences), dev_rng,
                             dev_rng.randint(0, data.max_constraints), slack=data.slack, round_to=data.round_to)
               for r in rows[: data.dev_texts]]
        out = [_instance_row(i, "dev") for i in dev]
        out += [{"id": r.id, "split": "pool", "text": first_sentences(r.text, data.max_sentences), "instruction": "",
                 "gold_calls_json": "[]", "keep_ids": [], "n_constraints": 0, "constraint_types": []}
                for r in rows[data.dev_texts:]]
        write_table(pa.Table.from_pylist(out), out_dir)
        return {"dev": len(dev), "pool": len(rows) - len(dev), "dev_constraints": constraint_mix(dev),
                "texts": read, "dev_contradictory": sum(bool(contradictions(i)) for i in dev)}

    return store.run_stage("instances", dataclasses.asdict(data), produce)


def pool_texts(store: RunStore) -> pd.DataFrame:
    frame = store.read_stage("instances").to_pandas()
    return frame[frame["split"] == "pool"].reset_index(drop=True)


def stage_sft_data(store: RunStore, cfg, planner_initial) -> StageResult:
    """SFT rows (prompt = H_{i-1}, target = t_i + a_i). ``oracle``: one demo step per instance, built from its
    predefined calls (no GPT-4o teacher on CPU); ``jsonl``: rows ``{prompt_messages, target}`` from a file, e.g.
    steps of agent runs."""
    def produce(out_dir: str) -> dict:
        if cfg.sft.source == "jsonl":
            rows = _read_sft_jsonl(cfg.sft.path)
        else:
            rows = []
            for inst in build_instances(cfg.data, 0, pool_texts(store)):
                step = oracle_step(inst.text, inst.gold_calls, inst.keep_ids)
                rows += sft_rows(planner_initial(inst.instruction, inst.text), [(step, "")])
        write_table(pa.Table.from_pylist([{"prompt_messages": json.dumps(r["prompt_messages"], ensure_ascii=False),
                                           "target": r["target"]} for r in rows]), out_dir)
        return {"rows_out": len(rows), "source": cfg.sft.source}

    return store.run_stage("sft_data", {"sft": dataclasses.asdict(cfg.sft), "agent": dataclasses.asdict(cfg.agent)},
                           produce)


def _read_sft_jsonl(path: str) -> list[dict]:
    """Trajectory steps as trainer rows; a bad line raises CorpusError naming the file and line."""
    rows = []
    for lineno, line in enumerate(read_utf8(path, CorpusError).split("\n"), start=1):
        if not line.strip():
            continue
        record = json_object(line, f"{path}: line {lineno}", CorpusError)
        if not isinstance(record.get("prompt_messages"), list) or not isinstance(record.get("target"), str):
            raise CorpusError(f"{path}: line {lineno}: needs 'prompt_messages' (a list) and 'target' (a string)")
        rows.append({"prompt_messages": record["prompt_messages"], "target": record["target"]})
    return rows


def stage_train(store: RunStore, name: str, trainer, rows: list[dict], key: dict, wandb_dir: str) -> StageResult:
    """A LoRA training stage through the shared preference/SFT trainer (`train.trainer.train_stage`)."""
    def produce(out_dir: str) -> dict:
        return train_stage(trainer, rows, None, out_dir=out_dir, wandb_dir=wandb_dir, where=key["where"])

    # W&B's mode, group, entity and tags say where the run logs, not what it trains: a resume online still matches
    logging_only = ("wandb_entity", "wandb_mode", "wandb_group", "wandb_tags")
    trained = {k: v for k, v in dataclasses.asdict(trainer).items() if k not in logging_only}
    return store.run_stage(name, {**key, "trainer": trained}, produce)


def adapter_of(store: RunStore, train_stage_name: str) -> str:
    return f"{store.stage_path(train_stage_name)}/run/adapter"


def score_states(cfg, frame: pd.DataFrame, adapter: str, *, k: int, agent: dict, cache_dir: str) -> pd.DataFrame:
    """Run `PlannerActionWorker` over instance rows on a Ray Data actor pool; returns the rows with candidates."""
    import ray.data

    planner = dataclasses.asdict(dataclasses.replace(cfg.planner.engine, adapter=adapter))
    reviser = dataclasses.asdict(cfg.reviser)
    # list columns stay behind: the actor reads the JSON columns, and empty lists trip Ray's block size estimate
    frame = frame.drop(columns=[c for c in ("keep_ids", "constraint_types") if c in frame])
    ds = ray.data.from_pandas(frame).map_batches(
        PlannerActionWorker, batch_format="pandas",
        fn_constructor_kwargs={"planner_spec": planner, "reviser_spec": reviser, "agent": agent,
                               "weights": dataclasses.asdict(cfg.rounds.weights), "k": k, "cache_dir": cache_dir,
                               "seed": cfg.data.seed, "quality": dataclasses.asdict(cfg.quality)},
        **cfg.planner.pool.map_batches_kwargs())
    return ds.to_pandas().sort_values("id", kind="stable").reset_index(drop=True)


def stage_candidates(store: RunStore, cfg, round_no: int, adapter: str, cache_dir: str) -> StageResult:
    """Algorithm 1 lines 2-5: fresh constrained instances, H_i with i ~ U{0..max_history_steps}, K samples each."""
    def produce(out_dir: str) -> dict:
        instances = build_instances(cfg.data, round_no, pool_texts(store))
        rng = random.Random(f"{cfg.data.seed}:{round_no}:steps")
        frame = pd.DataFrame([{**_instance_row(i, "train"), "history_steps": rng.randint(0, cfg.rounds.max_history_steps),
                               "seed": 7919 * round_no + n} for n, i in enumerate(instances)])
        agent = dataclasses.asdict(dataclasses.replace(cfg.agent, planner_temperature=cfg.rounds.temperature))
        scored = score_states(cfg, frame, adapter, k=cfg.rounds.k, agent=agent, cache_dir=cache_dir)
        write_table(_table(scored), out_dir)
        return {"states": len(scored), "candidates": int(scored["n_candidates"].sum()),
                "model_calls": int(scored["model_calls"].sum()), "constraints": constraint_mix(instances),
                "contradictory": sum(bool(contradictions(i)) for i in instances)}

    return store.run_stage(f"r{round_no}_candidates", candidates_key(cfg, round_no, adapter), produce)


def candidates_key(cfg, round_no: int, adapter: str) -> dict:
    """What a round's candidates depend on. Not `max_rounds`, the stop rule or the trainer: raising max_rounds
    reuses the finished rounds (the trainer reaches later rounds through the stage chain)."""
    r = cfg.rounds
    return {"round": round_no, "adapter": adapter, **model_key(cfg), "k": r.k, "temperature": r.temperature,
            "max_history_steps": r.max_history_steps, "weights": dataclasses.asdict(r.weights),
            "data": dataclasses.asdict(cfg.data)}


def _table(frame: pd.DataFrame) -> pa.Table:
    """Arrow table without pandas metadata (Ray's ArrowDtype columns would not read back into pandas)."""
    return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)


def stage_pairs(store: RunStore, cfg, round_no: int) -> StageResult:
    """Best / worst action per state (ties, empty responses and states without a usable revision dropped and
    counted; a degenerate revision is never chosen)."""
    def produce(out_dir: str) -> dict:
        pairs, reasons = [], {}
        for row in store.read_stage(f"r{round_no}_candidates").to_pylist():
            cands = json.loads(row["candidates"])
            # the guard's flag decides first: a degenerate revision is never the chosen response
            picked = pick_pair([c["score"] for c in cands], [c["response"] for c in cands], cfg.rounds.min_margin,
                               degenerate=[c.get("degenerate", "") for c in cands])
            if isinstance(picked, str):
                reasons[picked] = reasons.get(picked, 0) + 1
                continue
            best, worst = cands[picked.chosen], cands[picked.rejected]
            pairs.append({"id": row["id"], "prompt_messages": row["prompt_messages"], "chosen": best["response"],
                          "rejected": worst["response"], "margin": picked.margin, "chosen_score": best["score"],
                          "rejected_score": worst["score"]})
        schema = pa.schema([("id", pa.string()), ("prompt_messages", pa.string()), ("chosen", pa.string()),
                            ("rejected", pa.string()), ("margin", pa.float64()), ("chosen_score", pa.float64()),
                            ("rejected_score", pa.float64())])
        write_table(pa.Table.from_pylist(pairs, schema=schema), out_dir)
        return {"pairs": len(pairs), **{f"dropped_{k}": v for k, v in sorted(reasons.items())}}

    return store.run_stage(f"r{round_no}_pairs", {"round": round_no, "min_margin": cfg.rounds.min_margin}, produce)


def stage_dev(store: RunStore, cfg, round_no: int, adapter: str, cache_dir: str) -> StageResult:
    """The planner's dev score: one greedy action per dev instance (H_0), scored with Eq. 1, averaged."""
    def produce(out_dir: str) -> dict:
        frame = store.read_stage("instances").to_pandas()
        frame = frame[frame["split"] == "dev"].reset_index(drop=True).assign(history_steps=0, seed=0)
        scored = score_states(cfg, frame, adapter, k=1, agent=greedy(cfg.agent), cache_dir=cache_dir)
        write_table(_table(scored), out_dir)
        scores = [ActionScore(c["score"], c["tool_f1"], c["quality"], c["accuracy"], c["n_calls"], c["degenerate"])
                  for cands in scored["candidates"] for c in json.loads(cands)]
        parsed = [parse_planner_output(c["response"]) for cands in scored["candidates"] for c in json.loads(cands)]
        return {**dev_summary(scores), "dev_parse_errors": sum(bool(p.errors) for p in parsed), "adapter": adapter}

    key = {"round": round_no, "adapter": adapter, **model_key(cfg), "weights": dataclasses.asdict(cfg.rounds.weights)}
    return store.run_stage(f"r{round_no}_dev" if round_no else "dev_0", key, produce)


def model_key(cfg) -> dict:
    """What decides a planner's sampled actions besides its adapter (part of every scoring stage's hash)."""
    return {"planner": dataclasses.asdict(cfg.planner), "reviser": dataclasses.asdict(cfg.reviser),
            "agent": dataclasses.asdict(cfg.agent), "quality": dataclasses.asdict(cfg.quality)}
