"""Load test of the GRM Serve app: the same bounded load with dynamic batching on, then off.

    python -m bench.serve_load                          # tiny random Llama, 500 chat calls from 16 clients
    python -m bench.serve_load --endpoint score         # the judge path: /score with the jury_score template
    python -m bench.serve_load --model smollm2-135m --requests 200

Starts a local Ray (2 CPUs) and the real Serve app (`serve.app`, HTTP on 127.0.0.1 only), sends `--requests`
distinct calls (response cache off, so every call is a generation of `--max-tokens` tokens) from `--concurrency`
concurrent clients, once at `batching.max_batch_size = --batch-size` and once at 1 (the second deploy is a rolling
update of the same app; the engine's own batch limit stays the same). A hard time cap bounds each phase; calls not
finished by then count as errors.

The default load is POST /v1/chat/completions with a one-sentence prompt: decode-bound, where batching pays. With
`--endpoint score` every call carries the ~900-token few-shot jury prompt, whose prefill is compute-bound on a
CPU, so batching gains much less there (see the hf engine's own bench). Prints `bench <name> = <value>` lines:

- `serve_batched_vs_unbatched`: requests/s with batching / requests/s at max_batch_size 1 (same load).
- `serve_p50_ms`, `serve_p99_ms`: client-side latency percentiles of the batched phase.
- `serve_errors`: non-200 answers, transport errors and capped calls, both phases together.

Client, proxy and replica share the machine's cores, so absolute numbers are noisy; the ratio is measured back to
back on the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time

import httpx

from core.config import load_config
from serve.config import ServeConfig

APP, PREFIX = "grm-bench", "/bench"
PROMPT = "The committee postponed its decision because several members were unable to attend the meeting."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (2-layer random Llama) or a model spec/dir")
    parser.add_argument("--requests", type=int, default=500, help="calls per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--batch-size", type=int, default=16, help="max_batch_size of the batched phase")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per call")
    parser.add_argument("--batch-wait-s", type=float, default=0.1, help="batching.batch_wait_timeout_s")
    parser.add_argument("--endpoint", choices=("chat", "score"), default="chat", help="what each call asks for")
    parser.add_argument("--time-cap-s", type=float, default=240.0, help="hard cap per phase, seconds")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_config(model: str, port: int, batch_size: int, args: argparse.Namespace) -> ServeConfig:
    return load_config(ServeConfig, "configs/grm.yaml", [
        f"judge.engine.model={model}", "judge.engine.num_threads=1", f"judge.engine.max_batch_size={args.batch_size}",
        f"serve.port={port}", f"serve.app_name={APP}", f"serve.route_prefix={PREFIX}", "serve.auth_token_env=",
        f"batching.max_batch_size={batch_size}", f"batching.batch_wait_timeout_s={args.batch_wait_s}",
        "cache_size=0", f"sampling.max_tokens={args.max_tokens}", "resources.num_cpus=1",
        # paper 001's short pointwise prompt (the README's figures): MENLO's rubric prompt is ~4x longer
        "prompts.pointwise=jury_score", "prompts.pointwise_format=answer",
        "prompts.pointwise_vars={prompt: base_sentence, response: new_sentence}",
    ])


def deploy(cfg: ServeConfig) -> None:
    from ray import serve

    from serve.app import make_app

    serve.run(make_app(cfg), name=APP, route_prefix=PREFIX, blocking=False)
    deadline = time.monotonic() + 300
    while serve.status().applications[APP].status != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{APP} did not start: {serve.status().applications[APP]}")
        time.sleep(0.5)


def request_body(endpoint: str, tag: str, i: int) -> dict:
    if endpoint == "score":
        return {"prompt": PROMPT, "response": f"{tag} reply {i}: the meeting decision was delayed."}
    return {"messages": [{"role": "user", "content": f"Simplify ({tag} {i}): {PROMPT}"}]}


async def run_load(url: str, endpoint: str, n: int, concurrency: int, cap_s: float,
                   tag: str) -> tuple[float, list[float], int]:
    """Returns (requests/s over the finished calls, latencies in ms, errors)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    latencies: list[float] = []
    errors = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            i = queue.get_nowait()
            body = request_body(endpoint, tag, i)
            start = time.perf_counter()
            try:
                resp = await http.post(url, json=body)
                ok = resp.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - start) * 1000)
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=cap_s, limits=limits) as http:
        start = time.perf_counter()
        tasks = [asyncio.create_task(client(http)) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=cap_s)
        for task in pending:
            task.cancel()
        elapsed = time.perf_counter() - start
    capped = n - len(latencies) - errors
    return len(latencies) / elapsed, latencies, errors + capped


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def main() -> None:
    import ray
    from ray import serve

    args = parse_args()
    model = args.model
    scratch = tempfile.TemporaryDirectory(prefix="quorum-bench-tiny-")
    if model == "tiny":
        from actors.models import build_tiny_random_model

        model = build_tiny_random_model(scratch.name)
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        path = "/score" if args.endpoint == "score" else "/v1/chat/completions"
        url = f"http://127.0.0.1:{port}{PREFIX}{path}"
        results = {}
        for batch_size in (args.batch_size, 1):
            deploy(bench_config(model, port, batch_size, args))
            warmup = run_load(url, args.endpoint, 2 * args.concurrency, args.concurrency, 60, f"warmup{batch_size}")
            asyncio.run(warmup)
            # the same bodies in both phases, so both generate the same tokens
            load = run_load(url, args.endpoint, args.requests, args.concurrency, args.time_cap_s, "load")
            results[batch_size] = asyncio.run(load)
            rps, _, errors = results[batch_size]
            stats = httpx.get(f"http://127.0.0.1:{port}{PREFIX}/stats", timeout=30).json()
            print(f"info max_batch_size={batch_size}: {rps:.1f} req/s, errors {errors}, "
                  f"batch sizes {stats['batch_sizes']}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        scratch.cleanup()
    batched_rps, latencies, batched_errors = results[args.batch_size]
    single_rps, _, single_errors = results[1]
    print(f"info model={args.model} endpoint={args.endpoint} requests={args.requests} "
          f"concurrency={args.concurrency} max_tokens={args.max_tokens} batch_wait_s={args.batch_wait_s}")
    print(f"bench serve_batched_vs_unbatched = {batched_rps / single_rps:.2f}")
    print(f"bench serve_p50_ms = {percentile(latencies, 0.50):.1f}")
    print(f"bench serve_p99_ms = {percentile(latencies, 0.99):.1f}")
    print(f"bench serve_errors = {batched_errors + single_errors}")


if __name__ == "__main__":
    main()
