"""`AgentSimpWorker`: the Ray Data actor that runs AgentSimp (paper 004) on documents, every configuration at once.

One batch of `documents` rows (eval.agentsimp.records.document_row) in, one row per (document, configuration) out
(eval.agentsimp.records.run_rows: the DocumentRun as JSON with every stage per document and paragraph, every window
and every call). The schedules of all requested configurations of all documents in the batch advance in lockstep
(`eval.agentsimp.run.run_schedules`): each round's calls go to the engine as one batch, a call several
configurations share (PD, ALA, the CS/SS stage of all four, the pipeline stage of PL and PL†, the sync one of SYNC
and SYNC†) is made once, and the request cache (`actors.engines.cached.CachedEngine`) makes a re-run or a second
worker asking the same thing free. Within a document the iterative windows stay sequential (the plan yields them
one by one).

JSON roles are decoded under their grammar (`eval.agentsimp.grammar`) where the engine takes one: hf (llguidance),
vllm (guidance backend), openai only with `engine.structured_outputs` (a vLLM server). An answer that still fails
validation is retried with a new seed, then the stage falls back to its input (`eval.agentsimp.outputs.settle`);
the failure is in the call's record, never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pandas as pd

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.cached import CachedEngine
from actors.models import resolve_model_dir
from actors.secrets import Secrets
from eval.agentsimp.baselines import baseline_call, baseline_records
from eval.agentsimp.grammar import main_field_tokens
from eval.agentsimp.outputs import Reply, main_field_string
from eval.agentsimp.plan import PlanConfig, configurations, plan_document
from eval.agentsimp.records import document_inputs, record_rows, run_rows
from eval.agentsimp.roles import RoleBook, load_role_book
from eval.agentsimp.run import Attempt, attempt_sampling, resolve_calls, run_schedules

RUN_COLUMNS = ("doc_id", "config", "label", "final", "calls", "shared", "attempts", "cached", "fallbacks",
               "truncated", "collapsed", "record_json", "worker_seconds")


def engine_takes_grammar(spec: EngineSpec) -> bool:
    """Whether `spec`'s engine decodes under `SamplingParams.grammar` (hosted OpenAI-style APIs do not)."""
    return spec.kind in ("hf", "vllm") or (spec.kind == "openai" and spec.structured_outputs)


class RoleCompleter:
    """The `complete` function of `eval.agentsimp.run`: attempts -> rendered requests -> CachedEngine -> Replies.

    Seconds are *allocated*, not measured per call: the engine decodes a round's requests as one batch, so the
    batch's measured engine seconds are shared evenly by its fresh requests; a cache hit costs 0 s (tokens are
    those of the stored completion, so the cost table shows what the call costs when it is made). Each reply
    carries its main JSON field's token share under the grammar (`Reply.budget`) and the tokens its main field holds
    (`Reply.main_tokens`, re-tokenized with the model's tokenizer) for the truncation guard
    (`eval.agentsimp.outputs.cut_by_grammar`).
    """

    def __init__(self, engine: CachedEngine, book: RoleBook, max_tokens: Mapping[str, int] | int,
                 temperature: float, seed: int, constrained: bool):
        self.engine, self.book = engine, book
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.constrained = constrained and engine_takes_grammar(engine.spec)
        self._count = False  # the token counter, loaded on first use (None: none available)

    def request(self, attempt: Attempt) -> ChatRequest:
        sampling = attempt_sampling(attempt, self.max_tokens, self.temperature, self.seed, self.constrained)
        return ChatRequest(self.book.messages(attempt.call.role, attempt.call.inputs), SamplingParams(**sampling),
                           request_id=f"{attempt.call.role}:{attempt.call.unit}:{attempt.number}")

    def __call__(self, attempts: Sequence[Attempt]) -> list[Reply]:
        before = self.engine.usage.seconds
        results = self.engine.complete_cached([self.request(a) for a in attempts])
        fresh = sum(1 for _, hit in results if not hit)
        per_call = (self.engine.usage.seconds - before) / fresh if fresh else 0.0
        return [Reply(c.text, c.prompt_tokens, c.completion_tokens, 0.0 if hit else per_call, c.finish_reason,
                      c.error, hit, self.budget(a), self.main_tokens(a, c.text))
                for a, (c, hit) in zip(attempts, results)]

    def main_tokens(self, attempt: Attempt, text: str) -> int:
        """Tokens of the answer's main JSON field (the grammar's state for the truncation guard); -1 uncounted."""
        if not self.constrained:
            return -1
        body = main_field_string(attempt.call.role, text)
        count = self._counter()
        return -1 if body is None or count is None else count(body)

    def _counter(self):
        """The engine model's tokenizer as a token counter (loaded once); None where there is none to load."""
        if self._count is False:
            try:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(resolve_model_dir(self.engine.spec.model))
                self._count = lambda s: len(tok(s, add_special_tokens=False).input_ids)
            except Exception:  # noqa: BLE001 - a hosted model without a local tokenizer: finish reason only
                self._count = None
        return self._count

    def budget(self, attempt: Attempt) -> int:
        if not self.constrained:
            return 0
        role = attempt.call.role
        tokens = self.max_tokens if isinstance(self.max_tokens, int) else self.max_tokens[role]
        return main_field_tokens(role, tokens)


class AgentSimpWorker:
    """Callable class for `Dataset.map_batches(AgentSimpWorker, batch_format="pandas", ...)`.

    Args:
        spec: The backbone's EngineSpec as a dict (every role uses it, as the paper does).
        plan: PlanConfig fields shared by the configurations (communication/reconstruction are set per config).
        configs: Configuration names to run (eval.agentsimp.plan.CONFIGURATIONS keys).
        max_tokens: Completion tokens per role id (or one number).
        temperature, seed: Of every first attempt (paper: 0.6); retries change both (agentsimp_outputs).
        constrained: Decode JSON roles under their grammar where the engine takes one.
        max_retries: Retries of an invalid answer before the stage falls back.
        templates: Role id -> another prompt template (eval.agentsimp.roles.load_role_book).
        cache_dir: The request cache ("" = none).
        baselines: Single-prompt LLM baselines to run beside the configurations (eval.agentsimp.baselines).
        example: Template 3's rendered in-context pair (needed for llm_t3).
    """

    def __init__(self, spec: dict, plan: dict, configs: Sequence[str], max_tokens: Mapping[str, int] | int,
                 temperature: float = 0.6, seed: int = 0, constrained: bool = True, max_retries: int = 2,
                 templates: Mapping[str, str] | None = None, cache_dir: str = "", secrets: Secrets | None = None,
                 baselines: Sequence[str] = (), example: str = ""):
        if secrets is not None:
            secrets.install()
        every = configurations(PlanConfig(**plan))
        self.configs = {name: every[name] for name in configs}
        self.engine = CachedEngine(spec, cache_dir)
        self.complete = RoleCompleter(self.engine, load_role_book(templates), max_tokens, temperature, seed,
                                      constrained)
        self.max_retries = max_retries
        self.baselines, self.example = list(baselines), example

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        started = time.time()
        docs = [document_inputs(row) for row in batch.to_dict("records")]
        schedules = {(doc_id, name): plan_document(article, paragraphs, config)
                     for doc_id, article, paragraphs, _ in docs for name, config in self.configs.items()}
        runs = run_schedules(schedules, self.complete, self.max_retries)
        # the baselines' calls of every document in one round
        outcomes = resolve_calls([baseline_call(name, article, self.example) for _, article, _, _ in docs
                                  for name in self.baselines], self.complete, self.max_retries)
        rows = []
        for doc_id, article, *_ in docs:
            rows += run_rows(doc_id, {name: runs[(doc_id, name)] for name in self.configs})
            rows += record_rows(doc_id, baseline_records(article, self.baselines, outcomes, self.example))
        out = pd.DataFrame(rows, columns=[c for c in RUN_COLUMNS if c != "worker_seconds"])
        out["worker_seconds"] = (time.time() - started) / max(len(out), 1)
        return out
