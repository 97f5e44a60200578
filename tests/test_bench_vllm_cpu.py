"""The vLLM side of `bench.generate` (bench/vllm_cpu/generate.py): the note when no vLLM environment is named, the error a
failed child gives, and (with `QUORUM_VLLM_CPU_PYTHON` naming one) real greedy decoding on vLLM's CPU backend."""

from __future__ import annotations

import os
import sys

import pytest

from bench.engines import parse_engines
from bench.vllm_cpu.generate import run_vllm_cpu

VLLM_PYTHON = os.environ.get("QUORUM_VLLM_CPU_PYTHON", "")


def test_vllmcpu_is_an_engine_and_is_skipped_with_a_note_without_its_environment(monkeypatch, capsys):
    from bench import generate

    assert parse_engines("hf,vllmcpu") == ["hf", "vllmcpu"]
    monkeypatch.delenv("QUORUM_VLLM_CPU_PYTHON", raising=False)
    generate.main(["--engines", "vllmcpu"])
    out = capsys.readouterr().out
    assert "info vllmcpu not measured: --vllm-python (or QUORUM_VLLM_CPU_PYTHON) names no Python" in out
    assert "bench " not in out
    # vLLM is measured against the hf engine's run, so it cannot run without it
    with pytest.raises(SystemExit):
        generate.main(["--engines", "vllmcpu", "--vllm-python", sys.executable])


def test_a_child_that_fails_is_an_error_with_its_stderr(smollm2_dir):
    # quorum's own Python has no vllm: the child's import fails, and the error says so instead of a figure
    with pytest.raises(RuntimeError, match=r"(?s)exited 1:.*No module named 'vllm'"):
        run_vllm_cpu(sys.executable, smollm2_dir, [[1, 2, 3]], max_tokens=2, rows=1, eager=True)


@pytest.mark.skipif(not os.path.isfile(VLLM_PYTHON), reason="QUORUM_VLLM_CPU_PYTHON names no vLLM CPU environment")
def test_vllm_cpu_decodes_the_prompt_ids_greedily(smollm2_dir):
    from transformers import AutoTokenizer

    from actors.engines.hf.engine import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    texts = ("Simplify: the committee postponed its decision.", "What is two plus two?", "Name a colour.")
    prompts = [tokenizer(render_prompt(tokenizer, [{"role": "user", "content": t}], False),
                         add_special_tokens=False).input_ids for t in texts]
    answer = run_vllm_cpu(VLLM_PYTHON, smollm2_dir, prompts, max_tokens=6, rows=2, eager=True)
    assert len(answer["outputs"]) == 3 and answer["seconds"] > 0
    for ids, reason in zip(answer["outputs"], answer["finish_reasons"], strict=True):
        assert 1 <= len(ids) <= 6
        assert reason == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
    assert tokenizer.decode(answer["outputs"][1], skip_special_tokens=True).strip()
