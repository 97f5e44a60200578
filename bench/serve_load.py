"""Load test of the GRM Serve app: the same bounded load with dynamic batching on, then off.

    python -m bench.serve_load                          # tiny random Llama, 500 chat calls from 16 clients
    python -m bench.serve_load --endpoint score         # the judge path: /score with the jury_score template
    python -m bench.serve_load --model smollm2-135m --requests 200
    python -m bench.serve_load --model smollm2-135m --endpoint all    # /score, /compare, /reward/group in one run

Starts a local Ray (2 CPUs) and the real Serve app (`serve.app`, HTTP on 127.0.0.1 only), sends `--requests`
distinct calls (response cache off, so every call is a generation of `--max-tokens` tokens) from `--concurrency`
concurrent clients, once at `batching.max_batch_size = --batch-size` and once at 1 (the second deploy is a rolling
update of the same app; the engine's own batch limit stays the same). A hard time cap bounds each phase; calls not
finished by then count as errors.

The default load is POST /v1/chat/completions with a one-sentence prompt: decode-bound, where batching pays. The
judge endpoints carry paper 001's jury templates (`--endpoint score`: the ~900-token few-shot pointwise prompt;
`compare`: the pairwise prompt, two grade blocks; `reward_group`: `--group-size` responses judged all_pairs, i.e.
n(n-1)/2 pairwise judgments per call); their shared instructions are prefilled once per engine call, so batching
pays there too. `--endpoint all` runs score, compare and reward_group against the same two deployments (batched,
then unbatched). The unbatched phase of a judge endpoint sends `--unbatched-requests` calls (16 by default: each one
prefills the whole judge prompt on its own, so 500 of them would take most of an hour per endpoint on 2 cores);
throughput is a rate, so a shorter phase measures it as well. `--max-tokens` 64 is the floor for whole judgments:
MENLO's two grade blocks take up to 62 SmolLM2 tokens (fewer can cut a verdict, which then fails to parse). On 2 near-idle cores a batched SmolLM2 judge answers ~0.7 calls/s, so the default `--endpoint all` run (3 x
500 batched calls) took 55 minutes on a 2-core machine (docs/benchmarks.md); `--requests 250` keeps it near 30.
Prints `bench <name> = <value>` lines, `<ep>` being the endpoint (chat, score, compare, reward_group):

- `serve_<ep>_batched_vs_unbatched`: requests/s with batching / requests/s at max_batch_size 1.
- `serve_<ep>_p50_ms`, `serve_<ep>_p99_ms`: client-side latency percentiles of the batched phase.
- `serve_<ep>_5xx`: answers with a 5xx status, both phases (target 0).
- `serve_<ep>_other_errors`: other non-200 answers, transport errors and calls cut by the time cap, both phases.

Client, proxy and replica share the machine's cores, so absolute numbers are noisy; the ratio is measured back to
back on the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from dataclasses import dataclass, field

import httpx

from core.config import load_config
from core.ray_env import RayConfig
from serve.config import ServeConfig

APP, PREFIX = "grm-bench", "/bench"
ENDPOINTS = {"chat": "/v1/chat/completions", "score": "/score", "compare": "/compare",
             "reward_group": "/reward/group"}
JUDGE_ENDPOINTS = ("score", "compare", "reward_group")
PROMPT = "The committee postponed its decision because several members were unable to attend the meeting."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (2-layer random Llama) or a model spec/dir")
    parser.add_argument("--requests", type=int, default=500, help="calls of the batched phase, per endpoint")
    parser.add_argument("--unbatched-requests", type=int, default=0,
                        help="calls of the unbatched phase, per endpoint (0 = --requests for chat, 16 for the judge "
                             "endpoints)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--batch-size", type=int, default=16, help="max_batch_size of the batched phase")
    # 64: MENLO's two grade blocks (/compare, /reward/group) take up to 62 tokens; /score's rationale gets the rest
    parser.add_argument("--max-tokens", type=int, default=64, help="max tokens generated per judge call")
    parser.add_argument("--group-size", type=int, default=2, help="responses per /reward/group call")
    parser.add_argument("--batch-wait-s", type=float, default=0.1, help="batching.batch_wait_timeout_s")
    parser.add_argument("--endpoint", choices=(*ENDPOINTS, "all"), default="chat",
                        help="what each call asks for; all = score, compare and reward_group")
    parser.add_argument("--time-cap-s", type=float, default=1800.0,
                        help="hard cap per phase, seconds (500 batched SmolLM2 judge calls take ~12 minutes)")
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
        # the phase cap bounds the calls; the service's own 120 s deadline would answer 504 to calls queued behind a
        # serial engine (the unbatched phase: 16 clients x ~6 s per SmolLM2 judgment, longer on a busy machine)
        f"serve.request_timeout_s={args.time_cap_s}", f"shutdown.timeout_s={args.time_cap_s}",
        f"health.max_engine_call_s={args.time_cap_s}",
        # paper 001's short pointwise prompt (docs/benchmarks.md's figures): MENLO's rubric prompt is ~4x longer
        "prompts.pointwise=jury_score", "prompts.pointwise_format=answer",
        "prompts.pointwise_vars={prompt: base_sentence, response: new_sentence}",
        "prompts.pairwise=jury_pairwise",
        "prompts.pairwise_vars={prompt: source, response_a: candidate_a, response_b: candidate_b}",
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


def request_body(endpoint: str, tag: str, i: int, group_size: int = 2) -> dict:
    reply = f"{tag} reply {i}: the meeting decision was delayed."
    if endpoint == "score":
        return {"prompt": PROMPT, "response": reply}
    if endpoint == "compare":
        return {"prompt": PROMPT, "response_a": reply, "response_b": f"{tag} {i}: the vote waited for members."}
    if endpoint == "reward_group":
        return {"prompt": PROMPT, "responses": [f"{reply} (variant {k})" for k in range(group_size)]}
    return {"messages": [{"role": "user", "content": f"Simplify ({tag} {i}): {PROMPT}"}]}


@dataclass
class Phase:
    """One phase's outcome: finished calls' latencies and the errors by kind."""

    rps: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors_5xx: int = 0
    errors_other: int = 0
    # status code -> calls, of the calls that were not 200 (0 = transport error)
    failures: dict[int, int] = field(default_factory=dict)


async def run_load(url: str, endpoint: str, n: int, concurrency: int, cap_s: float, tag: str,
                   group_size: int = 2) -> Phase:
    """`n` calls from `concurrency` clients; a call unfinished at `cap_s` counts as an `other` error."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    phase = Phase()

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = request_body(endpoint, tag, i, group_size)
            start = time.perf_counter()
            try:
                status = (await http.post(url, json=body)).status_code
            except httpx.HTTPError:
                status = 0
            if status == 200:
                phase.latencies_ms.append((time.perf_counter() - start) * 1000)
            else:
                phase.failures[status] = phase.failures.get(status, 0) + 1
                if status >= 500:
                    phase.errors_5xx += 1
                else:
                    phase.errors_other += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=cap_s, limits=limits) as http:
        start = time.perf_counter()
        tasks = [asyncio.create_task(client(http)) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=cap_s)
        for task in pending:
            task.cancel()
        elapsed = time.perf_counter() - start
    phase.errors_other += n - len(phase.latencies_ms) - phase.errors_5xx - phase.errors_other
    phase.rps = len(phase.latencies_ms) / elapsed
    return phase


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def phase_requests(args: argparse.Namespace, endpoint: str, batched: bool) -> int:
    if batched:
        return args.requests
    if args.unbatched_requests:
        return args.unbatched_requests
    return args.requests if endpoint == "chat" else min(args.requests, 16)


def main() -> None:
    import ray
    from ray import serve

    args = parse_args()
    endpoints = JUDGE_ENDPOINTS if args.endpoint == "all" else (args.endpoint,)
    model = args.model
    scratch = tempfile.TemporaryDirectory(prefix="quorum-bench-tiny-")
    if model == "tiny":
        from actors.models import build_tiny_random_model

        model = build_tiny_random_model(scratch.name)
    port = free_port()
    base = f"http://127.0.0.1:{port}{PREFIX}"
    # workers at quorum's nice value, as `quorum serve` starts them (core.ray_env.init_ray): at Ray's own 15 the
    # replica starves beside any busy process and the figures measure the machine's other load, not the service
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}},
             _system_config={"worker_niceness": RayConfig().worker_niceness})
    results: dict[tuple[str, int], Phase] = {}
    started = time.perf_counter()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for batch_size in (args.batch_size, 1):
            deploy(bench_config(model, port, batch_size, args))
            for endpoint in endpoints:
                url = base + ENDPOINTS[endpoint]
                # first calls pay one-off costs (grammar compile, allocator growth); unbatched, two suffice
                n_warm = args.concurrency if batch_size > 1 else 2
                warmup = run_load(url, endpoint, n_warm, args.concurrency, 300, f"warmup{batch_size}",
                                  args.group_size)
                asyncio.run(warmup)
                n = phase_requests(args, endpoint, batch_size > 1)
                # the same bodies in both phases, so both generate the same tokens
                phase = asyncio.run(run_load(url, endpoint, n, args.concurrency, args.time_cap_s, "load",
                                             args.group_size))
                results[endpoint, batch_size] = phase
                stats = httpx.get(f"{base}/stats", timeout=30).json()
                print(f"info {endpoint} max_batch_size={batch_size}: {n} calls, {phase.rps:.2f} req/s, "
                      f"5xx {phase.errors_5xx}, other errors {phase.errors_other}, non-200 by status {phase.failures}, p50 "
                      f"{percentile(phase.latencies_ms, 0.5):.0f} ms, replica batch sizes so far "
                      f"{stats['batch_sizes']}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        scratch.cleanup()
    print(f"info model={args.model} endpoint={args.endpoint} requests={args.requests} "
          f"concurrency={args.concurrency} max_tokens={args.max_tokens} group_size={args.group_size} "
          f"batch_wait_s={args.batch_wait_s} wall_s={time.perf_counter() - started:.0f}")
    for endpoint in endpoints:
        batched, single = results[endpoint, args.batch_size], results[endpoint, 1]
        name = f"serve_{endpoint}"
        ratio = batched.rps / single.rps if single.rps else float("nan")
        print(f"bench {name}_batched_vs_unbatched = {ratio:.2f}")
        print(f"bench {name}_p50_ms = {percentile(batched.latencies_ms, 0.50):.1f}")
        print(f"bench {name}_p99_ms = {percentile(batched.latencies_ms, 0.99):.1f}")
        print(f"bench {name}_5xx = {batched.errors_5xx + single.errors_5xx}")
        print(f"bench {name}_other_errors = {batched.errors_other + single.errors_other}")


if __name__ == "__main__":
    main()
