"""A judge trained with `finetune: full` end to end: judge SFT on the tiny model exports a 16-bit Hugging Face model
(train/run/model, no adapter), the GRM Serve app serves it as `judge.engine.model` and answers a score request over
real HTTP, and `judge_eval` reads it as `judges.N.engine.model`."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx
import pytest
import yaml

from jobs.cli import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[1]
TOKEN_ENV, TOKEN = "QUORUM_TEST_FULL_JUDGE_TOKEN", "test-token-9d1e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def full_sft_config(tmp_path: Path) -> Path:
    """configs/judge_sft_demo.yaml trained fully: `finetune: full`, its LoRA section gone (full refuses it)."""
    cfg = yaml.safe_load((REPO / "configs" / "judge_sft_demo.yaml").read_text())
    del cfg["train"]["lora"]
    cfg["train"]["finetune"] = "full"
    path = tmp_path / "judge_sft_full.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_fully_trained_judge_is_exported_served_and_evaluated(ray_local, tiny_model_dir, tmp_path):
    from ray import serve

    from core.config import load_config
    from serve.app import make_app
    from serve.config import ServeConfig

    root = tmp_path / "runs"
    assert cli_main(["run", str(full_sft_config(tmp_path)), f"run.root={root}", "run.id=full", "wandb.mode=disabled",
                     "data.limit=4", "data.val_limit=2", f"train.model={tiny_model_dir}", "train.num_workers=1",
                     "train.max_steps=2", "train.checkpoint_every=2", "train.precision=fp32",
                     "train.lr=0.01"]) == 0
    run = root / "judge_sft" / "full"
    export = run / "train" / "run" / "model"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["model"] == str(export) and "adapter" not in manifest
    assert (export / "config.json").is_file() and (export / "tokenizer_config.json").is_file()
    assert not (run / "train" / "run" / "adapter").exists()

    # the GRM Serve app on the export: a score request over HTTP
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    os.environ[TOKEN_ENV] = TOKEN
    try:
        cfg = load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
            f"judge.engine.model={export}", "judge.engine.dtype=float32", "judge.engine.num_threads=1",
            'judge.adapter=""', f"serve.port={port}", "serve.app_name=full-judge", "serve.route_prefix=/full",
            f"serve.auth_token_env={TOKEN_ENV}", "resources.num_cpus=0.5", "sampling.max_tokens=8",
            "prompts.pointwise=jury_score", "prompts.pointwise_format=answer",
            "prompts.pointwise_vars={prompt: base_sentence, response: new_sentence}"])
        serve.run(make_app(cfg), name="full-judge", route_prefix="/full")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/full", timeout=120) as client:
            ready = client.get("/health")
            assert ready.status_code == 200, ready.text
            got = client.post("/score", json={"prompt": "The decision was postponed.", "response": "It waited."},
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert got.status_code == 200, got.text
        assert got.json()["parse_status"] == "ok" and 1 <= got.json()["grade"] <= 5, got.json()
    finally:
        serve.shutdown()
        os.environ.pop(TOKEN_ENV, None)

    # judge_eval reads the export as the judge's model
    assert cli_main(["run", str(REPO / "configs" / "judge_eval_demo.yaml"), f"run.root={root}", "run.id=eval",
                     "wandb.mode=disabled", "data.limit=2", f"judges.0.engine.model={export}",
                     "judges.0.sampling.max_tokens=8", "report.n_boot=10"]) == 0
    assert (root / "judge_eval" / "eval" / "manifest.json").is_file()
