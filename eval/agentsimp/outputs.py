"""AgentSimp (paper 004) role calls: retry-or-fall-back and the guards, as pure data.

Each answer is parsed and validated by `eval.agentsimp.parse` (tolerant extraction, strict schemas, "None"
findings); this module decides what happens to a call whose answer fails there, or trips a guard.

**Retries** (`decide`, `settle`): an answer that fails extraction or validation, or an engine error, is retried
up to `max_retries` times (new seed, `retry_sampling`); then the stage *falls back* to the value given by the plan
(the stage's input, e.g. the unsimplified paragraph), and the `RoleOutcome` records every raw answer, every error
and `fell_back=True`. Nothing raises on model output, and nothing is dropped.

**Guards** (`guard_error`): two answers fall back to the stage's input at once, without a retry (a retry under the
same budget is cut again), recorded in `RoleOutcome.guard`:

- ``truncated``: judged by the finish reason and the grammar's state, never by a share of all completion tokens.
  The engine stopped at the token limit (``finish_reason == "length"``, any role); or, for a JSON answer decoded
  under its grammar, the grammar closed the **main field** (the article, paragraph, suggestions) because that
  field's own token share ran out (`Reply.budget`, from `eval.agentsimp.grammar.main_field_tokens`): the grammar
  closes a string when its share runs out, so a cut article still parses. The caller counts the main field's
  tokens (`Reply.main_tokens`, the decoded string re-tokenized with the engine's tokenizer: `main_field_string`)
  and the field counts as closed by the grammar when it holds at least ``budget - grammar_slack(budget)`` tokens
  (re-tokenizing a decoded string can merge a few of the sampled tokens). The other fields' tokens (a proofreader's
  findings) never count against the article: a complete 400-token article plus 60 tokens of findings under a
  443-token article share is not cut. Without a count (``main_tokens = -1``: no tokenizer, e.g. a hosted API)
  only the finish reason decides.
- ``collapsed``: a call with ``min_ratio`` > 0 (the architect and the proofreader: document-level rewrites that
  must not shorten the article) answered with fewer than ``min_ratio`` × the words of its input, or with one
  sentence where its input had three or more (`collapsed`).

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from eval.agentsimp.grammar import field_tokens
from eval.agentsimp.parse import RoleValue, parse_output, role_fields
from eval.metrics.textnorm import count_punkt_sentences

ACCEPT, RETRY, FALL_BACK = "accept", "retry", "fallback"
TRUNCATED, COLLAPSED = "truncated", "collapsed"
GUARDS = (TRUNCATED, COLLAPSED)
# retries draw a new sample; a greedy retry would repeat itself, so they run at least this hot (as the juries do)
RETRY_MIN_TEMPERATURE = 0.7


@dataclass(frozen=True)
class Reply:
    """One engine answer to one attempt (the fields of `actors.engines.base.Completion` the plan needs, plus timing)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"
    error: str = ""
    cached: bool = False
    # the main JSON field's token share under the role's grammar (0: decoded freely or a free-text role)
    budget: int = 0
    # tokens of the main JSON field's string as decoded (re-tokenized by the caller; -1: not counted)
    main_tokens: int = -1


@dataclass(frozen=True)
class RoleOutcome:
    """The settled result of one role call: its value and the history behind it.

    Attributes:
        value: The accepted value, or the fallback when every attempt failed.
        attempts: Engine answers used (1 + retries).
        errors: One error code per failed attempt, in order ("" never appears).
        fell_back: True when `value` is the fallback, not a model answer.
        raws: The raw text of every attempt, in order.
        prompt_tokens, completion_tokens, seconds, cached: Summed over attempts (cached = attempts served from
            the request cache).
        guard: "truncated" or "collapsed" when a guard made the call fall back (module docstring), else "".
    """

    value: RoleValue
    attempts: int
    errors: tuple[str, ...] = ()
    fell_back: bool = False
    raws: tuple[str, ...] = field(default=(), repr=False)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached: int = 0
    guard: str = ""


# ----------------------------------------------------------------------------- retry policy


def decide(errors: Sequence[str], max_retries: int) -> str:
    """What to do after the attempts so far, given one error per attempt ("" = that attempt parsed).

    ACCEPT when the last attempt parsed; RETRY while there were at most `max_retries` failures (so at most
    1 + max_retries attempts in all; no attempt yet also means RETRY, i.e. make the first); FALL_BACK otherwise.

    A guard error (truncated, collapsed) falls back at once.

    >>> [decide(h, 1) for h in ([], ["no_json"], ["no_json", ""], ["no_json", "empty"], ["truncated: length"])]
    ['retry', 'retry', 'accept', 'fallback', 'fallback']
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if errors and not errors[-1]:
        return ACCEPT
    if errors and errors[-1].split(":")[0] in GUARDS:
        return FALL_BACK
    return RETRY if len(errors) <= max_retries else FALL_BACK


def _words(text: str) -> int:
    return len(text.split())


def collapsed(source: str, output: str, min_ratio: float) -> str:
    """Why `output` is a collapsed rewrite of `source` (module docstring), or "" when it is not.

    >>> collapsed("One cat. Two cats sat. Three cats ran off.", "Cats.", 0.5)
    'collapsed: 1 of 9 words'
    >>> collapsed("One cat. Two cats sat. Three cats ran off.", "One cat sat and two more cats ran off fast", 0.5)
    'collapsed: 1 sentence from 3'
    >>> collapsed("One cat. Two cats sat.", "A cat. Two cats sat down.", 0.5)
    ''
    """
    have, had = _words(output), _words(source)
    if have < min_ratio * had:
        return f"{COLLAPSED}: {have} of {had} words"
    before = count_punkt_sentences(source)
    if before >= 3 and count_punkt_sentences(output) <= 1:
        return f"{COLLAPSED}: 1 sentence from {before}"
    return ""


def grammar_slack(budget: int) -> int:
    """Tokens below its share at which a main field counts as closed by the grammar: re-tokenizing a decoded
    string may merge a few sampled tokens, so an exact count would miss cuts (about 3%, at least 4).

    >>> grammar_slack(443), grammar_slack(64)
    (13, 4)
    """
    return max(4, budget // 32)


def main_field_string(role: str, raw: str) -> str | None:
    """The main JSON field's string of a role's answer as the grammar wrote it (JSON-escaped, without its quotes), or
    None when the answer is not a JSON object with that field (a free-text role, an unparsed answer).

    >>> main_field_string("proofreader", '{"mistakes": "two typos", "corrected article": "Cats sleep."}')
    'Cats sleep.'
    >>> main_field_string("proofreader", "not json") is None
    True
    """
    fields = role_fields(role)
    if not fields:
        return None
    shares = field_tokens(role, 1 << 16)
    key = fields[max(range(len(fields)), key=lambda i: shares[i])][0]
    try:
        value = json.loads(raw).get(key)
    except (ValueError, AttributeError):
        return None
    if not isinstance(value, str):
        return None
    return json.dumps(value, ensure_ascii=False)[1:-1]


def cut_by_grammar(reply: Reply) -> bool:
    """The grammar closed the main field: it holds at least its share (less the slack) of tokens (docstring)."""
    return reply.budget > 0 and reply.main_tokens >= 0 and reply.main_tokens >= reply.budget - grammar_slack(reply.budget)


def guard_error(reply: Reply, value: RoleValue | None, fallback: RoleValue, min_ratio: float = 0.0) -> str:
    """The guard a parsed reply trips (module docstring): "truncated: ...", "collapsed: ..." or ""."""
    if reply.finish_reason == "length":
        return f"{TRUNCATED}: finish_reason length after {reply.completion_tokens} tokens"
    if cut_by_grammar(reply):
        return (f"{TRUNCATED}: the main field's {reply.main_tokens} tokens reached its grammar share of "
                f"{reply.budget}")
    if min_ratio > 0 and value is not None and value.text is not None and fallback.text:
        return collapsed(fallback.text, value.text, min_ratio)
    return ""


def reply_error(role: str, reply: Reply, expect_paragraphs: int = 0, fallback: RoleValue | None = None,
                min_ratio: float = 0.0) -> tuple[RoleValue | None, str]:
    """Parse one reply: (value, "") or (None, error); an engine error is "engine: <message>", a guard's
    "truncated: ..." / "collapsed: ..." (checked when `fallback`, the stage's input, is given)."""
    if reply.error or reply.finish_reason == "error":
        return None, f"engine: {reply.error or 'error'}"
    if reply.finish_reason == "length":
        return None, guard_error(reply, None, RoleValue(None))
    parsed = parse_output(role, reply.text, expect_paragraphs)
    if parsed.value is not None and fallback is not None:
        guard = guard_error(reply, parsed.value, fallback, min_ratio)
        if guard:
            return None, guard
    return parsed.value, parsed.error


def settle(role: str, replies: Sequence[Reply], fallback: RoleValue, max_retries: int,
           expect_paragraphs: int = 0, min_ratio: float = 0.0) -> RoleOutcome | None:
    """The outcome of a call after `replies` (one per attempt, in order), or None when it needs another attempt.

    >>> bad, good = Reply("no json here"), Reply('{"simplified result": "Cats sleep."}')
    >>> settle("content_simplifier", [bad], RoleValue("Felines slumber."), 1) is None
    True
    >>> settle("content_simplifier", [bad, good], RoleValue("Felines slumber."), 1).value.text
    'Cats sleep.'
    >>> out = settle("content_simplifier", [bad, bad], RoleValue("Felines slumber."), 1)
    >>> (out.value.text, out.fell_back, out.errors)
    ('Felines slumber.', True, ('no_json', 'no_json'))
    """
    parsed = [reply_error(role, r, expect_paragraphs, fallback, min_ratio) for r in replies]
    action = decide([error for _, error in parsed], max_retries)
    if action == RETRY:
        return None
    value = parsed[-1][0] if action == ACCEPT else fallback
    last = parsed[-1][1].split(":")[0]
    return RoleOutcome(
        value=value, attempts=len(replies), errors=tuple(e for _, e in parsed if e), fell_back=action == FALL_BACK,
        raws=tuple(r.text for r in replies), prompt_tokens=sum(r.prompt_tokens for r in replies),
        completion_tokens=sum(r.completion_tokens for r in replies), seconds=sum(r.seconds for r in replies),
        cached=sum(1 for r in replies if r.cached), guard=last if action == FALL_BACK and last in GUARDS else "",
    )


def retry_sampling(temperature: float, seed: int, attempt: int) -> tuple[float, int]:
    """(temperature, seed) of attempt `attempt` (0 = the first): retries get a new seed and T >= 0.7.

    >>> retry_sampling(0.6, 11, 0), retry_sampling(0.6, 11, 2), retry_sampling(0.9, 11, 1)
    ((0.6, 11), (0.7, 13), (0.9, 12))
    """
    if attempt == 0:
        return temperature, seed
    return max(temperature, RETRY_MIN_TEMPERATURE), seed + attempt
