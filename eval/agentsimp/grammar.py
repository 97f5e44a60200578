"""Grammars for AgentSimp (paper 004) JSON role answers, for constrained decoding.

`role_grammar(role, max_tokens)` turns a role's JSON schema (`eval.agentsimp.parse.role_schema`) into a grammar
in llguidance's Lark dialect, the format every engine already takes in `SamplingParams.grammar` (hf decodes under
it with llguidance, vllm with its `guidance` backend, a vLLM-served openai engine gets it as
`structured_outputs.grammar`; see `eval.judging.grammar`). Free-text roles (project director, content integrator,
article architect) get "" (no grammar).

The grammar writes the object the way `json.dumps` does: keys in the prompt's order, ``", "`` and ``": "`` as
separators, e.g. ``{"analyzed result": "None", "simplified result": "None"}``. Why not llguidance's ``%json``
with the schema: its strings are bounded in characters (``maxLength``), ours in tokens (``rule[max_tokens=N]``, as
the judge grammars do), so that the closing ``"}`` always fits in `max_tokens` and a long paragraph is cut, not left
unterminated. The fixed text (keys, quotes, separators) is reserved at one token per character, the worst case
of any tokenizer, plus a margin, so the answer fits in `max_tokens` whatever the model's tokenizer. What is left is
shared among the fields by weight: a main text (paragraph, article, suggestions) and the outline's subheadings 3, a
note (analysis, mistakes), the title and the terms 1. A list holds at most `MAX_ITEMS` strings of at most
`ITEM_TOKENS` tokens each.

Every string needs a first character that is not a space (the schemas' ``pattern: \\S``) and may use JSON's
escapes. One case still yields invalid JSON: a string whose token budget runs out right after a lone backslash
(llguidance then closes the string on the escape); the answer fails to parse and is retried like any other.

Pure: no ray, vllm, deepspeed, torch or llguidance import; the engines compile these strings.
"""

from __future__ import annotations

import json

from eval.agentsimp.parse import role_fields
from eval.lark_text import MIN_FREE_TOKENS, lark_string, up_to

MAX_ITEMS = 12
ITEM_TOKENS = 16
_WEIGHTS = {"analyzed result": 1, "mistakes": 1, "title": 1, "subheadings": 3}
_MARGIN = 8
_LIST_WEIGHT = 1
_TEXT_WEIGHT = 3
# one JSON string character (or escape); the first one of a string is not whitespace
_UNIT = r'[^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4}'
_FIRST = r'[^"\\\x00-\x20]|\\["\\\/]'
STRING_BODY = rf"(?:{_FIRST})(?:{_UNIT})*"


def field_tokens(role: str, max_tokens: int) -> list[int]:
    """Each JSON field's token share within `max_tokens` (module docstring), in the prompt's field order.

    >>> field_tokens("proofreader", 400)  # skeleton '{"mistakes": "", "corrected article": ""}' = 41 chars
    [87, 263]
    """
    fields = role_fields(role)
    skeleton = json.dumps({key: [] if kind == "list" else "" for key, kind, _ in fields})
    budget = max_tokens - len(skeleton) - _MARGIN
    weights = [_WEIGHTS.get(key, _LIST_WEIGHT if kind == "list" else _TEXT_WEIGHT) for key, kind, _ in fields]
    return [budget * w // sum(weights) for w in weights]


def main_field_tokens(role: str, max_tokens: int) -> int:
    """The largest field share of a JSON role's grammar (its main text); 0 for a free-text role.

    An answer whose completion reaches this many tokens may have had its main text closed by the grammar
    (`eval.agentsimp.outputs.guard_error` treats it as truncated).
    """
    return max(field_tokens(role, max_tokens), default=0) if role_fields(role) else 0


def role_grammar(role: str, max_tokens: int) -> str:
    """The grammar of role `role`'s JSON answer within `max_tokens` completion tokens; "" for a free-text role.

    Raises:
        ValueError: an unknown role, or `max_tokens` too small to give every field `MIN_FREE_TOKENS` tokens.

    >>> g = role_grammar("content_simplifier", 64)  # '{"simplified result": ""}' reserves 25 + 8 tokens
    >>> g.splitlines()[0], "f0_text[max_tokens=31]" in g
    ('start: "{" f0 "}"', True)
    """
    fields = role_fields(role)
    if not fields:
        return ""
    shares = field_tokens(role, max_tokens)
    if min(shares) < MIN_FREE_TOKENS:
        raise ValueError(f"max_tokens={max_tokens} is too small for the {role} answer: a field would get "
                         f"{min(shares)} tokens (at least {MIN_FREE_TOKENS} needed)")
    parts, rules = [], []
    for k, ((key, kind, _), share) in enumerate(zip(fields, shares)):
        parts.append(f"f{k}")
        head = lark_string(json.dumps(key) + ": ")
        if kind == "list":
            # an item costs its text plus two quotes and ", " at worst one token per character
            items = max(1, min(MAX_ITEMS, share // (ITEM_TOKENS + 4)))
            item_tokens = min(ITEM_TOKENS, share - 4)
            tail = " " + up_to(f'{lark_string(", ")} f{k}_item', items - 1) if items > 1 else ""
            rules += [f'f{k}: {head} "[" (f{k}_item{tail})? "]"',
                      f'f{k}_item: "\\"" f{k}_text "\\""',
                      f"f{k}_text[max_tokens={item_tokens}]: /{STRING_BODY}/"]
        else:
            rules += [f'f{k}: {head} "\\"" f{k}_text "\\""',
                      f"f{k}_text[max_tokens={share}]: /{STRING_BODY}/"]
    start = f' {lark_string(", ")} '.join(parts)
    return "\n".join([f'start: "{{" {start} "}}"', *rules]) + "\n"
