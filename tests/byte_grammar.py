"""Checking grammars with llguidance over a byte-level tokenizer (token i < 256 is byte i, 256 is EOS): no model,
no download, one token per byte, so a grammar's token budget is a byte budget. The `byte_tokenizer` fixture of
tests/conftest.py is `byte_tokenizer()`."""

from __future__ import annotations

import llguidance


class ByteTokenizer:
    """A byte-level tokenizer for llguidance.TokenizerWrapper: token i < 256 is byte i, 256 is EOS."""

    def __init__(self):
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text):
        return list(text)


def byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))


def matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    """A matcher of the Lark `grammar`; fails the test when the grammar does not compile."""
    m = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(tokenizer: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    """Whether `grammar` admits `text` as a whole answer, byte by byte."""
    m = matcher(tokenizer, grammar)
    return all(m.consume_token(b) for b in text.encode()) and m.is_accepting()
