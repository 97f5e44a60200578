"""Checking grammars against the bundled SmolLM2 tokenizer, token by token."""

from __future__ import annotations

import random

import torch
from transformers import AutoTokenizer

from actors.engines.hf.constrained import GrammarCompiler, advance, mask_logits
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


def random_walk(compiler, grammar: str, max_tokens: int, rng: random.Random):
    """Tokens the grammar's mask allows, each chosen at random (a worst-case model), until the matcher stops or
    `max_tokens` are spent: (the matcher, for its state; the decoded text)."""
    comp, tokenizer = compiler
    matcher = comp.matcher(grammar)
    logits = torch.zeros(1, comp.vocab_size)
    tokens = []
    while not matcher.is_stopped() and len(tokens) < max_tokens:
        logits.zero_()
        mask_logits(logits, [matcher])
        token = rng.choice(torch.nonzero(logits[0] == 0).flatten().tolist())
        assert advance(matcher, token) == ""
        tokens.append(token)
    return matcher, tokenizer.decode(tokens, skip_special_tokens=True)
