"""`PlannerActionWorker`: the Ray Data actor of CRAFT's planner self-training (paper 002, Algorithm 1 lines 3-5).

One row is one constrained instance. The actor rolls the current planner out for ``history_steps`` steps to get
H_i (each step: one planner sample -> reviser -> tools -> observation, `eval.craft.agent.Systems.steps`), then
samples K candidate next actions (t_{i+1}, a_{i+1}) on H_i, has the vanilla reviser turn each plan into a revision,
and scores each with Eq. 1 (`eval.craft.selftrain.score_state`; S_r from `actors.text_quality.build_quality`:
App. D.3 by default). Greedy dev evaluation is the same call with K = 1
and temperature 0.

The planner engine carries the round's LoRA adapter (`EngineSpec.adapter`; the request cache keys on the adapter's
content, so a retrained adapter never reads an older one's completions); the reviser is the base model, as in the
paper ("a vanilla LLM"). Failed completions are kept: a planner reply with an error is an unparseable action (F1
with no calls) and a failed reviser reply an empty, degenerate revision, counted in the output, never dropped.

Output columns per row: ``prompt_messages`` (H_i as JSON), ``candidates`` (JSON list: response, tool calls,
revision, S_a and its parts, guard flag, parse errors), ``history_steps``, ``model_calls``, ``prompt_tokens``,
``completion_tokens``, ``seconds``.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pandas as pd

from actors.engines.base import ChatRequest, Completion, SamplingParams
from actors.engines.cached import CachedEngine
from actors.text_quality import build_quality
from eval.craft.agent import AgentConfig, Systems
from eval.craft.guard import GuardConfig
from eval.craft.quality import QualityConfig
from eval.craft.selftrain import ScoreWeights, score_state


def agent_config(data: dict) -> AgentConfig:
    """`AgentConfig` back from `dataclasses.asdict` (how it reaches the actor)."""
    return AgentConfig(**{**data, "guard": GuardConfig(**data["guard"])})


class PlannerActionWorker:
    """Holds the planner (base + LoRA adapter) and the reviser engines; scores K sampled actions per row."""

    def __init__(self, planner_spec: dict, reviser_spec: dict, agent: dict, weights: dict, k: int,
                 cache_dir: str = "", seed: int = 0, quality: dict | None = None):
        self.planner = CachedEngine(planner_spec, cache_dir)
        # one engine object when both roles are the same model without an adapter (no second copy in memory)
        same = dict(planner_spec) == dict(reviser_spec)
        self.reviser = self.planner if same else CachedEngine(reviser_spec, cache_dir)
        self.config = agent_config(agent)
        self.weights = ScoreWeights(**weights)
        self.k, self.seed = k, seed
        self.systems = Systems(self.config, self._llm(self.planner), self._llm(self.reviser), seed=seed,
                               quality=build_quality(QualityConfig(**(quality or {}))))

    @staticmethod
    def _llm(model: CachedEngine):
        def call(batch: list[tuple[list[dict], dict]]) -> list[Completion]:
            return model.complete([ChatRequest(messages, SamplingParams(**sampling)) for messages, sampling in batch])
        return call

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        out = []
        for row in batch.to_dict("records"):
            started = time.time()
            out.append({**self._row(row), "seconds": round(time.time() - started, 3)})
        return pd.concat([batch.reset_index(drop=True), pd.DataFrame(out)], axis=1)

    def _row(self, row: dict) -> dict:
        history, current, candidates = score_state(
            self.systems, row["instruction"], row["text"], [str(c) for c in json.loads(row["gold_calls_json"])],
            history_steps=int(row.get("history_steps", 0)), k=self.k, seed=int(row.get("seed", 0)),
            weights=self.weights)
        usage = self.planner.take_usage()
        if self.reviser is not self.planner:
            usage.add(self.reviser.take_usage())
        return {"prompt_messages": json.dumps(history, ensure_ascii=False), "current_text": current,
                "candidates": json.dumps(candidates, ensure_ascii=False), "n_candidates": len(candidates),
                "model_calls": usage.calls, "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens, "cache_hits": usage.cache_hits}


def greedy(agent: AgentConfig) -> dict:
    """The agent config for greedy dev decoding (temperature 0), as the actor's constructor takes it."""
    return dataclasses.asdict(dataclasses.replace(agent, planner_temperature=0.0))
