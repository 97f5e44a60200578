"""verl's reward-loop manager that judges each prompt's rollouts as one group (verl 0.9.1). Imports verl: load it in
verl's environment (verl resolves it itself from the config), not elsewhere.

verl 0.9.1 scores rollouts one at a time: the agent loop sends each finished rollout to a randomly chosen reward
loop worker (verl/experimental/agent_loop/agent_loop.py `_compute_score`), whose manager's `run_single` gets a
one-row DataProto (verl/experimental/reward_loop/reward_loop.py). A group scheme needs a prompt's `rollout.n`
responses together, so this manager holds each rollout until its group (rows with the same `uid`) is complete,
then calls the configured custom function once for the group (`quorum_clients.verl.compute_score_batch`, with the
config's reward_kwargs) and answers every member with its own reward. With more than one reward loop worker a
group's rollouts land on different workers and could never meet, so this manager requires `reward.num_workers=1`
(its requests are HTTP calls that wait on the service: one asyncio worker holds many in flight).

    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://quorum_clients.verl_manager
    reward.reward_manager.name=QuorumRewardManager
    reward.num_workers=1
    reward.custom_reward_function.path=pkg://quorum_clients.verl
    reward.custom_reward_function.name=compute_score_batch
    +reward.custom_reward_function.reward_kwargs.url=http://HOST:8000

The group size is `actor_rollout_ref.rollout.n`. Validation repeats each prompt `rollout.val_kwargs.n` times with
uids of its own, which no manager can tell from training rows: with validation on, the two must be equal (refused
at construction otherwise). A group still incomplete after `GROUP_WAIT_S` seconds (QUORUM_GROUP_WAIT_S) raises, naming its uid and how many rollouts arrived, rather than waiting forever or judging a fragment.
The prompt is the row's `raw_prompt` (the chat messages verl's RLHFDataset builds from the data's `prompt`
column), falling back to `extra_info[prompt_key]`. The class is also registered as "quorum" (source register) once
this module is imported.
"""

from __future__ import annotations

import asyncio
import os

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import registry
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

# how long a rollout waits for the rest of its group (QUORUM_GROUP_WAIT_S overrides): a group's rollouts finish
# within one generation step, so this bounds a lost sibling, not the judge
GROUP_WAIT_S = float(os.environ.get("QUORUM_GROUP_WAIT_S", "1800"))


class QuorumRewardManager(RewardManagerBase):
    """Collects a prompt's rollouts by uid and scores them as one group through the configured custom function."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        fn = config.reward.get("custom_reward_function") or {}
        if compute_score is None or not fn.get("path"):
            raise ValueError("QuorumRewardManager: reward.custom_reward_function must name the group function "
                             "(path=pkg://quorum_clients.verl, name=compute_score_batch)")
        rollout = config.actor_rollout_ref.rollout
        self.group_size = int(rollout.n)
        if self.group_size > 1 and int(config.reward.num_workers) != 1:
            raise ValueError(f"QuorumRewardManager: reward.num_workers={config.reward.num_workers}; a prompt's "
                             f"{self.group_size} rollouts go to randomly chosen reward workers and must meet in one: "
                             "set reward.num_workers=1")
        trainer = config.get("trainer") or {}
        validates = trainer.get("val_before_train", True) or (trainer.get("test_freq", -1) or -1) > 0
        val_n = int((rollout.get("val_kwargs") or {}).get("n", 1))
        if validates and val_n != self.group_size:
            raise ValueError(f"QuorumRewardManager: validation samples {val_n} rollout(s) per prompt and training "
                             f"{self.group_size}; groups are collected by size, so set "
                             f"actor_rollout_ref.rollout.val_kwargs.n={self.group_size} (or turn validation off: "
                             "trainer.val_before_train=False trainer.test_freq=-1)")
        self.prompt_key = dict(fn.get("reward_kwargs") or {}).get("prompt_key", "question")
        self._pending: dict[str, list] = {}

    async def run_single(self, data: DataProto) -> dict:
        item = data[-1:][0]  # multi-sequence outputs: the last sequence is the response judged, as naive's
        response_ids = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
        response = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:valid], skip_special_tokens=True))
        extra_info = dict(item.non_tensor_batch.get("extra_info") or {})
        raw_prompt = item.non_tensor_batch.get("raw_prompt")
        row = {"data_source": item.non_tensor_batch.get("data_source"), "solution_str": response,
               "ground_truth": (item.non_tensor_batch.get("reward_model") or {}).get("ground_truth"),
               "extra_info": extra_info,
               "prompt": list(raw_prompt) if raw_prompt is not None else extra_info.get(self.prompt_key)}
        uid = item.non_tensor_batch.get("uid")
        future = asyncio.get_running_loop().create_future()
        if uid is None or self.group_size == 1:
            members = [(row, future)]
        else:
            members = self._pending.setdefault(str(uid), [])
            members.append((row, future))
            if len(members) < self.group_size:
                try:
                    result = await asyncio.wait_for(asyncio.shield(future), GROUP_WAIT_S)
                except TimeoutError:
                    arrived = len(self._pending.pop(str(uid), members))
                    raise RuntimeError(f"QuorumRewardManager: the group of uid {uid} got {arrived} of "
                                       f"{self.group_size} rollouts within {GROUP_WAIT_S:g} s (QUORUM_GROUP_WAIT_S); "
                                       "are the rollouts spread over several reward workers?") from None
                return _answer(result)
            del self._pending[str(uid)]
        await self._judge(members)
        return _answer(await future)

    async def _judge(self, members: list) -> None:
        rows = [row for row, _ in members]
        try:
            results = await asyncio.get_running_loop().run_in_executor(None, lambda: self.compute_score(
                data_sources=[r["data_source"] for r in rows], solution_strs=[r["solution_str"] for r in rows],
                ground_truths=[r["ground_truth"] for r in rows], extra_infos=[r["extra_info"] for r in rows],
                prompts=[r["prompt"] for r in rows]))
            if len(results) != len(rows):
                raise RuntimeError(f"the group function returned {len(results)} results for {len(rows)} rollouts")
        except Exception as exc:  # noqa: BLE001 - every member of the group fails with the group's error
            for _, future in members:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(members, results):
            if not future.done():
                future.set_result(result)


def _answer(result) -> dict:
    if isinstance(result, dict):
        return {"reward_score": result["score"], "reward_extra_info": dict(result)}
    return {"reward_score": result, "reward_extra_info": {"acc": result}}


if "quorum" not in registry.REWARD_MANAGER:  # a file-path load runs this module again: register the first class
    registry.register("quorum")(QuorumRewardManager)
