"""TRL's GRPOTrainer scoring through quorum_clients.trl, run in the TRL environment (clients/build_trainer_envs.sh)
by tests/test_trainer_clients_e2e.py, on CPU with several processes:

    accelerate launch --cpu --num_processes 2 tests/trainer_envs/trl_grpo.py URL MODEL_DIR OUT_DIR [max_steps]

Three prompts, two generations each, three rows per process: the middle prompt's group straddles the two processes.
Each process writes OUT_DIR/rows-<rank>.jsonl: every row it was handed, with the reward the function returned for it.
Imports TRL and quorum_clients only (the environment holds no quorum).
"""

import json
import sys
from pathlib import Path

from datasets import Dataset
from quorum_clients.trl import QuorumReward
from trl import GRPOConfig, GRPOTrainer

url, model, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
max_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
reward = QuorumReward(url, caller="trl-2proc", scheme="all_pairs", signal="own_grade", dimension="fluency",
                      locale="en_US", retries=1, backoff_s=0.1, failure_window=2, num_generations=2)


class Recorded:
    """The reward function as TRL calls it, recording each process's rows and what came back for them."""

    __name__ = "quorum"

    def __call__(self, prompts, completions, **kwargs):
        rewards = reward(prompts=prompts, completions=completions, **kwargs)
        rank = trainer.accelerator.process_index
        with open(out / f"rows-{rank}.jsonl", "a") as f:
            f.writelines(json.dumps({"step": kwargs["trainer_state"].global_step, "rank": rank, "row": i,
                                    "prompt": p, "completion": c, "reward": r}) + "\n" for i, (p, c, r) in enumerate(zip(prompts, completions, rewards)))
        return rewards


data = Dataset.from_list([{"prompt": f"Write one sentence about {topic}."}
                          for topic in ("a river", "a lantern", "a harbor", "a forest", "a bridge", "a mill")])
args = GRPOConfig(output_dir=str(out / "trl"), max_steps=max_steps, per_device_train_batch_size=3, num_generations=2,
                  max_completion_length=8, learning_rate=1e-6, beta=0.0, logging_steps=1, report_to=[],
                  save_strategy="no", use_cpu=True, bf16=False, seed=0, temperature=1.0)
trainer = GRPOTrainer(model=model, reward_funcs=Recorded(), args=args, train_dataset=data)
trainer.train()
if trainer.accelerator.is_main_process:
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
