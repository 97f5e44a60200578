"""CachedEngine: only cache misses reach the engine; usage counts calls, tokens and hits; errors never cached."""

from actors.engines.base import ChatRequest, Completion, EngineSpec, SamplingParams
from actors.engines.cached import CachedEngine, Usage


class CountingEngine:
    """Echoes the last message; 'fail' gives an error completion. Counts the requests it saw."""

    def __init__(self):
        self.seen = 0

    def generate(self, requests):
        self.seen += len(requests)
        out = []
        for r in requests:
            text = r.messages[-1]["content"]
            if text == "fail":
                out.append(Completion(text="", finish_reason="error", error="boom"))
            else:
                out.append(Completion(text=text.upper(), prompt_tokens=3, completion_tokens=len(text)))
        return out


def req(text, seed=0):
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(seed=seed))


def test_cache_hits_skip_the_engine_and_usage_counts(tmp_path):
    model = CachedEngine(EngineSpec(), str(tmp_path / "cache"))
    model.engine = fake = CountingEngine()
    assert [c.text for c in model.complete([req("ab"), req("cde")])] == ["AB", "CDE"]
    first = model.take_usage()
    assert (first.calls, first.prompt_tokens, first.completion_tokens, first.cache_hits) == (2, 6, 5, 0)
    # second time: "ab" cached, a new seed is a new key, "fail" reaches the engine and is not cached
    out = model.complete_cached([req("ab"), req("ab", seed=1), req("fail")])
    assert [hit for _, hit in out] == [True, False, False]
    usage = model.take_usage()
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.cache_hits) == (2, 3, 2, 1)
    assert fake.seen == 4
    model.complete([req("fail")])
    assert fake.seen == 5  # an error completion is asked again
    assert model.take_usage().calls == 1


def test_without_cache_every_request_is_a_call():
    model = CachedEngine({"kind": "hf"})
    model.engine = CountingEngine()
    model.complete([req("x"), req("x")])
    usage = model.take_usage()
    assert (usage.calls, usage.cache_hits) == (2, 0)
    assert model.take_usage() == Usage()


def test_usage_add():
    total = Usage()
    total.add(Usage(calls=1, prompt_tokens=2, completion_tokens=3, seconds=0.5, cache_hits=1))
    total.add(Usage(calls=2, seconds=0.25))
    assert total == Usage(calls=3, prompt_tokens=2, completion_tokens=3, seconds=0.75, cache_hits=1)


def test_a_chat_worker_answered_wholly_from_the_cache_never_loads_its_model(tmp_path, tiny_model_dir):
    """A stage run again over a warm request cache: its actor answers every row from the cache and never loads the
    model (worker_ready_at 0, which the jury's restart count skips); the first actor, with every row a miss, did."""
    import asyncio
    import json

    import pandas as pd

    from actors.chat_worker import ChatWorker

    spec = {"kind": "hf", "model": tiny_model_dir, "num_threads": 1}
    sampling = json.dumps(SamplingParams(temperature=0.0, max_tokens=4).as_dict())
    batch = pd.DataFrame({"id": ["a", "b"], "sampling_json": sampling,
                          "messages_json": [json.dumps([{"role": "user", "content": t}]) for t in ("Hi.", "Bye.")]})
    cache = str(tmp_path / "cache")
    first = ChatWorker(spec, cache_dir=cache)
    cold = asyncio.run(first(batch))
    assert first.model.engine is not None and (cold["worker_ready_at"] > 0).all() and not cold["cached"].any()
    second = ChatWorker(spec, cache_dir=cache)
    warm = asyncio.run(second(batch))
    assert second.model.engine is None and (warm["worker_ready_at"] == 0).all() and warm["cached"].all()
    assert list(warm["completion"]) == list(cold["completion"]) and (warm["worker_seconds"] == 0).all()
