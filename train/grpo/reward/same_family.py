"""Same family: a policy trained against a judge of its own family (same base model or tokenizer) is rewarded by a
judge that may prefer its own style (self-preference); policy GRPO warns at start (`monitor.same_family`).

    alert = same_family(model_identity("smollm2-135m"), model_identity("judge", "/models/SmolLM2-360M-Instruct"))

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from eval.reward_monitors import Alert

# name parts that say nothing about the family: size, tuning and format suffixes
_NAME_NOISE = re.compile(r"[-_.](?:\d+(?:\.\d+)?[mbk]|instruct|chat|base|it|hf|gguf|awq|gptq|fp16|bf16|v\d+(?:\.\d+)*)"
                         r"(?=$|[-_.])")


@dataclasses.dataclass(frozen=True)
class ModelIdentity:
    """What ties a model to its family: its name, its config's base model (`_name_or_path`) and a hash of its
    tokenizer's vocabulary file ("" when unknown)."""

    name: str
    base: str = ""
    tokenizer_sha: str = ""


def family_key(name: str) -> str:
    """A model name without path, org, size and tuning suffixes: ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` ->
    ``"smollm2"``."""
    key = name.rstrip("/").rsplit("/", 1)[-1].lower()
    previous = None
    while previous != key:
        previous, key = key, _NAME_NOISE.sub("", key)
    return key


def model_identity(name: str, model_dir: str = "") -> ModelIdentity:
    """The identity of `name`, read from `model_dir` (config.json, tokenizer.json / vocab.json) when given."""
    base, sha = "", ""
    if model_dir:
        config = Path(model_dir, "config.json")
        if config.is_file():
            data = json.loads(config.read_text(encoding="utf-8"))
            base = str(data.get("_name_or_path") or "")
        for vocab in ("tokenizer.json", "vocab.json", "tokenizer.model"):
            path = Path(model_dir, vocab)
            if path.is_file():
                sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                break
    return ModelIdentity(name, base, sha)


def same_family(policy: ModelIdentity, judge: ModelIdentity) -> Alert | None:
    """An alert (step 0) when the policy and the judge share a family name, a base model or a tokenizer."""
    reasons = []
    if family_key(policy.name) == family_key(judge.name):
        reasons.append(f"the family {family_key(policy.name)!r}")
    if policy.base and judge.base and family_key(policy.base) == family_key(judge.base):
        reasons.append(f"the base model {family_key(policy.base)!r}")
    if policy.tokenizer_sha and policy.tokenizer_sha == judge.tokenizer_sha:
        reasons.append("the tokenizer")
    if not reasons:
        return None
    return Alert("same_family", 0, 1.0, 1.0, "monitor.same_family",
                 f"same_family: the policy {policy.name!r} and the judge {judge.name!r} share {', '.join(reasons)}: "
                 "the judge may prefer its own family's style (self-preference)")
