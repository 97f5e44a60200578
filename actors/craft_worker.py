"""`CraftWorker`: the Ray Data actor of the CRAFT job (paper 002): one CORD row's systems per row of a batch.

For each CORD row of a batch it runs the configured systems (``direct``, ``iter``, ``agent``, ``mcts``;
``mcts_oracle_rc``: the same search with CORD's gold calls as R_c's list, ``rc_tools: oracle``, the planner
unchanged; ``mcts_gold_planner``: the search with the gold planner, ``eval.craft.gold_plan``, whose tools are the
gold calls and whose plan follows them, R_c on the gold calls too; the loops are ``eval.craft.agent``, the search
``eval.craft.mcts``) with the planner and reviser models behind
``actors.engines.cached.CachedEngine`` (one engine when both specs are equal), and returns one output row per
(CORD row, system): the revision, the system's own record (steps, stop reason, guard flags, parse errors), and its
cost (LLM calls sent to a model, prompt / completion tokens, seconds, cache hits). Nothing is dropped: a CORD row
kept with an ``error`` (``data.on_error: keep``) yields one failed row per system without calling a model, and a
system that raises is recorded with its error (``ErrorType: message``) and an empty revision.

Text quality (R_g, ``eval.craft.quality``) comes from ``actors.text_quality.build_quality(quality)``: the search's
reward, the agent's step reward and ``text_eval()``, and the score of every system's answer (``quality``,
``quality_json``) and of the input itself (``copy_quality``, ``copy_quality_json``: the copy floor's). A search row's
``detail_json`` also holds ``children_vs_copy`` (``eval.craft.results.children_beating_copy``).
"""

from __future__ import annotations

import dataclasses
import json
import time

import pandas as pd

from actors.engines.base import ChatRequest, SamplingParams
from actors.engines.cached import CachedEngine, Usage
from actors.secrets import Secrets
from actors.text_quality import build_quality
from eval.craft.agent import AgentConfig, Systems, expander
from eval.craft.gold_plan import gold_planner_output
from eval.craft.guard import GuardConfig
from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig
from eval.craft.quality import QualityConfig
from eval.craft.results import children_beating_copy

SYSTEMS = ("direct", "iter", "agent", "mcts", "mcts_oracle_rc", "mcts_gold_planner")
SEARCHES = ("mcts", "mcts_oracle_rc", "mcts_gold_planner")
RUN_COLUMNS = ("system", "revision", "error", "stop_reason", "parse_errors", "guard_flags_json", "detail_json",
               "quality", "quality_json", "copy_quality", "copy_quality_json",
               "llm_calls", "prompt_tokens", "completion_tokens", "seconds", "cache_hits", "engine_errors")


def _section(cls, data: dict):
    """A frozen config section back from its `dataclasses.asdict` form (the nested guard too)."""
    return cls(**{**data, "guard": GuardConfig(**data["guard"])})


class CraftWorker:
    """Callable class for `Dataset.map_batches(CraftWorker, batch_format="pandas", ...)` over CordRow.to_row rows."""

    def __init__(self, planner: dict, reviser: dict, agent: dict, mcts: dict, systems: list[str],
                 cache_dir: str = "", seed: int = 0, secrets: Secrets | None = None, quality: dict | None = None):
        if secrets is not None:
            secrets.install()  # the engines' API keys, by name (actors.secrets)
        self.planner = CachedEngine(planner, cache_dir)
        # planner == reviser (the demo, and the paper's 8B setting with one model) shares one loaded model
        self.reviser = self.planner if reviser == planner else CachedEngine(reviser, cache_dir)
        self.engine_errors = 0
        self.quality = build_quality(QualityConfig(**(quality or {})))
        self.systems = Systems(_section(AgentConfig, agent), self._llm(self.planner), self._llm(self.reviser), seed,
                               quality=self.quality)
        self.mcts = _section(MCTSConfig, mcts)
        self.names = list(systems)

    def _llm(self, model: CachedEngine):
        def complete(batch: list[tuple[list[dict], dict]]):
            requests = [ChatRequest(messages=m, sampling=SamplingParams(**s)) for m, s in batch]
            out = model.complete(requests)
            self.engine_errors += sum(c.finish_reason == "error" for c in out)
            return out
        return complete

    def _take_usage(self) -> Usage:
        usage = self.planner.take_usage()
        if self.reviser is not self.planner:
            usage.add(self.reviser.take_usage())
        return usage

    def run_one(self, row: dict, system: str) -> dict:
        """One system on one CORD row: the output columns of RUN_COLUMNS."""
        self._take_usage()
        self.engine_errors = 0
        started = time.time()
        out = {"system": system, "revision": "", "error": "", "stop_reason": "", "parse_errors": 0,
               "guard_flags_json": "{}", "detail_json": "{}", "quality": 0.0, "quality_json": "{}",
               "copy_quality": 0.0, "copy_quality_json": "{}"}
        if row.get("error"):
            out["error"] = f"bad input: {row['error']}"
        else:
            try:
                out.update(self._run(row, system))
                copy, answer = self.quality(row["text"], [row["text"], out["revision"]])
                out.update(quality=answer.value, quality_json=json.dumps(answer.parts),
                           copy_quality=copy.value, copy_quality_json=json.dumps(copy.parts))
            except Exception as exc:  # noqa: BLE001 - kept and counted as a failed row, never dropped
                out["error"] = f"{type(exc).__name__}: {exc}"
        usage = self._take_usage()
        out.update(llm_calls=usage.calls, prompt_tokens=usage.prompt_tokens,
                   completion_tokens=usage.completion_tokens, cache_hits=usage.cache_hits,
                   seconds=time.time() - started, engine_errors=self.engine_errors)
        return out

    def _run(self, row: dict, system: str) -> dict:
        # CORD's instruction as the paper's systems read it (ending in a colon before the text)
        instruction, text = row.get("prompt_instruction") or row["instruction"], row["text"]
        if system in SEARCHES:
            config = self.mcts if system == "mcts" else dataclasses.replace(self.mcts, rc_tools="oracle")
            gold = [str(c) for c in row.get("gold_calls", [])]
            fixed = gold if config.rc_tools in ("fixed", "oracle") else None
            # the gold planner: CORD's gold calls as its tools and a plan that follows them (no planner model)
            planner_fn = (lambda current: gold_planner_output(current, text, gold)) \
                if system == "mcts_gold_planner" else None
            initial = self.systems.initial_messages(instruction, text)
            result = run_search(text, initial, expander(self.systems, text, planner_fn), self.systems.scorer, config,
                                fixed_calls=fixed)
            constraints = json.loads(row.get("constraints_json") or "[]")
            detail = {"stop_reason": result.stop_reason, "path": result.path, "node_id": result.node_id,
                      "counts": result.to_dict()["counts"], "rc_calls": result.rc_calls,
                      "children_vs_copy": children_beating_copy(result.tree, constraints, text)}
            return {"revision": result.text, "stop_reason": result.stop_reason,
                    "parse_errors": result.counts.parse_errors,
                    "guard_flags_json": json.dumps(result.counts.degenerate_reasons),
                    "detail_json": json.dumps(detail, ensure_ascii=False)}
        run = {"direct": self.systems.direct, "iter": self.systems.iterate, "agent": self.systems.agent}[system](
            instruction, text)
        return {"revision": run.revision, "stop_reason": run.stop_reason, "parse_errors": run.parse_errors,
                "guard_flags_json": json.dumps(run.guard_flags),
                "detail_json": json.dumps({"steps": run.steps}, ensure_ascii=False)}

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        self.planner.load()
        self.reviser.load()
        rows = []
        for row in batch.to_dict("records"):
            for system in self.names:
                rows.append({**row, **self.run_one(row, system)})
        return pd.DataFrame(rows)
