"""quorum's vLLM engines on vLLM itself (its CPU build): the judge engine and the colocated rollout engine.

    python -m bench.vllm_cpu.engines --vllm-python ~/vllm-cpu/bin/python    # or QUORUM_VLLM_CPU_PYTHON

No machine here runs CUDA vLLM, so the code that faces vLLM is checked against vLLM's CPU backend, which has the
same Python API (the environment: bench/vllm_cpu/generate.py). The child (bench/vllm_cpu/engines_child.py) runs in that
environment and drives:

- engine arguments -> vLLM's own engine config: `actors.engines.vllm_sync.build_llm_kwargs` for an r = 64 judge adapter
  and `train.grpo.rollout_vllm.colocated_engine_args` for a training rank, through `EngineArgs.create_engine_config()`,
  and the adapter against the LoRA slot the arguments size, as vLLM checks it at load;
- the judge engine (`VLLMEngine`) generating with an r = 64 LoRA adapter (random, made here with peft on SmolLM2),
  a grammar-constrained verdict (`eval.judging.grammar`, vLLM's guidance backend) among its requests;
- two colocated rollout ranks (`VLLMRollout`, vLLM's `external_launcher`) inside one gloo process group, as two Ray
  Train workers of a node.

Sleep mode is CUDA-only: on this backend vLLM refuses `enable_sleep_mode` when it builds the model config
(vllm/config/model.py, "Sleep mode is not supported on current platform"), and the config case records the refusal.
The tier's rollout test lets the CPU platform accept it (the child's `allow_sleep_mode_on_cpu`): then vLLM's own
engine core pauses and resumes its scheduler on `sleep`/`wake_up` while its CPU worker moves no memory, so the order
of quorum's calls meets vLLM's real state machine, not a recording. Prints `bench <name> = <value>` lines (`judge_lora_vs_base`: tokens/s
of the judge's requests with its adapter over the same engine's without it; `colocated_tokens_per_s`: both ranks'
rollout tokens over the slower rank's sampling time); tests/test_vllm_cpu_tier.py asserts on the same answers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from actors.engines.base import EngineSpec
from actors.engines.vllm_sync import build_llm_kwargs
from actors.models import resolve_model_dir
from bench.vllm_cpu.generate import check_vllm_version
from eval.judging.grammar import judge_grammar
from eval.judging.parse import parse_score
from train.grpo.rollout_vllm import colocated_engine_args

CHILD = Path(__file__).with_name("engines_child.py")
INSTALL_HINT = "--vllm-python (or QUORUM_VLLM_CPU_PYTHON) names no Python with vLLM's CPU build: see bench/vllm_cpu/generate.py"
ADAPTER_RANK = 64  # the judges of configs/judge_grpo_cluster.yaml
# a small share of host memory per engine: on the CPU backend gpu_memory_utilization is a share of RAM
CPU_MEMORY_SHARE = 0.05
MAX_MODEL_LEN = 512
# two engines loading and sampling with LoRA on two busy cores stay well inside this
_TIMEOUT_S = 1800


def run_child(python: str, request: dict, timeout_s: int = _TIMEOUT_S) -> dict:
    """The child's answer for one request; a failed child is an error with its output's tail."""
    with tempfile.TemporaryDirectory(prefix="quorum-vllm-engines-") as tmp:
        answer = Path(tmp) / "answer.json"
        done = subprocess.run([python, str(CHILD), str(answer)], input=json.dumps(request), text=True,
                              capture_output=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not answer.is_file():
            raise RuntimeError(f"{python} {CHILD.name} ({request['case']}) exited {done.returncode}:\n"
                               f"{(done.stdout + done.stderr)[-4000:]}")
        got = json.loads(answer.read_text(encoding="utf-8"))
    check_vllm_version(got["vllm_version"])  # the tier checks the gpu extra's vLLM, no other
    return got


def make_random_adapter(model_dir: str, out_dir: str | Path, r: int = ADAPTER_RANK, seed: int = 0) -> str:
    """A peft LoRA adapter of rank `r` on the attention projections with random (non-zero) A and B, so it changes
    the model's output; the shape a GRPO judge run writes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(out_dir))
    return str(out_dir)


def judge_spec(model_dir: str, adapter: str) -> EngineSpec:
    return EngineSpec(kind="vllm", model=model_dir, adapter=adapter, dtype="bfloat16",
                      gpu_memory_utilization=CPU_MEMORY_SHARE, max_model_len=MAX_MODEL_LEN)


def rollout_args(model_dir: str, rank: int, world_size: int, sleep_mode: bool = False) -> tuple[dict, dict]:
    return colocated_engine_args(model_dir, rank=rank, local_rank=rank, world_size=world_size,
                                 lora_rank=ADAPTER_RANK, gpu_memory_utilization=CPU_MEMORY_SHARE,
                                 max_model_len=MAX_MODEL_LEN, seed=3, sleep_mode=sleep_mode)


def config_request(model_dir: str, adapter: str) -> dict:
    """The engines' arguments, as quorum builds them, for vLLM to turn into its config."""
    judge = build_llm_kwargs(judge_spec(model_dir, adapter), model_dir)
    rollout, env = rollout_args(model_dir, rank=1, world_size=2)
    sleeping, _ = rollout_args(model_dir, rank=1, world_size=2, sleep_mode=True)
    return {"case": "config", "env": env, "engines": {"judge": judge, "rollout": rollout, "rollout_sleep": sleeping},
            "lora_checks": [[adapter, judge["max_lora_rank"]], [adapter, rollout["max_lora_rank"]],
                            [adapter, 16]]}  # 16: vLLM's default max_lora_rank


SCORE_TOKENS = 24


def judge_request(model_dir: str, adapter: str) -> dict:
    """A score verdict under the judge grammar and a free-text answer, from the r = 64 judge."""
    verdict = {"messages": [{"role": "user", "content": "Rate this simplification from 1 to 5 and end with "
                                                        "Answer: [k].\nOriginal: The committee postponed its "
                                                        "decision.\nSimplified: The group waited to decide."}],
               "sampling": {"max_tokens": SCORE_TOKENS, "grammar": judge_grammar("score", SCORE_TOKENS)}}
    free = {"messages": [{"role": "user", "content": "Name a colour."}], "sampling": {"max_tokens": 8}}
    spec = judge_spec(model_dir, adapter)
    return {"case": "judge", "spec": {"kind": spec.kind, "model": spec.model, "adapter": spec.adapter,
                                      "dtype": spec.dtype, "gpu_memory_utilization": spec.gpu_memory_utilization,
                                      "max_model_len": spec.max_model_len},
            "requests": [verdict, free]}


def rollout_request(model_dir: str, adapter: str, scratch: str, prompts: list[list[int]], group_size: int = 2,
                    max_tokens: int = 4, sleep_mode: bool = False, updated_adapter: str = "") -> dict:
    """Two training ranks' colocated engines sampling `group_size` rollouts per prompt with the policy adapter;
    `sleep_mode` and `updated_adapter` as in bench/vllm_cpu/engines_child.py."""
    return {"case": "rollout", "world_size": 2, "model": model_dir, "adapter": adapter, "scratch": scratch,
            "prompts": prompts, "group_size": group_size, "sleep_mode": sleep_mode, "updated_adapter": updated_adapter,
            "cfg": {"lora_r": ADAPTER_RANK, "seed": 3, "max_prompt_length": MAX_MODEL_LEN - max_tokens,
                    "max_completion_length": max_tokens, "gpu_memory_utilization": CPU_MEMORY_SHARE}}


def verdict_parsed(completion: dict) -> bool:
    return completion["finish_reason"] == "stop" and not parse_score(completion["text"]).error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=os.environ.get("QUORUM_VLLM_CPU_PYTHON", ""))
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.vllm_python):
        print(f"info vllmcpu engines not measured: {INSTALL_HINT}")
        return
    model_dir = resolve_model_dir(args.model)
    with tempfile.TemporaryDirectory(prefix="quorum-vllm-engines-") as tmp:
        adapter = make_random_adapter(model_dir, Path(tmp) / f"r{ADAPTER_RANK}")
        began = time.perf_counter()
        config = run_child(args.vllm_python, config_request(model_dir, adapter))
        engines = config["engines"]
        print(f"info vllmcpu version={config['vllm_version']} judge_config={engines['judge']} "
              f"rollout_config={engines['rollout']}")
        print(f"bench vllmcpu_engine_configs_accepted = "
              f"{sum(not e['error'] for n, e in engines.items() if n != 'rollout_sleep')}")
        print(f"bench vllmcpu_engine_config_s = {time.perf_counter() - began:.1f}")
        judge = run_child(args.vllm_python, judge_request(model_dir, adapter))
        adapted_tokens = sum(c["completion_tokens"] for c in judge["adapted"])
        base_tokens = sum(c["completion_tokens"] for c in judge["base"])
        print(f"bench vllmcpu_judge_load_s = {judge['load_s']:.1f}")
        print(f"bench vllmcpu_judge_lora_r{ADAPTER_RANK}_tokens_per_s = {adapted_tokens / judge['adapted_s']:.2f}")
        print(f"bench vllmcpu_judge_lora_vs_base = "
              f"{adapted_tokens / judge['adapted_s'] / (base_tokens / judge['base_s']):.2f}")
        print(f"bench vllmcpu_judge_grammar_verdict_parsed = {int(verdict_parsed(judge['adapted'][0]))}")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        prompts = [tokenizer(t)["input_ids"] for t in ("Simplify: the committee postponed its decision.",
                                                       "Say one word.")]
        rollout = run_child(args.vllm_python, rollout_request(model_dir, adapter, tmp, prompts))
        ranks = rollout["ranks"]
        tokens = sum(len(ids) for r in ranks for ids in r["ids"])
        print(f"info vllmcpu colocated ranks={[r['rank'] for r in ranks]} "
              f"world_group={[r['world_group_size'] for r in ranks]} tp_group={[r['tp_group_size'] for r in ranks]} "
              f"backend={ranks[0]['distributed_executor_backend']}")
        print(f"bench vllmcpu_colocated_ranks_sampled = {sum(len(r['ids']) == 2 * len(prompts) for r in ranks)}")
        print(f"bench vllmcpu_colocated_load_s = {max(r['load_s'] for r in ranks):.1f}")
        print(f"bench vllmcpu_colocated_tokens_per_s = {tokens / max(r['seconds'] for r in ranks):.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
