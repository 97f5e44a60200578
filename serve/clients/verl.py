"""A quorum judge as verl's custom reward function (verl 0.9.1):

    reward.custom_reward_function.path=pkg://serve.clients.verl
    reward.custom_reward_function.name=compute_score            # per response (verl's `naive` reward manager)
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.scheme=score   # or vs_reference: judged against ground_truth

verl's reward manager calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` with the
config's `reward_kwargs` merged in (verl/trainer/ppo/reward.py `_call_with_kwargs`;
verl/experimental/reward_loop/reward_manager/naive.py `run_single`), one response at a time, from executor
threads. A lone response has no siblings to compare with, so this form grades it (`/score`: scheme score) or judges
it against `ground_truth` (`/reward/group` scheme vs_reference). verl passes no prompt: it is read from
`extra_info[prompt_key]` (default "question", as verl's data preprocessing examples write it).

`compute_score_batch(data_sources=, solution_strs=, ground_truths=, extra_infos=)` is the batched form (verl's
`batch` reward manager, verl/workers/reward_manager/batch.py `verify`): rows sharing a prompt are judged as one
group (all_pairs, listwise), and each call counts as one step for the service's monitors.

verl has no "no reward" value (the manager writes the float into a tensor), so a failed judgment is never given a
silent number: without `failed_reward` it raises `RewardJudgmentError` (the step fails, naming the error); with it,
the row gets that value and `quorum_failed: 1.0` in the returned dict, which verl keeps as reward extra info.

Keyword arguments (all optional but url / QUORUM_REWARD_URL): those of `serve.clients.http.ClientConfig` (url,
token_env, scheme, signal, caller, dimension, locale, timeout_s, retries, concurrency), plus `prompt_key` and
`failed_reward`. One client per distinct configuration is kept for the process.
"""

from __future__ import annotations

import itertools
import threading

from serve.clients.http import ClientConfig, GroupJob, RewardServiceClient

_CLIENTS: dict[tuple, RewardServiceClient] = {}
_LOCK = threading.Lock()
_BATCH_STEPS = itertools.count()


class RewardJudgmentError(RuntimeError):
    """The service could not judge a response, and no `failed_reward` was configured."""


def _client(config: dict) -> RewardServiceClient:
    key = tuple(sorted(config.items()))
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = RewardServiceClient(ClientConfig(**config))
        return client


def _split(kwargs: dict) -> tuple[dict, str, float | None]:
    kwargs = dict(kwargs)
    prompt_key = kwargs.pop("prompt_key", "question")
    failed_reward = kwargs.pop("failed_reward", None)
    for ignored in ("reward_router_address", "reward_model_tokenizer"):  # verl's own reward-model routing
        kwargs.pop(ignored, None)
    return kwargs, prompt_key, None if failed_reward is None else float(failed_reward)


def _prompt(extra_info: dict | None, prompt_key: str) -> str:
    prompt = (extra_info or {}).get(prompt_key)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"extra_info[{prompt_key!r}] holds no prompt: verl passes none to a reward function, so the "
                         "data must carry it (prompt_key names the extra_info field)")
    return prompt


def _row(reward: float | None, error: str, failed_reward: float | None) -> dict:
    if reward is not None:
        return {"score": reward, "quorum_failed": 0.0}
    if failed_reward is None:
        raise RewardJudgmentError(f"the quorum reward service could not judge this response ({error or 'unparsed'});"
                                  " set reward_kwargs.failed_reward to train on with a fixed reward instead")
    return {"score": failed_reward, "quorum_failed": 1.0}


def compute_score(data_source=None, solution_str: str = "", ground_truth=None, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """One response (verl's per-sample form): {"score": reward, "quorum_failed": 0.0 | 1.0}."""
    config, prompt_key, failed_reward = _split(kwargs)
    config.setdefault("scheme", "score")
    if config["scheme"] not in ("score", "vs_reference"):
        raise ValueError(f"scheme {config['scheme']!r}: one response at a time can be graded (score) or judged "
                         "against ground_truth (vs_reference); group schemes need compute_score_batch")
    reference = str(ground_truth) if config["scheme"] == "vs_reference" else None
    job = GroupJob(_prompt(extra_info, prompt_key), [solution_str], reference=reference)
    result = _client(config).groups([job])[0]
    return _row(result.rewards[0], result.error, failed_reward)


def compute_score_batch(data_sources=None, solution_strs=(), ground_truths=None, extra_infos=None,
                        **kwargs) -> list[dict]:
    """A batch (verl's batched form): consecutive rows sharing a prompt form a group; one dict per row."""
    config, prompt_key, failed_reward = _split(kwargs)
    n = len(solution_strs)
    infos = list(extra_infos) if extra_infos is not None else [{}] * n
    truths = list(ground_truths) if ground_truths is not None else [None] * n
    prompts = [_prompt(info, prompt_key) for info in infos]
    scheme = config.setdefault("scheme", "all_pairs")
    jobs, start = [], 0
    for i in range(1, n + 1):
        if scheme == "vs_reference" or i == n or prompts[i] != prompts[start]:
            reference = str(truths[start]) if scheme == "vs_reference" else None
            jobs.append(GroupJob(prompts[start], list(solution_strs[start:i]), reference=reference))
            start = i
    results = _client(config).groups(jobs, step=next(_BATCH_STEPS))
    rows = []
    for result in results:
        rows += [_row(reward, result.error, failed_reward) for reward in result.rewards]
    return rows
