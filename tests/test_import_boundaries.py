"""The pure modules never import ray, vllm or deepspeed, checked at run time in a fresh interpreter.

`lint-imports` (tests/test_layers.py) checks our own import statements; this test covers what it cannot see:
third-party packages that import the distributed stack on our behalf, and imports made when a module loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PURE = sorted(
    [".".join(p.relative_to(REPO).with_suffix("").parts) for p in (REPO / "eval").rglob("*.py") if p.stem != "__init__"]
    + ["train.preference.losses", "train.preference.objective", "train.logprobs", "train.grpo.advantages", "train.preference.pairs", "train.sequences", "train.ds_config",
       "train.grpo.reward.judge_training", "train.grpo.batch",
       "train.config", "train.grpo.reward.client", "train.precision",
       "actors.engines.base", "actors.engines.hf.token_sampling", "actors.corpus", "actors.corpus_files", "actors.ratings",
       "actors.engines.cache", "serve.protocol", "serve.judge_prompts", "serve.rewards"]
    + [f"core.{p.stem}" for p in (REPO / "core").glob("*.py") if p.stem != "__init__"]
)
FORBIDDEN = ("ray", "vllm", "deepspeed")


def test_pure_modules_import_no_distributed_stack():
    # one fresh interpreter imports them all: if any pulled ray/vllm/deepspeed in, it shows in sys.modules,
    # and the per-module record names the culprit
    code = (
        "import sys, importlib, json\n"
        "seen = {}\n"
        f"for name in {PURE!r}:\n"
        "    importlib.import_module(name)\n"
        f"    seen[name] = sorted(m for m in {FORBIDDEN!r} if m in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    offenders = {name: mods for name, mods in seen.items() if mods}
    assert not offenders, f"pure modules pull in the distributed stack: {offenders}"


def test_the_driver_builds_both_trainers_without_the_workers_stack():
    """The driver pickles each trainer's worker function by reference and builds the `TorchTrainer`; DeepSpeed and
    peft load in the workers only (they cost a training stage's driver seconds on 2 cores)."""
    code = (
        "import pickle, sys, tempfile\n"
        "from train.config import GRPOConfig, TrainConfig\n"
        "from train.grpo.trainer import build_grpo_trainer, grpo_worker\n"
        "from train.preference.trainer import preference_worker\n"
        "from train.trainer import build_trainer\n"
        "build_trainer(TrainConfig(model='m'), {}, tempfile.mkdtemp(), loop=preference_worker)\n"
        "build_grpo_trainer(GRPOConfig(model='m'), {}, tempfile.mkdtemp())\n"
        "sizes = [len(pickle.dumps(f)) for f in (preference_worker, grpo_worker)]\n"
        "print(sorted(m for m in ('deepspeed', 'peft') if m in sys.modules), max(sizes))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded, size = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert loaded == "[]" and int(size) < 200, out.stdout
