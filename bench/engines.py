"""Which engines `bench.generate` compares: the `--engines` family of arguments, and the choice of those that can run
here (an optional engine that is not installed is skipped with an `info ... not measured` line, never silently)."""

from __future__ import annotations

import argparse
import os

from bench.llamacpp import INSTALL_HINT as LLAMACPP_HINT
from bench.llamacpp import load_llama_cpp
from bench.vllm_cpu.generate import INSTALL_HINT as VLLM_CPU_HINT

ENGINES = ("hf", "llamacpp", "vllmcpu")


def parse_engines(text: str) -> list[str]:
    """The engines named in a comma-separated list, in the order given, without repeats.

    >>> parse_engines("hf, llamacpp,hf")
    ['hf', 'llamacpp']
    """
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise ValueError(f"--engines: {text!r} must name one or more of {', '.join(ENGINES)}")
    return names


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """`--engines` and the options of the engines compared with the hf engine."""
    parser.add_argument("--engines", default="hf,llamacpp",
                        help="engines to measure, comma-separated: hf (the hf engine, bare generate, Ray Data), "
                             "llamacpp (llama.cpp on the GGUF; skipped with a note when llama_cpp is not installed), "
                             "vllmcpu (vLLM's CPU backend in its own environment: --vllm-python)")
    parser.add_argument("--gguf", default="", help="GGUF file for llamacpp (default: smollm2-135m's bundled one)")
    parser.add_argument("--llamacpp-kv-unified", action="store_true",
                        help="llama.cpp's one KV buffer for all sequences (faster at 16 rows here, slower at 64)")
    parser.add_argument("--vllm-python", default=os.environ.get("QUORUM_VLLM_CPU_PYTHON", ""),
                        help="vllmcpu: the Python of a virtual environment with vLLM's CPU build (bench/vllm_cpu/generate.py)")
    parser.add_argument("--vllm-eager", action="store_true", help="vllmcpu: no torch.compile (enforce_eager)")


def choose_engines(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The engines of `--engines` that can run here, each one left out saying why; a bad list is a usage error."""
    try:
        engines = parse_engines(args.engines)
    except ValueError as exc:
        parser.error(str(exc))
    if "llamacpp" in engines and load_llama_cpp() is None:
        print(f"info llamacpp not measured: {LLAMACPP_HINT}", flush=True)
        engines.remove("llamacpp")
    if "vllmcpu" in engines and not os.path.isfile(args.vllm_python):
        print(f"info vllmcpu not measured: {VLLM_CPU_HINT}", flush=True)
        engines.remove("vllmcpu")
    if "vllmcpu" in engines and "hf" not in engines:
        parser.error("--engines vllmcpu is compared with the hf engine's run: add hf")
    return engines
