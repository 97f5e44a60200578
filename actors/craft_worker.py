"""`CraftWorker`: the Ray Data actor of the CRAFT job (paper 002): one CORD row's systems per row of a batch.

For each CORD row of a batch it runs the configured systems (``direct``, ``iter``, ``agent``, ``mcts``; the loops are
``eval.craft.agent``, the search ``eval.craft.mcts``) with the planner and reviser models behind
``actors.engines.cached.CachedEngine`` (one engine when both specs are equal), and returns one output row per
(CORD row, system): the revision, the system's own record (steps, stop reason, guard flags, parse errors), and its
cost (LLM calls sent to a model, prompt / completion tokens, seconds, cache hits). Nothing is dropped: a CORD row
kept with an ``error`` (``data.on_error: keep``) yields one failed row per system without calling a model, and a
system that raises is recorded with its error (``ErrorType: message``) and an empty revision.
"""

from __future__ import annotations

import json
import time

import pandas as pd

from actors.engines.base import ChatRequest, SamplingParams
from actors.engines.cached import CachedEngine, Usage
from actors.secrets import Secrets
from eval.craft.agent import AgentConfig, Systems, expander, scorer
from eval.craft.guard import GuardConfig
from eval.craft.mcts import run_search
from eval.craft.mcts_config import MCTSConfig

SYSTEMS = ("direct", "iter", "agent", "mcts")
RUN_COLUMNS = ("system", "revision", "error", "stop_reason", "parse_errors", "guard_flags_json", "detail_json",
               "llm_calls", "prompt_tokens", "completion_tokens", "seconds", "cache_hits", "engine_errors")


def _section(cls, data: dict):
    """A frozen config section back from its `dataclasses.asdict` form (the nested guard too)."""
    return cls(**{**data, "guard": GuardConfig(**data["guard"])})


class CraftWorker:
    """Callable class for `Dataset.map_batches(CraftWorker, batch_format="pandas", ...)` over CordRow.to_row rows."""

    def __init__(self, planner: dict, reviser: dict, agent: dict, mcts: dict, systems: list[str],
                 cache_dir: str = "", seed: int = 0, secrets: Secrets | None = None):
        if secrets is not None:
            secrets.install()  # the engines' API keys, by name (actors.secrets)
        self.planner = CachedEngine(planner, cache_dir)
        # planner == reviser (the demo, and the paper's 8B setting with one model) shares one loaded model
        self.reviser = self.planner if reviser == planner else CachedEngine(reviser, cache_dir)
        self.engine_errors = 0
        self.systems = Systems(_section(AgentConfig, agent), self._llm(self.planner), self._llm(self.reviser), seed)
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
               "guard_flags_json": "{}", "detail_json": "{}"}
        if row.get("error"):
            out["error"] = f"bad input: {row['error']}"
        else:
            try:
                out.update(self._run(row, system))
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
        if system == "mcts":
            initial = self.systems.initial_messages(instruction, text)
            result = run_search(text, initial, expander(self.systems, text), scorer, self.mcts)
            detail = {"stop_reason": result.stop_reason, "path": result.path, "node_id": result.node_id,
                      "counts": result.to_dict()["counts"]}
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
