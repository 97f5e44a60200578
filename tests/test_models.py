"""Model specs: the embedded SmolLM2 cache, local directories, hub ids, and the tiny random test model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from actors.models import (
    _publish,
    build_tiny_random_model,
    ensure_embedded_model,
    get_cache_root,
    resolve_model_dir,
)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_random_model(tmp_path_factory.mktemp("tiny-llama"))


def test_local_directory_is_returned_as_is(tiny_model_dir):
    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=str(missing)):
        resolve_model_dir(str(missing))


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_dir(str(tmp_path))


def test_hub_spec_passes_the_repo_id_through():
    assert resolve_model_dir("hf:HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match="names no hub repo"):
        resolve_model_dir("hf:")
    with pytest.raises(ValueError, match="model"):
        resolve_model_dir("")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QUORUM_CACHE", str(tmp_path))
    assert get_cache_root() == tmp_path
    monkeypatch.delenv("QUORUM_CACHE")
    assert get_cache_root() == Path.home() / ".cache" / "quorum"


def test_tiny_model_is_seeded_and_shares_the_chat_template(tiny_model_dir, tmp_path):
    again = build_tiny_random_model(tmp_path / "again")
    other = build_tiny_random_model(tmp_path / "other", seed=1)
    weights = load_file(Path(tiny_model_dir) / "model.safetensors")
    same = load_file(Path(again) / "model.safetensors")
    different = load_file(Path(other) / "model.safetensors")
    assert all((weights[k] == same[k]).all() for k in weights)
    assert any((weights[k] != different[k]).any() for k in weights)
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "<|im_start|>" in tokenizer.chat_template


def test_tiny_model_rejects_bad_head_split(tmp_path):
    with pytest.raises(ValueError, match="heads"):
        build_tiny_random_model(tmp_path, hidden_size=64, heads=5)


def test_racing_publish_keeps_the_first_copy(tmp_path):
    final = tmp_path / "model"
    first, second = tmp_path / "a", tmp_path / "b"
    for copy, tag in ((first, "first"), (second, "second")):
        copy.mkdir()
        (copy / "config.json").write_text(tag)
        (copy / "model.safetensors").write_text(tag)
    _publish(first, final)
    _publish(second, final)  # the loser of a race must not fail nor overwrite
    assert (final / "config.json").read_text() == "first"


@pytest.mark.slow
def test_embedded_model_is_converted_once_and_cached():
    # First run on a machine converts the GGUF file (~20 s); every later call is a directory check.
    model_dir = Path(resolve_model_dir("smollm2-135m"))
    start = time.perf_counter()
    assert ensure_embedded_model() == model_dir
    assert time.perf_counter() - start < 1.0
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (model_dir / "model.safetensors").stat().st_size > 400e6  # float32 weights, de-quantised
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert prompt.startswith("<|im_start|>system")
    assert not list(model_dir.parent.glob(".smollm2-135m.tmp-*"))
