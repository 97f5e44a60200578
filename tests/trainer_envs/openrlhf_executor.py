"""OpenRLHF's own rollout path scoring through quorum_clients.openrlhf, run in the OpenRLHF environment
(clients/build_trainer_envs.sh) by tests/test_trainer_clients_e2e.py:

    QUORUM_REWARD_URL=... python tests/trainer_envs/openrlhf_executor.py TOKENIZER_DIR

`SingleTurnAgentExecutor` (openrlhf/utils/agent.py) is built as OpenRLHF's vLLM actor builds it, with
`--reward.remote_url` the installed reward_func file; it tokenizes, generates (vLLM is the world's edge: a stand-in
engine returns fixed tokens), decodes the query and calls the file. Its output then goes through the samples
generator's `_process_response_into_experience` (openrlhf/trainer/ppo_utils/samples_generator.py; vLLM's
SamplingParams, imported there, is stood in for too) and the rewards are concatenated as ppo_trainer.py does.
The experiences are then batched as the experience maker batches them (`make_experience_batch`). Prints one JSON
line: the executor's reward fields and the batched rewards.

With `--control`, the second rollout's reward_func raises, as the file did before it handled failures (httpx's
raise_for_status): the executor leaves that reward None, and batching dies with the TypeError this file prevents.
"""

import asyncio
import json
import sys
import types
from types import SimpleNamespace

from transformers import AutoTokenizer

# vLLM has no CPU build in this environment: stand-ins for the vLLM module the samples generator imports
# SamplingParams from, and for OpenRLHF's vLLM actor module (which it imports batch_vllm_engine_call from)
sys.modules.setdefault("vllm", types.SimpleNamespace(SamplingParams=object))
for _name in ("openrlhf.trainer.ray", "openrlhf.trainer.ray.vllm_engine"):
    _stand_in = types.ModuleType(_name)
    _stand_in.__path__, _stand_in.batch_vllm_engine_call = [], None
    sys.modules[_name] = _stand_in

import quorum_clients.openrlhf
from openrlhf.trainer.ppo_utils.experience import make_experience_batch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils.agent import SingleTurnAgentExecutor


class Engine:
    """vLLM's AsyncLLM as the executor calls it: generate(prompt_token_ids, sampling_params) -> RequestOutput."""

    def __init__(self, token_ids):
        self.token_ids = token_ids

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=list(self.token_ids), text="", finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say something about rivers."}], tokenize=False,
                                       add_generation_prompt=True)
response = "Rivers carry water from the hills down to the sea every single day."
engine = Engine(tokenizer(text=response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
executor = SingleTurnAgentExecutor(quorum_clients.openrlhf.__file__)
params = SimpleNamespace(max_tokens=32, logprobs=None)
outputs = [asyncio.run(executor.execute(prompt, None, params, 512, tokenizer, engine))]
if "--control" in sys.argv:
    def reward_func(queries, prompts, labels):
        raise RuntimeError("503 Service Unavailable")
    executor.reward_func = reward_func
outputs.append(asyncio.run(executor.execute(prompt, None, params, 512, tokenizer, engine)))
experiences = [SamplesGenerator._process_response_into_experience(None, out, max_len=512) for out in outputs]
batch = make_experience_batch(experiences)  # the experience maker's batching: torch.stack of the rewards
print(json.dumps({"reward": [o["reward"] for o in outputs], "extra_logs": [o["extra_logs"] for o in outputs],
                  "rewards": batch.rewards.flatten().tolist(),
                  "failed": [t.flatten().tolist() for t in batch.info["quorum_failed"]]}))
