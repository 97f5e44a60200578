"""verl's reward loop scoring a group scheme through quorum_clients.verl_manager, run in the verl environment
(clients/build_trainer_envs.sh) by tests/test_trainer_clients_e2e.py:

    python tests/trainer_envs/verl_manager.py URL MODEL_DIR DATA_PARQUET [--file-paths]

The config is verl's own (verl/trainer/config/ppo_trainer.yaml, composed by Hydra) with the overrides the docs give;
the manager class is resolved as verl's RewardLoopManager resolves it (`resolve_reward_manager_cls`), and a
`RewardLoopWorker` (the class each reward-loop actor runs) loads it with the custom function. The data is a parquet
file shaped like verl's RLHF example (examples/data_preprocess/full_hh_rlhf.py) read through verl's RLHFDataset;
each prompt is repeated `rollout.n` times with one uid, as the trainer does, and the rollouts reach the worker one
at a time in shuffled order, concurrently, as the agent loop sends them (`compute_score` per sample).
Prints one JSON line per rollout: uid, prompt messages, response, reward and extra info; then the rm_scores check.
"""

import asyncio
import json
import os
import random
import sys
import uuid

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.reward import resolve_reward_manager_cls
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

url, model_dir, parquet = sys.argv[1], sys.argv[2], sys.argv[3]
N = 2
# --file-paths: the two modules given to verl as files of the installed package (load_extern_object then runs
# spec_from_file_location on them) instead of pkg:// names
if "--file-paths" in sys.argv:
    import quorum_clients.verl

    MANAGER = os.path.join(os.path.dirname(quorum_clients.verl.__file__), "verl_manager.py")
    FUNCTION = quorum_clients.verl.__file__
else:
    MANAGER, FUNCTION = "pkg://quorum_clients.verl_manager", "pkg://quorum_clients.verl"
CALLER = "verl-group-files" if "--file-paths" in sys.argv else "verl-group"
overrides = [
    f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.rollout.val_kwargs.n={N}", "reward.num_workers=1",
    "reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={MANAGER}",
    "reward.reward_manager.name=QuorumRewardManager",
    f"reward.custom_reward_function.path={FUNCTION}",
    "reward.custom_reward_function.name=compute_score_batch",
    f"+reward.custom_reward_function.reward_kwargs.url={url}",
    f"+reward.custom_reward_function.reward_kwargs.caller={CALLER}",
    "+reward.custom_reward_function.reward_kwargs.scheme=all_pairs",
    "+reward.custom_reward_function.reward_kwargs.dimension=fluency",
    "+reward.custom_reward_function.reward_kwargs.locale=en_US",
    f"data.train_files={parquet}", f"data.val_files={parquet}", "data.max_prompt_length=128",
]
with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                           version_base=None):
    config = compose("ppo_trainer", overrides=overrides)

manager_cls = resolve_reward_manager_cls(config)  # RewardLoopManager.__init__, on the driver
worker = RewardLoopWorker(config)                  # each ray.remote(RewardLoopWorker) actor
tokenizer = worker.input_tokenizer

dataset = RLHFDataset(data_files=[parquet], tokenizer=tokenizer, config=config.data)
batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
batch = batch.repeat(repeat_times=N, interleave=True)  # ray_trainer.py: a prompt's n rollouts, one uid

# the rollouts: responses of different lengths (the scripted judge prefers the longer)
texts = [f"Answer {i}: " + " ".join(["word"] * (2 + 3 * (i % N))) for i in range(len(batch))]
prompts = [tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=True)
           for m in batch.non_tensor_batch["raw_prompt"]]
prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
responses = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
P, R = max(map(len, prompts)), max(map(len, responses))
prompt_t = torch.tensor([[tokenizer.pad_token_id] * (P - len(p)) + p for p in prompts])
response_t = torch.tensor([r + [tokenizer.pad_token_id] * (R - len(r)) for r in responses])
mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (R - len(r))
                     for p, r in zip(prompts, responses)])
data = DataProto.from_dict(tensors={"prompts": prompt_t, "responses": response_t, "attention_mask": mask,
                                    "input_ids": torch.cat([prompt_t, response_t], dim=1)},
                           non_tensors={k: batch.non_tensor_batch[k] for k in
                                        ("uid", "raw_prompt", "reward_model", "extra_info", "data_source")})

order = list(range(len(data)))
random.Random(0).shuffle(order)


async def stream():  # the agent loop: each finished rollout to the reward worker, concurrently
    return await asyncio.gather(*[worker.compute_score(data[i:i + 1]) for i in order])


outs = dict(zip(order, asyncio.run(stream())))
for i in range(len(data)):
    print(json.dumps({"uid": data.non_tensor_batch["uid"][i], "prompt": list(data.non_tensor_batch["raw_prompt"][i]),
                      "response": texts[i], "reward": outs[i]["reward_score"],
                      "extra": outs[i]["reward_extra_info"]}))
rm = manager_cls.assemble_rm_scores(data, [outs[i]["reward_score"] for i in range(len(data))])
last = mask[:, P:].sum(dim=1) - 1
print(json.dumps({"manager": manager_cls.__name__, "worker_manager": type(worker.reward_manager).__name__,
                  "rm_scores": [rm[i, last[i]].item() for i in range(len(data))]}))
