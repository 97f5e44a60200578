"""A quorum judge as the reward of TRL's `GRPOTrainer` (TRL 1.16's custom reward-function signature).

    from serve.clients.trl import QuorumReward
    reward = QuorumReward(url="http://127.0.0.1:8000", token_env="QUORUM_SERVE_TOKEN", caller="my-run")
    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=GRPOConfig(num_generations=4, ...), train_dataset=...)

TRL calls it once per generation batch as ``reward(prompts=, completions=, completion_ids=, trainer_state=,
log_extra=, log_metric=, **dataset_columns)`` (trl/trainer/grpo_trainer.py `_calculate_rewards`), rows ordered as
it generated them: each prompt's `num_generations` completions on consecutive rows. Consecutive rows with the same
prompt are sent as one group to the service (`/reward/group`, scheme all_pairs / vs_reference / listwise; scheme
score sends each completion to `/score`), one float per completion comes back.

Failed judgments follow the service: a completion none of whose judgments parsed (or whose group the service
refused or never answered) gets **None**, which TRL turns into NaN and leaves out of the group's baseline with a
zero advantage, never a 0 reward. Each call reports through `log_metric`: `quorum/failed_rows` (completions
without a reward), `quorum/failed_groups` (requests that failed whole), `quorum/failed_judgments` (the service's
count of unparsed verdicts) and `quorum/rows`; TRL averages them over a logging step.

Dataset columns the function reads, when present: `dimension` and `locale` (MENLO's rubric context, per row) and
`reference` (scheme vs_reference). Conversational prompts are sent as their messages' contents joined by blank
lines; conversational completions as their content. The service records each group under `caller` with TRL's
`global_step`, so its reward-hacking monitors (/stats `callers`) follow this run.
"""

from __future__ import annotations

from serve.clients.http import ClientConfig, GroupJob, RewardServiceClient


def as_text(value) -> str:
    """A TRL prompt or completion as text: a string as is, a conversation as its contents."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n\n".join(_content(m) for m in value if isinstance(m, dict))
    raise TypeError(f"expected a string or a list of messages, got {type(value).__name__}")


def _content(message: dict) -> str:
    content = message.get("content", "")
    if isinstance(content, list):  # content blocks: keep the text ones
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(content)


class QuorumReward:
    """Callable as TRL's reward function; `__name__` is what TRL logs it under (`rewards/<name>/mean`)."""

    def __init__(self, url: str = "", *, name: str = "quorum", client: RewardServiceClient | None = None,
                 **config):
        self.__name__ = name
        self.client = client or RewardServiceClient(ClientConfig(url=url, **config))

    def close(self) -> None:
        self.client.close()

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, trainer_state=None,
                 log_metric=None, log_extra=None, **columns) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        texts = [as_text(c) for c in completions]
        jobs, spans = [], []
        start = 0
        for i in range(1, len(prompts) + 1):
            if i == len(prompts) or prompts[i] != prompts[start]:
                jobs.append(GroupJob(as_text(prompts[start]), texts[start:i],
                                     reference=_column(columns, "reference", start),
                                     dimension=_column(columns, "dimension", start),
                                     locale=_column(columns, "locale", start)))
                spans.append((start, i))
                start = i
        step = getattr(trainer_state, "global_step", None)
        results = self.client.groups(jobs, step=step)
        rewards: list[float | None] = []
        for result in results:
            rewards += result.rewards
        if log_metric is not None:
            log_metric("quorum/rows", float(len(rewards)))
            log_metric("quorum/failed_rows", float(sum(r is None for r in rewards)))
            log_metric("quorum/failed_groups", float(sum(bool(r.error) for r in results)))
            log_metric("quorum/failed_judgments", float(sum(r.failed_judgments for r in results)))
        if log_extra is not None:
            errors = []
            for result, (a, b) in zip(results, spans):
                errors += [result.error] * (b - a)
            log_extra("quorum_error", errors)
        return rewards


def _column(columns: dict, name: str, row: int) -> str | None:
    values = columns.get(name)
    if values is None:
        return None
    value = values[row]
    return None if value is None else str(value)
