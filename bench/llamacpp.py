"""The llama.cpp side of `bench.generate --engines hf,llamacpp`: the bench's prompts decoded greedily by llama.cpp
(llama-cpp-python's low-level API) from the bundled GGUF, several sequences per `llama_decode`.

    pip install 'quorum[llamacpp]'    # llama-cpp-python 0.3.36: an sdist, compiles llama.cpp (~10 min, 2 cores)
    python -m bench.generate --engines hf,llamacpp --prompts 128 --max-tokens 48

Same inputs, token for token: the chat template is rendered and tokenized by the HF tokenizer (the hf engine's,
converted from this GGUF) and the ids are fed to llama.cpp, which stops at the same EOS ids. Precision differs:
llama.cpp multiplies the GGUF's Q4_1 weights (token embedding / LM head: Q8_0) with activations quantised to
8 bits; the hf engine runs the same weights dequantised and rounded to bf16, with bf16 activations.

Why the low-level API: `Llama.generate` decodes one sequence, while quorum's Ray Data stages send batches of 16+
prompts. llama.cpp decodes many sequences in one `llama_decode` (one token per live sequence plus the prompts of
newly admitted ones, each tagged with its sequence id, as llama-server does); a sequence that ends frees its KV
slot for the next prompt (continuous batching, as in the hf engine).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from actors.engines.base import ChatRequest, Completion
from actors.engines.hf.engine import render_prompt
from bench.roofline import config_shapes, useful_flops

INSTALL_HINT = ("llama_cpp is not installed: pip install 'quorum[llamacpp]' (llama-cpp-python 0.3.36, built from "
                "its sdist: ~10 min on 2 cores; CMAKE_ARGS='-DGGML_NATIVE=ON' builds for this CPU)")
# tokens one llama_decode may take (llama.cpp splits them into micro-batches of _UBATCH itself)
_MIN_BATCH_TOKENS = 2048
_UBATCH = 512


def load_llama_cpp():
    """The `llama_cpp` module, or None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def find_gguf(model: str, gguf: str) -> str:
    """The GGUF file llama.cpp reads: `gguf` if given, else the bundled SmolLM2 file for the embedded model."""
    if gguf:
        if not Path(gguf).is_file():
            raise ValueError(f"--gguf: no such file: {gguf}")
        return gguf
    from actors.models import EMBEDDED_ALIAS, find_embedded_gguf

    if model != EMBEDDED_ALIAS:
        raise ValueError(f"--gguf: llama.cpp needs a GGUF file for --model {model!r} (only {EMBEDDED_ALIAS!r} has one)")
    return str(find_embedded_gguf())


@dataclass
class Sequence:
    """One prompt being completed: `tokens` holds the completion (its EOS included, as the hf engine counts it)."""

    prompt: list[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""


def record_token(seq: Sequence, token: int, eos_ids: frozenset[int]) -> bool:
    """Append `token`; True when the sequence is finished (an EOS id: "stop"; `max_tokens` reached: "length")."""
    seq.tokens.append(token)
    if token in eos_ids:
        seq.finish_reason = "stop"
    elif len(seq.tokens) >= seq.max_tokens:
        seq.finish_reason = "length"
    return bool(seq.finish_reason)


def admit(pending_lengths: list[int], free_slots: int, budget: int) -> int:
    """How many waiting prompts (in order) join the next `llama_decode`: one per free slot, while their tokens
    fit in `budget` (the batch's room left after one token per live sequence).

    >>> admit([70, 60, 50], free_slots=2, budget=200)
    2
    >>> admit([70, 60, 50], free_slots=3, budget=129)
    1
    """
    count, used = 0, 0
    for length in pending_lengths[:free_slots]:
        if used + length > budget:
            break
        count, used = count + 1, used + length
    return count


class LlamaCppDecoder:
    """A llama.cpp model and context with `max_batch_size` KV slots of `context` tokens each; greedy decoding.

    Args:
        gguf: the model file.
        threads: llama.cpp threads (decode and prompt processing alike).
        max_batch_size: sequences decoded together (one KV slot each).
        context: tokens per slot (longest prompt + max new tokens).
        kv_unified: one KV buffer shared by all slots (llama.cpp's choice for sequences sharing a long prefix);
            off, each sequence attends over its own slot only.
    """

    def __init__(self, gguf: str, threads: int, max_batch_size: int, context: int, kv_unified: bool = False):
        lc = load_llama_cpp()
        if lc is None:
            raise RuntimeError(INSTALL_HINT)
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load and context logs, hundreds of lines, to errors only
        self.lc, self.max_batch_size, self.context = lc, max_batch_size, context
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
        if not self.model:
            raise ValueError(f"llama.cpp could not load {gguf}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        # the GGUF's own summary, e.g. "llama 256M BF16" or "... Q4_1": which weights were measured
        desc = ctypes.create_string_buffer(128)
        lc.llama_model_desc(self.model, desc, len(desc))
        self.description = desc.value.decode(errors="replace")
        # any prompt fits beside one token of every other slot, so a free slot always admits the next prompt
        self.batch_tokens = max(_MIN_BATCH_TOKENS, context + max_batch_size)
        params = lc.llama_context_default_params()
        params.n_ctx = context * max_batch_size
        params.n_batch = self.batch_tokens
        params.n_ubatch = _UBATCH
        params.n_seq_max = max_batch_size
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = kv_unified
        params.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {max_batch_size} x {context} tokens")
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(self.batch_tokens, 0, 1)

    def generate(self, prompts: list[list[int]], max_tokens: int, eos_ids: frozenset[int]) -> list[Sequence]:
        """Complete every prompt greedily; results in prompt order."""
        lc = self.lc
        seqs = [Sequence(prompt, max_tokens) for prompt in prompts]
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_tokens > self.context:
            raise ValueError(f"a prompt of {longest} tokens + {max_tokens} new ones exceeds the slot of {self.context}")
        lc.llama_memory_clear(self.memory, True)
        pending, live, free = deque(seqs), {}, list(range(self.max_batch_size - 1, -1, -1))
        while pending or live:
            n, outputs = 0, []  # outputs: (index in the batch whose logits choose the next token, slot)
            for slot, seq in live.items():
                n = self._add(n, seq.tokens[-1], len(seq.prompt) + len(seq.tokens) - 1, slot, True)
                outputs.append((n - 1, slot))
            lengths = [len(seq.prompt) for seq in islice(pending, len(free))]
            for _ in range(admit(lengths, len(free), self.batch_tokens - n)):
                seq, slot = pending.popleft(), free.pop()
                live[slot] = seq
                for pos, token in enumerate(seq.prompt):
                    n = self._add(n, token, pos, slot, pos == len(seq.prompt) - 1)
                outputs.append((n - 1, slot))
            self.batch.n_tokens = n
            code = lc.llama_decode(self.ctx, self.batch)
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code} for {n} tokens of {len(outputs)} sequences")
            for index, slot in outputs:
                logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
                if record_token(live[slot], int(logits.argmax()), eos_ids):
                    del live[slot]
                    lc.llama_memory_seq_rm(self.memory, slot, -1, -1)
                    free.append(slot)
        return seqs

    def _add(self, n: int, token: int, pos: int, seq_id: int, logits: bool) -> int:
        batch = self.batch
        batch.token[n], batch.pos[n], batch.n_seq_id[n], batch.logits[n] = token, pos, 1, logits
        batch.seq_id[n][0] = seq_id
        return n + 1

    def close(self) -> None:
        """Free the batch, context and model (the decoder cannot generate afterwards)."""
        if self.ctx:
            self.lc.llama_batch_free(self.batch)
            self.lc.llama_free(self.ctx)
            self.lc.llama_model_free(self.model)
            self.ctx = self.model = None


def timed_generate(decoder: LlamaCppDecoder, prompts: list[list[int]], max_tokens: int,
                   eos_ids: frozenset[int]) -> tuple[float, list[Sequence]]:
    """Wall seconds of one `decoder.generate`, and its sequences."""
    start = time.perf_counter()
    seqs = decoder.generate(prompts, max_tokens, eos_ids)
    return time.perf_counter() - start, seqs


def measure_llamacpp(args: argparse.Namespace, requests: list[ChatRequest], tokenizer, eos_ids: frozenset[int],
                     shapes: tuple[int, int, int], peak: float, engine: list[Completion] | None = None,
                     engine_tps: float = 0.0) -> None:
    """Print the llama.cpp lines: the same prompts (token ids) at the same batch size, then the first batch one
    sequence at a time; compared with the hf engine's run (`engine`, its tokens/s) when there was one."""
    prompts = [tokenizer(render_prompt(tokenizer, r.messages, False), add_special_tokens=False).input_ids
               for r in requests]
    gguf, threads = find_gguf(args.model, args.gguf), torch.get_num_threads()
    context = max(len(p) for p in prompts) + args.max_tokens
    results = {}
    for size, subset in ((args.batch_size, prompts), (1, prompts[: args.batch_size])):
        decoder = LlamaCppDecoder(gguf, threads, size, context, kv_unified=args.llamacpp_kv_unified)
        decoder.generate(prompts[:2], 2, eos_ids)  # warm-up, as the hf engine's
        results[size] = timed_generate(decoder, subset, args.max_tokens, eos_ids)
        weights = decoder.description
        decoder.close()
    seconds, seqs = results[args.batch_size]
    tps = sum(len(s.tokens) for s in seqs) / seconds
    flops = useful_flops(*shapes, [(len(s.prompt), len(s.tokens)) for s in seqs])
    print(f"info llamacpp gguf={Path(gguf).name} threads={threads} batch={args.batch_size} "
          f"completion_tokens={sum(len(s.tokens) for s in seqs)} weights={weights!r} (quantised types multiply "
          f"8-bit activations)")
    print(f"bench llamacpp_tokens_per_s = {tps:.1f}")
    print(f"bench llamacpp_roofline_fraction = {flops / seconds / peak:.3f}")
    single_seconds, single_seqs = results[1]
    single_tps = sum(len(s.tokens) for s in single_seqs) / single_seconds
    print(f"bench llamacpp_single_tokens_per_s = {single_tps:.1f}", flush=True)
    if engine is not None:
        texts = [tokenizer.decode([t for t in s.tokens if t not in eos_ids], skip_special_tokens=True) for s in seqs]
        same = same_text_count([c.raw_text or c.text for c in engine], texts)
        print(f"info llamacpp_same_text_as_engine={same}/{len(seqs)} (greedy; differences come from precision)")
        print(f"bench llamacpp_vs_engine = {tps / engine_tps:.2f}", flush=True)


def measure_llamacpp_alone(args: argparse.Namespace, requests: list[ChatRequest], peak: float) -> None:
    """`--engines llamacpp`: the llama.cpp lines without loading the hf model (its tokenizer and config only)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from actors.engines.hf.engine import collect_eos_ids
    from actors.models import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        generation = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the tokenizer's EOS only
        generation = GenerationConfig()
    eos_ids = collect_eos_ids(SimpleNamespace(generation_config=generation), tokenizer)
    shapes = config_shapes(AutoConfig.from_pretrained(model_dir).get_text_config())
    measure_llamacpp(args, requests, tokenizer, eos_ids, shapes, peak)


def same_text_count(reference: list[str], candidate: list[str]) -> int:
    """How many completions are identical, position by position.

    >>> same_text_count(["a", "b", "c"], ["a", "x", "c"])
    2
    """
    return sum(a == b for a, b in zip(reference, candidate, strict=True))
