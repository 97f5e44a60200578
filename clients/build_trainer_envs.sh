#!/usr/bin/env bash
# Build the trainer environments the end-to-end client tests run in (tests/test_trainer_clients_e2e.py): one fresh
# venv per trainer under ~/.cache/quorum/trainers/<name> (QUORUM_TRAINER_ENVS overrides), holding the trainer's own
# pins and quorum-clients installed from this folder with pip, nothing else of quorum.
#
#   bash clients/build_trainer_envs.sh            # trl, openrlhf and verl, one after the other
#   bash clients/build_trainer_envs.sh verl       # one of them
#   bash clients/build_trainer_envs.sh clients    # reinstall quorum-clients alone into the built envs
#
# torch is constrained to 2.13.0 (the CPU build the machine's index serves; an unpinned torch resolves a CUDA one).
# OpenRLHF 0.11.2 and verl 0.9.1 install with --no-deps: their GPU-only requirements (flash-attn, deepspeed, vLLM,
# bitsandbytes) have no CPU build; the pure requirements their reward paths import are listed below at the
# versions their metadata allows (OpenRLHF: transformers==5.15.0, ray==2.55.0; verl: transformers<5.11).
set -euo pipefail
cd "$(dirname "$0")"
ROOT="${QUORUM_TRAINER_ENVS:-$HOME/.cache/quorum/trainers}"
PYTHON="${PYTHON:-python3.11}"
mkdir -p "$ROOT"
CONSTRAINTS="$ROOT/constraints.txt"
echo "torch==2.13.0" > "$CONSTRAINTS"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fresh() {  # fresh <name>: an empty venv at $ROOT/<name>.building, moved into place once complete
    rm -rf "$ROOT/$1.building"
    "$PYTHON" -m venv "$ROOT/$1.building"
    "$ROOT/$1.building/bin/pip" install -q "pip==25.2"
}
done_env() {  # the env is complete only after every install succeeded
    rm -rf "$ROOT/$1"
    mv "$ROOT/$1.building" "$ROOT/$1"
    # the venv's scripts name their interpreter by absolute path: rewrite the moved ones
    sed -i "s#$ROOT/$1.building#$ROOT/$1#g" "$ROOT/$1"/bin/* 2>/dev/null || true
    echo "built $ROOT/$1"
}

build_trl() {
    fresh trl
    local pip="$ROOT/trl.building/bin/pip"
    "$pip" install -q -c "$CONSTRAINTS" "torch==2.13.0" "trl==1.16.0" ./
    done_env trl
}

build_openrlhf() {
    fresh openrlhf
    local pip="$ROOT/openrlhf.building/bin/pip"
    # openrlhf.utils.agent needs aiohttp, openrlhf.utils pylatexenc; the executor's tokenizer and reward tensors
    # need transformers and torch; its samples generator imports ray (pinned by OpenRLHF) and vLLM (GPU-only: the
    # tests stand in for the vLLM modules)
    "$pip" install -q -c "$CONSTRAINTS" "torch==2.13.0" "transformers==5.15.0" "ray==2.55.0" aiohttp pylatexenc ./
    "$pip" install -q --no-deps "openrlhf==0.11.2"
    done_env openrlhf
}

build_verl() {
    fresh verl
    local pip="$ROOT/verl.building/bin/pip"
    # verl's reward loop imports ray, tensordict, omegaconf/hydra, transformers (<5.11), codetiming, pandas; its
    # RLHFDataset pillow
    "$pip" install -q -c "$CONSTRAINTS" "torch==2.13.0" "transformers>=5.5.3,<5.11,!=5.6.0" "ray[default]>=2.41.0" \
        "tensordict>=0.8.0,<=0.10.0,!=0.9.0" hydra-core codetiming dill pandas "pyarrow>=19.0.0" "numpy>=2.0.0" \
        packaging pylatexenc torchdata datasets peft accelerate pillow ./
    "$pip" install -q --no-deps "verl==0.9.1"
    done_env verl
}

build_clients() {  # reinstall quorum-clients alone into every built env (after an edit of this folder)
    for env in trl openrlhf verl; do
        [ -x "$ROOT/$env/bin/pip" ] && "$ROOT/$env/bin/pip" install -q --no-deps --force-reinstall ./
    done
    return 0
}

for name in "${@:-trl openrlhf verl}"; do
    for n in $name; do "build_$n"; done
done
