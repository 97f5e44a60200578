"""A quorum judge as verl's custom reward function (verl 0.9.1).

verl's reward loop resolves a reward manager (`reward.reward_manager`, verl/trainer/ppo/reward.py
`resolve_reward_manager_cls`) and hands it the function `reward.custom_reward_function` names, loaded with
`load_extern_object` (a `pkg://` module or a file path) and wrapped with the config's `reward_kwargs`. Two forms:

- Group judging (all_pairs, listwise; also score and vs_reference): the manager `QuorumRewardManager` of
  `quorum_clients.verl_manager` collects a prompt's rollouts (same `uid`) and calls
  ``compute_score_batch(data_sources=, solution_strs=, ground_truths=, extra_infos=, prompts=)`` once per group:

      reward.reward_manager.source=importlib
      reward.reward_manager.module.path=pkg://quorum_clients.verl_manager
      reward.reward_manager.name=QuorumRewardManager
      reward.num_workers=1
      reward.custom_reward_function.path=pkg://quorum_clients.verl
      reward.custom_reward_function.name=compute_score_batch
      +reward.custom_reward_function.reward_kwargs.url=http://HOST:8000

  The prompt is the row's `raw_prompt`, the chat messages verl's RLHFDataset builds from the data's `prompt`
  column (as verl's own examples write it, e.g. examples/data_preprocess/full_hh_rlhf.py).

- Per response (verl's `naive` manager): ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``,
  one response at a time, so it can only be graded (scheme score) or judged against `ground_truth` (vs_reference).
  The naive manager passes no prompt: it is read from `extra_info[prompt_key]` (default "question").

verl writes each reward into a tensor and has no "no reward" value, so a failed judgment never becomes a silent
number: without `failed_reward` it raises `RewardJudgmentError` (the step fails, naming the service's error); with
it (a number on the scheme's scale, or "neutral": its middle) the row gets that value and `quorum_failed: 1.0` in the
returned dict, which verl keeps as reward extra info.

Keyword arguments (`reward_kwargs`; all optional but url / QUORUM_REWARD_URL): those of
`quorum_clients.http.ClientConfig` (url, token_env, scheme, signal, caller, dimension, locale, timeout_s, retries,
backoff_s, concurrency), plus `prompt_key` and `failed_reward`. One client per distinct configuration is kept for
the process. The file can also be given by path (`custom_reward_function.path=/.../quorum_clients/verl.py`): it
imports only the installed `quorum_clients` package.

Light: httpx and the standard library.
"""

from __future__ import annotations

import threading

from quorum_clients.http import ClientConfig, GroupJob, RewardServiceClient, resolve_failed_reward
from quorum_clients.text import prompt_text, response_text

_CLIENTS: dict[tuple, RewardServiceClient] = {}
_LOCK = threading.Lock()
# what verl's managers add to a custom function's kwargs for their own reward-model routing
_VERL_KWARGS = ("reward_router_address", "reward_model_tokenizer")


class RewardJudgmentError(RuntimeError):
    """The service could not judge a response, and no `failed_reward` was configured."""


def _client(config: dict) -> RewardServiceClient:
    key = tuple(sorted(config.items()))
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = RewardServiceClient(ClientConfig(**config))
        return client


def _split(kwargs: dict, default_scheme: str) -> tuple[dict, str, float | None]:
    config = {k: v for k, v in kwargs.items() if k not in _VERL_KWARGS}
    prompt_key = config.pop("prompt_key", "question")
    failed = config.pop("failed_reward", None)
    config.setdefault("scheme", default_scheme)
    return config, prompt_key, resolve_failed_reward(failed, config["scheme"], config.get("signal", "own_grade"))


def _prompt(extra_info: dict | None, prompt_key: str) -> str:
    prompt = (extra_info or {}).get(prompt_key)
    if not isinstance(prompt, (str, list)) or not prompt:
        raise ValueError(f"extra_info[{prompt_key!r}] holds no prompt: verl's naive manager passes none to a reward "
                         "function, so the data must carry it (prompt_key names the extra_info field), or use "
                         "quorum_clients.verl_manager.QuorumRewardManager, which reads the rollout's raw_prompt")
    return prompt_text(prompt, f"extra_info[{prompt_key!r}]")


def _row(reward: float | None, error: str, failed_reward: float | None) -> dict:
    if reward is not None:
        return {"score": reward, "quorum_failed": 0.0}
    if failed_reward is None:
        raise RewardJudgmentError(f"the quorum reward service could not judge this response "
                                  f"({error or 'no judgment parsed'}); set reward_kwargs.failed_reward to train on "
                                  "with a fixed reward instead")
    return {"score": failed_reward, "quorum_failed": 1.0}


def compute_score(data_source=None, solution_str: str = "", ground_truth=None, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """One response (verl's per-sample form): {"score": reward, "quorum_failed": 0.0 | 1.0}."""
    config, prompt_key, failed_reward = _split(kwargs, "score")
    if config["scheme"] not in ("score", "vs_reference"):
        raise ValueError(f"scheme {config['scheme']!r}: one response at a time can be graded (score) or judged "
                         "against ground_truth (vs_reference); group schemes need QuorumRewardManager")
    reference = _reference(ground_truth) if config["scheme"] == "vs_reference" else None
    job = GroupJob(_prompt(extra_info, prompt_key), [response_text(solution_str, "solution_str")], reference=reference)
    result = _client(config).groups([job])[0]
    return _row(result.rewards[0], result.error, failed_reward)


def compute_score_batch(data_sources=None, solution_strs=(), ground_truths=None, extra_infos=None, prompts=None,
                        **kwargs) -> list[dict]:
    """Rows judged together (QuorumRewardManager's call, once per group): consecutive rows sharing a prompt form a
    group (vs_reference: each row against its own ground truth); one dict per row, in order. `prompts` (the rows'
    chat messages or text) wins over `extra_info[prompt_key]`."""
    config, prompt_key, failed_reward = _split(kwargs, "all_pairs")
    n = len(solution_strs)
    infos = list(extra_infos) if extra_infos is not None else [{}] * n
    truths = list(ground_truths) if ground_truths is not None else [None] * n
    if prompts is not None:
        texts = [prompt_text(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    else:
        texts = [_prompt(info, prompt_key) for info in infos]
    responses = [response_text(s, f"solution_strs[{i}]") for i, s in enumerate(solution_strs)]
    scheme = config["scheme"]
    jobs, start = [], 0
    for i in range(1, n + 1):
        if scheme == "vs_reference" or i == n or texts[i] != texts[start]:
            reference = _reference(truths[start]) if scheme == "vs_reference" else None
            jobs.append(GroupJob(texts[start], responses[start:i], reference=reference))
            start = i
    # no step: verl's reward loop does not pass it, and the service closes a caller's steps every
    # monitor.step_rollouts rollouts instead
    results = _client(config).groups(jobs)
    rows = []
    for result in results:
        rows += [_row(reward, result.error, failed_reward) for reward in result.rewards]
    return rows


def _reference(ground_truth) -> str:
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        raise ValueError(f"ground_truth {ground_truth!r}: scheme vs_reference judges against it, and it is empty")
    return ground_truth
