"""Engine construction: `EngineSpec` -> the engine it names. Kept apart from `actors.engine` (types and protocol)
so that the engine modules, which import those types, never import the module that imports them.
"""

from __future__ import annotations

from actors.engine import Engine, EngineSpec


def build_engine(spec: EngineSpec) -> Engine:
    """Instantiate the engine named by `spec.kind`. Heavy imports happen here, not at module import."""
    if spec.kind == "hf":
        from actors.hf_engine import HFEngine

        return HFEngine(spec)
    if spec.kind == "vllm":
        from actors.vllm_engine import VLLMEngine

        return VLLMEngine(spec)
    if spec.kind == "openai":
        from actors.openai_engine import OpenAIEngine

        return OpenAIEngine(spec)
    raise ValueError(f"engine.kind: unknown engine kind {spec.kind!r} (expected hf, vllm or openai)")
