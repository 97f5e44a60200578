"""Checking grammars against the bundled SmolLM2 tokenizer, token by token."""

from __future__ import annotations

from transformers import AutoTokenizer

from actors.constrained import GrammarCompiler
from actors.models import resolve_model_dir


def smollm2_compiler():
    """(GrammarCompiler, tokenizer) of the bundled SmolLM2; the `compiler` fixture of tests/conftest.py."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    return GrammarCompiler(tokenizer, 49152), tokenizer


def accepts(compiler, grammar: str, text: str) -> bool:
    comp, tokenizer = compiler
    matcher = comp.matcher(grammar)
    for token in tokenizer(text, add_special_tokens=False).input_ids:
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()
