"""The judge's weights: a base model plus an optional LoRA adapter from a training run.

A vllm judge in `judge.engine_mode` async (the default for vllm) serves the adapter as a LoRA request per call
(`actors.engines.vllm_async.AsyncVLLMEngine`): nothing is merged, and a new adapter of a rank the engine's LoRA slot holds
is swapped in without reloading the base model (`same_base_engine`).

In batch mode, HFEngine (and VLLMEngine) load a model directory named by `EngineSpec.model` and offer no hook for a
preloaded model, so the adapter is merged into the base once per (re)load: base weights + `PeftModel.from_pretrained` +
`merge_and_unload`, saved with the base tokenizer into a temporary directory that the engine then loads like any
model. A merged model also decodes at base-model speed (no extra LoRA matmuls) and keeps HFEngine's bf16 weight
packing. The temporary directory is removed once the engine holds the weights.

The model identity (cache keys, `/ready`, response `model` fields) includes a content hash of the adapter, so an
adapter re-saved to the same path is a new identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from actors.engines.base import Engine, EngineSpec
from actors.engines.factory import build_engine
from serve.config import judge_engine_mode

log = logging.getLogger(__name__)
_HASH_CHUNK = 1 << 20


def adapter_fingerprint(adapter_dir: str) -> str:
    """Short sha256 over the adapter's config and weight files (names and bytes)."""
    digest = hashlib.sha256()
    root = Path(adapter_dir)
    files = sorted([root / "adapter_config.json", *root.glob("adapter_model.*")])
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def judge_identity(judge) -> str:
    """What makes two judges answer alike: the engine identity plus the adapter path and content hash."""
    identity = judge.engine.cache_identity()
    if judge.adapter:
        identity += f"|adapter={judge.adapter}#{adapter_fingerprint(judge.adapter)}"
    return identity


def served_name(judge) -> str:
    """The model name clients see on /v1/chat/completions."""
    if judge.served_name:
        return judge.served_name
    name = judge.engine.served_model_name or judge.engine.model
    return Path(name).name if "/" in name and not name.startswith("hf:") else name


def build_judge_engine(judge) -> Engine:
    """Load the judge for batch mode: `build_engine(judge.engine)`, with the adapter merged in first when one is set."""
    if not judge.adapter:
        return _build(judge, judge.engine)
    merged = tempfile.mkdtemp(prefix="quorum-grm-merged-")
    try:
        merge_adapter(judge.engine.model, judge.adapter, merged)
        return _build(judge, dataclasses.replace(judge.engine, model=merged))
    finally:
        shutil.rmtree(merged, ignore_errors=True)


def _build(judge, spec: EngineSpec) -> Engine:
    if spec.kind == "vllm" and judge.vllm_args:
        from actors.engines.vllm_sync import VLLMEngine

        return VLLMEngine(spec, judge.vllm_args)
    return build_engine(spec)


def build_async_judge_engine(judge):
    """Load a vllm judge for async mode: an `AsyncVLLMEngine` with the adapter as its LoRA request (not merged)."""
    from actors.engines.vllm_async import AsyncVLLMEngine

    spec = dataclasses.replace(judge.engine, adapter=judge.adapter or judge.engine.adapter)
    return AsyncVLLMEngine(spec, judge.vllm_args)


def same_base_engine(old, new) -> bool:
    """Whether two judges differ at most in their adapter (then an async engine swaps the LoRA, no reload)."""
    return _base_key(old) == _base_key(new)


def _base_key(judge) -> str:
    spec = dataclasses.asdict(dataclasses.replace(judge.engine, adapter=""))
    return json.dumps([spec, judge.vllm_args, judge_engine_mode(judge)], sort_keys=True, default=str)


def merge_adapter(base_model: str, adapter_dir: str, out_dir: str) -> None:
    """Write base + LoRA adapter, merged, as a plain HF model directory (weights, config, tokenizer) to `out_dir`.

    Args:
        base_model: a model spec `actors.models.resolve_model_dir` understands.
        adapter_dir: a peft `save_pretrained` directory.
        out_dir: an existing directory to write into.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.models import resolve_model_dir

    base_dir = resolve_model_dir(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out_dir)
    log.info("merged adapter %s into %s", adapter_dir, base_model)
