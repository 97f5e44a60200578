"""Grammar-constrained decoding for the hf engine, with llguidance (the library behind vLLM's `guidance` backend).

A request whose `SamplingParams.grammar` is set (a Lark grammar, built by `eval.judging.grammar`) gets one
`llguidance.LLMatcher` for its row. Before each token choice the matcher's allowed-token bitmask sets every other
logit to -inf; after it, the chosen token advances the matcher; when the grammar is complete the row stops. Greedy
and sampled rows both draw from the masked logits, so a constrained greedy answer is the model's most likely
completion among those the grammar allows.

Why llguidance: it is maintained (Microsoft / guidance-ai), ships one abi3 wheel with no Python dependencies (it
does not pull torch or triton), computes a mask in tens of microseconds, speaks the same grammar as vLLM's
`guidance` backend (one grammar string for every engine kind), and bounds free text in tokens
(`rule[max_tokens=N]`), which a judge's rationale needs so the verdict always fits. xgrammar would need triton
and bounds text only in characters; outlines-core has no token bounds.
"""

from __future__ import annotations

import torch

_BITS = 32


class GrammarCompiler:
    """One tokenizer conversion per engine (about 0.4 s for a 49k vocabulary), then one matcher per request."""

    def __init__(self, hf_tokenizer, vocab_size: int):
        import llguidance
        import llguidance.hf

        self._llguidance = llguidance
        # the model's logits may be wider than the tokenizer's vocabulary (padded embeddings); llguidance masks
        # the ids past the tokenizer's end
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        self.tags = special_tags(hf_tokenizer)
        self._grammars: dict[str, str] = {}

    def matcher(self, grammar: str):
        """A fresh matcher for `grammar`. Raises ValueError naming the grammar error."""
        compiled = self._grammars.get(grammar)
        if compiled is None:
            compiled = self._llguidance.LLMatcher.grammar_from_lark(with_special_tags(grammar, self.tags))
            self._grammars[grammar] = compiled
        matcher = self._llguidance.LLMatcher(self.tokenizer, compiled, log_level=0)
        if matcher.is_error():
            raise ValueError(f"sampling.grammar: {matcher.get_error()}")
        return matcher


THINK_TAGS = ("<think>", "</think>")


def special_tags(hf_tokenizer) -> tuple[str, ...]:
    """The reasoning tags that are one added token of this tokenizer (Qwen3's `<think>`, id 151667).

    llguidance reads an added token as a special token, which a quoted "<think>" in a grammar never matches: the
    model's own tag would be masked out and the tag spelled in pieces instead. `with_special_tags` rewrites them.
    """
    added = hf_tokenizer.get_added_vocab()
    return tuple(tag for tag in THINK_TAGS if tag in added)


def with_special_tags(grammar: str, tags: tuple[str, ...]) -> str:
    """`grammar` with each quoted literal `"<tag>"` of `tags` written as llguidance's special-token reference.

    >>> with_special_tags('start: "<think>" x "</think>" "ok"', ("<think>", "</think>"))
    'start: <think> x </think> "ok"'
    """
    for tag in tags:
        grammar = grammar.replace(f'"{tag}"', tag)
    return grammar


def mask_logits(logits: torch.Tensor, matchers: list) -> None:
    """Set to -inf, in place, every logit a row's matcher does not allow next (rows with matcher None are free).

    Args:
        logits: float32 scores. Shape: (rows, vocab).
        matchers: one `LLMatcher` or None per row.
    """
    constrained = [i for i, m in enumerate(matchers) if m is not None and not m.is_stopped()]
    if not constrained:
        return
    vocab = logits.shape[1]
    words = torch.full((len(constrained), (vocab + _BITS - 1) // _BITS), -1, dtype=torch.int32)
    for slot, i in enumerate(constrained):
        row = words[slot]
        matchers[i].unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
    allowed = unpack_bitmask(words, vocab)
    index = torch.tensor(constrained, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))


def unpack_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 words (bit j of word w = token 32w + j) to a bool mask of shape (rows, vocab).

    >>> unpack_bitmask(torch.tensor([[5]], dtype=torch.int32), 4).tolist()
    [[True, False, True, False]]
    """
    shifts = torch.arange(_BITS, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def advance(matcher, token: int) -> str:
    """Feed the chosen token to the matcher; returns an error text ("" when the grammar accepted it)."""
    if matcher.is_stopped():
        return ""
    if not matcher.consume_token(token):
        return f"grammar rejected token {token}: {matcher.get_error()}"
    return ""
