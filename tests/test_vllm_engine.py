"""VLLMEngine: pure mapping tests on CPU; real generation with the embedded SmolLM2 on a CUDA machine with vLLM.

GPU run: `python -m pytest tests/test_vllm_engine.py -m gpu -q` (needs `pip install -e '.[gpu]'`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.factory import build_engine
from actors.engines.vllm_sync import (
    VLLMEngine,
    adapter_lora_rank,
    build_llm_kwargs,
    lora_rank_slot,
    shutdown_vllm,
    to_completion,
    to_vllm_sampling_kwargs,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def ask(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(**sampling))


# ----- CPU: pure mappings -----


def test_sampling_mapping_defaults_and_full():
    assert to_vllm_sampling_kwargs(SamplingParams()) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,  # our -1 "no filter" is vLLM's 0
        "max_tokens": 128,
        "seed": 0,
        "stop": None,  # no stop strings
    }
    full = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, max_tokens=9, seed=7, stop=("</s>", "\n\n"))
    assert to_vllm_sampling_kwargs(full) == {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 40,
        "max_tokens": 9,
        "seed": 7,
        "stop": ["</s>", "\n\n"],
    }


@pytest.mark.parametrize(
    "field, value",
    [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("max_tokens", 0)],
)
def test_sampling_mapping_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        to_vllm_sampling_kwargs(SamplingParams(**{field: value}))


def test_llm_kwargs_from_spec():
    spec = EngineSpec(
        kind="vllm",
        dtype="bfloat16",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        enable_prefix_caching=False,
        max_model_len=2048,
    )
    assert build_llm_kwargs(spec, "/models/x") == {
        "model": "/models/x",
        "tensor_parallel_size": 2,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5,
        "enable_prefix_caching": False,
        "max_model_len": 2048,
        "enable_lora": False,
        "structured_outputs_config": {"backend": "guidance"},
    }


def write_adapter_config(directory, **config) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}), encoding="utf-8")
    return str(directory)


def test_an_r64_adapter_gets_a_lora_slot_that_holds_it(tmp_path):
    # judge_grpo_cluster.yaml trains r = 64 judges; vLLM's default max_lora_rank 16 refuses them at load
    spec = EngineSpec(kind="vllm", adapter=write_adapter_config(tmp_path / "r64", r=64, lora_alpha=128))
    kwargs = build_llm_kwargs(spec, "/models/x")
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 64, 1)
    # vLLM checks the largest rank of the adapter, per-module patterns included, and has no 48 slot
    patterned = write_adapter_config(tmp_path / "pattern", r=16, rank_pattern={"q_proj": 48})
    assert build_llm_kwargs(dataclasses.replace(spec, adapter=patterned), "/m")["max_lora_rank"] == 64
    assert "max_lora_rank" not in build_llm_kwargs(dataclasses.replace(spec, adapter=""), "/m")


def test_lora_slots_are_vllms_allowed_ranks():
    # vllm/config/lora.py: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 33, 64, 65, 257, 320, 321, 512)] == [
        1, 8, 8, 16, 64, 64, 128, 320, 320, 512, 512]
    for bad in (0, 513):
        with pytest.raises(ValueError, match="vLLM serves ranks 1..512"):
            lora_rank_slot(bad)


def test_an_unreadable_adapter_is_an_error_naming_its_config(tmp_path):
    with pytest.raises(ValueError, match=r"engine.adapter: cannot read .*adapter_config.json"):
        build_llm_kwargs(EngineSpec(kind="vllm", adapter=str(tmp_path)), "/m")
    bad = write_adapter_config(tmp_path / "bad", r="64")
    with pytest.raises(ValueError, match="must be positive integers"):
        build_llm_kwargs(EngineSpec(kind="vllm", adapter=bad), "/m")
    assert adapter_lora_rank(write_adapter_config(tmp_path / "ok", r=8)) == 8


@pytest.mark.parametrize(
    "field, value",
    [("dtype", "fp8"), ("tensor_parallel_size", 0), ("gpu_memory_utilization", 1.2), ("max_model_len", 0)],
)
def test_bad_vllm_spec_fails_before_importing_vllm(field, value):
    with pytest.raises(ValueError, match=f"engine.{field}"):
        VLLMEngine(EngineSpec(kind="vllm", model="hf:any/model", **{field: value}))


def test_to_completion_splits_thinking_and_maps_finish_reasons():
    # Shaped like vllm.RequestOutput (prompt_token_ids + outputs[0].text/token_ids/finish_reason).
    def output(text, finish_reason, n_tokens=3):
        sample = SimpleNamespace(text=text, token_ids=list(range(n_tokens)), finish_reason=finish_reason)
        return SimpleNamespace(prompt_token_ids=[1, 2, 3, 4, 5], outputs=[sample])

    done = to_completion(output("<think>hmm</think> Answer: [4]", "stop"))
    assert (done.text, done.reasoning, done.raw_text) == ("Answer: [4]", "hmm", "<think>hmm</think> Answer: [4]")
    assert (done.prompt_tokens, done.completion_tokens, done.finish_reason) == (5, 3, "stop")
    assert to_completion(output("cut", "length")).finish_reason == "length"
    aborted = to_completion(output("partial", "abort"))
    assert (aborted.text, aborted.finish_reason) == ("", "error") and aborted.error


class FakeAsyncLLM:
    """What `shutdown_vllm` uses of an `AsyncLLM`: its output handler task and `shutdown`."""

    output_handler: asyncio.Task

    def shutdown(self, timeout=None):
        self.handler_done_at_shutdown = self.output_handler.done()


def test_shutdown_stops_an_async_engines_output_handler_before_its_engine_core():
    """`AsyncLLM.shutdown` cancels its output handler only after the engine core has exited: shut down off the
    engine's loop while the loop runs on (a Ray async actor's `__ray_shutdown__` on the main thread), the handler saw
    the engine core die and logged an `EngineDeadError` traceback. On the loop's own thread (a Serve replica's
    `__del__`) the cancel must not wait for the loop it blocks."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        engine = FakeAsyncLLM()

        async def start():
            engine.output_handler = asyncio.create_task(asyncio.Event().wait())

        asyncio.run_coroutine_threadsafe(start(), loop).result(5)
        shutdown_vllm(engine)
        assert engine.handler_done_at_shutdown and engine.output_handler.cancelled()

        on_loop = FakeAsyncLLM()

        async def shut_down_on_the_loop():
            on_loop.output_handler = asyncio.create_task(asyncio.Event().wait())
            await asyncio.sleep(0)
            shutdown_vllm(on_loop)
            await asyncio.sleep(0)
            return on_loop.output_handler.cancelled()

        assert asyncio.run_coroutine_threadsafe(shut_down_on_the_loop(), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_module_imports_without_vllm():
    code = "import sys, actors.engines.vllm_sync; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- GPU: real vLLM generation -----


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("vllm")
    spec = EngineSpec(kind="vllm", model="smollm2-135m", gpu_memory_utilization=0.3, max_model_len=512)
    eng = build_engine(spec)
    yield eng
    eng.close()


@pytest.mark.gpu
@needs_cuda
def test_greedy_generation_is_ordered_and_deterministic(engine):
    short, long = ask("Hi.", max_tokens=16), ask("Please name one primary colour, in a single word.", max_tokens=16)
    first = engine.generate([short, long])
    # Prompt lengths differ, so the token counts show each completion sits at its request's index.
    assert first[0].prompt_tokens < first[1].prompt_tokens
    for c in first:
        assert c.finish_reason in ("stop", "length") and c.text
        assert 0 < c.completion_tokens <= 16
    assert [c.text for c in engine.generate([short, long])] == [c.text for c in first]


@pytest.mark.gpu
@needs_cuda
def test_max_tokens_and_sampled_seed(engine):
    [short] = engine.generate([ask("Tell me a long story.", max_tokens=1)])
    assert (short.finish_reason, short.completion_tokens) == ("length", 1)
    sampled = ask("Write a word.", temperature=1.0, top_k=50, max_tokens=8, seed=11)
    assert engine.generate([sampled])[0].text == engine.generate([sampled])[0].text


@pytest.mark.gpu
@needs_cuda
def test_bad_rows_fail_alone(engine):
    too_long = ask("word " * 2000, max_tokens=4)  # far beyond max_model_len=512
    bad_sampling = ask("hi", top_p=0.0)
    done = engine.generate([ask("Say hi.", max_tokens=4), too_long, bad_sampling])
    assert done[0].finish_reason in ("stop", "length") and done[0].text
    assert done[1].finish_reason == "error" and done[1].error
    assert done[2].finish_reason == "error" and "sampling.top_p" in done[2].error


@pytest.mark.gpu
@needs_cuda
def test_grammar_constrained_verdict_parses(engine):
    """vLLM's guidance backend reads the judge grammar: a free-running model's MENLO verdict always parses."""
    from eval.judging.grammar import judge_grammar
    from eval.judging.menlo_parse import parse_menlo_grades

    grammar = judge_grammar("pairwise", 96)
    requests = [ask(f"Grade two answers to question {i}.", temperature=1.0, max_tokens=96, seed=i) for i in range(8)]
    requests = [dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, grammar=grammar)) for r in requests]
    for completion in engine.generate(requests):
        assert parse_menlo_grades(completion.raw_text).error == "", completion.raw_text
