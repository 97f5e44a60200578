"""The calling conventions of the trainers quorum's reward service serves, replicated where their own code needs a
GPU stack that does not install here (tests/test_trainer_rewards.py): what OpenRLHF 0.11.2 posts and reads, how verl
0.9.1 loads and calls a custom reward function, and the DataProto its rollout leaves. Each docstring names the source
file it follows."""

from __future__ import annotations

import asyncio
import functools
import importlib
from types import SimpleNamespace


def openrlhf_query(tokenizer, prompt: str, response: str) -> str:
    """What `SingleTurnAgentExecutor.execute` posts as `query` (openrlhf/utils/agent.py): the prompt tokenized with
    add_special_tokens=False, the engine's action tokens (ending in EOS) appended, decoded keeping special tokens."""
    prompt_ids = tokenizer(text=prompt, add_special_tokens=False)["input_ids"]
    action_ids = tokenizer(text=response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return tokenizer.decode(prompt_ids + action_ids, skip_special_tokens=False)


async def openrlhf_post(url: str, payload: dict) -> dict:
    """`_fetch_rewards_via_http`'s `_post_request` (openrlhf/utils/agent.py): aiohttp, json=payload, no headers,
    raise_for_status, up to 5 tries a second apart, then RuntimeError."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=180)
    for _ in range(5):
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:  # noqa: SIM117 - OpenRLHF's own nesting
                async with session.post(url, json=payload) as response:
                    response.raise_for_status()
                    return await response.json()
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1)
    raise RuntimeError("Request error for 5 times, returning None. Please check the API server.")


def openrlhf_reward(url: str, query: str, prompt: str, label) -> dict:
    """One rollout's reward as OpenRLHF reads it: execute() posts one query, takes `rewards_info_list[0]`, reward
    = its `rewards`, scores = `scores` (else `rewards`); samples_generator.py makes `torch.tensor([reward_val])`."""
    import torch

    rewards_info = asyncio.run(openrlhf_post(url, {"query": [query], "prompts": [prompt], "labels": [label]}))
    score_value = rewards_info.get("scores")
    if score_value is None:
        score_value = rewards_info.get("rewards")
    reward = torch.tensor([rewards_info.get("rewards")])
    extra = {k: torch.tensor([v]) for k, v in (rewards_info.get("extra_logs") or {}).items()}
    return {"reward": reward, "score": torch.tensor([score_value]), "extra": extra}


class FakeVLLMEngine:
    """The edge OpenRLHF's executor talks to (its vLLM engine actor on a GPU): `generate` answers fixed tokens."""

    def __init__(self, token_ids: list[int]):
        self.token_ids = token_ids

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        output = SimpleNamespace(token_ids=list(self.token_ids), text="", finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


def verl_custom_reward_fn(path: str, name: str, reward_kwargs: dict):
    """verl/trainer/ppo/reward.py `get_custom_reward_fn`: load_extern_object (pkg:// -> import_module), then
    partial(_call_with_kwargs, raw_fn, reward_kwargs), the config's kwargs taking precedence."""
    module = importlib.import_module(path.removeprefix("pkg://").replace("/", "."))
    raw_fn = getattr(module, name)

    def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    return functools.partial(_call_with_kwargs, raw_fn, dict(reward_kwargs))


def verl_run_single(compute_score, data_source: str, response_str: str, ground_truth, extra_info: dict) -> dict:
    """verl/experimental/reward_loop/reward_manager/naive.py `run_single`: extra_info gains num_turns and
    rollout_reward_scores, a sync compute_score runs in the loop's executor; a dict result's `score` is the reward."""

    async def run():
        info = dict(extra_info, num_turns=None, rollout_reward_scores={})
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(None, lambda: compute_score(
            data_source=data_source, solution_str=response_str, ground_truth=ground_truth, extra_info=info))
        if isinstance(result, dict):
            return {"reward_score": result["score"], "reward_extra_info": dict(result)}
        return {"reward_score": result, "reward_extra_info": {"acc": result}}

    return asyncio.run(run())


def verl_batch(tokenizer, prompts: list[str], responses: list[str], ground_truths: list, extra_infos: list[dict]):
    """A verl DataProto as its rollout leaves it: left-padded prompts, right-padded responses, one attention mask
    over both, and the dataset's non-tensor fields (data_source, reward_model.ground_truth, extra_info)."""
    import numpy as np
    import torch
    from verl import DataProto

    def pad(rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id or 0)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, span], mask[i, span] = torch.tensor(r), 1
        return ids, mask

    p_ids, p_mask = pad([tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts], left=True)
    r_ids, r_mask = pad([tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                         for r in responses], left=False)
    return DataProto.from_dict(
        tensors={"prompts": p_ids, "responses": r_ids, "attention_mask": torch.cat([p_mask, r_mask], dim=1),
                 "input_ids": torch.cat([p_ids, r_ids], dim=1)},
        non_tensors={"data_source": np.array(["menlo"] * len(prompts), dtype=object),
                     "reward_model": np.array([{"ground_truth": g} for g in ground_truths], dtype=object),
                     "extra_info": np.array([dict(e) for e in extra_infos], dtype=object)})
