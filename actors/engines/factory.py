"""Engine construction: `EngineSpec` -> the engine it names. Kept apart from `actors.engines.base` (types and protocol)
so that the engine modules, which import those types, never import the module that imports them.
"""

from __future__ import annotations

from actors.engines.base import Engine, EngineSpec


def build_engine(spec: EngineSpec) -> Engine:
    """Instantiate the engine named by `spec.kind`. Heavy imports happen here, not at module import."""
    if spec.kind == "hf":
        from actors.engines.hf.engine import HFEngine

        return HFEngine(spec)
    if spec.kind == "vllm":
        from actors.engines.vllm_sync import VLLMEngine

        return VLLMEngine(spec)
    if spec.kind == "openai":
        from actors.engines.openai_api import OpenAIEngine

        return OpenAIEngine(spec)
    raise ValueError(f"engine.kind: unknown engine kind {spec.kind!r} (expected hf, vllm or openai)")
