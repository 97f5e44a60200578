"""A quorum judge as the reward of TRL's `GRPOTrainer` (TRL 1.16's custom reward-function signature).

    from quorum_clients.trl import QuorumReward
    reward = QuorumReward(url="http://127.0.0.1:8000", token_env="QUORUM_SERVE_TOKEN", caller="my-run")
    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=GRPOConfig(num_generations=4, ...), train_dataset=...)

TRL calls it once per generation batch on every process with that process's rows, ``reward(prompts=,
completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, **dataset_columns)``
(trl/trainer/grpo_trainer.py `_calculate_rewards`), and gathers the rewards afterwards. Its `RepeatSampler` puts a
prompt's `num_generations` completions on consecutive rows of the global batch, process 0's rows first, so one
prompt's group can straddle two processes. This function therefore gathers the step's rows from every process
(accelerate's `gather_object`), cuts the global batch into groups (consecutive rows with the same prompt, or
exactly `num_generations` rows when given), has process 0 send each group to the service once (`/reward/group`;
scheme score: each completion to `/score`), and scatters the rewards back (`broadcast_object_list`): every scheme
sees whole groups, and each process returns the rewards of its own rows.

Failures:
- A completion without a reward gets `failed_reward`: None by default (TRL turns it into NaN, leaves it out of the
  group's baseline and gives it a zero advantage), or a number / "neutral" (the scale's middle). TRL sums several
  reward functions with `nansum`, which would count a NaN as 0 (below the 1-5 grade scale): with other reward
  functions beside this one and TRL's default `multi_objective_aggregation="sum_then_normalize"`, the first call
  refuses to run unless `failed_reward` is set.
- Fail fast: over the last `failure_window` calls, more than `max_failed_fraction` of the completions without a
  reward raises `RewardServiceFailure` naming the service's error (a judge that is down, a refused request, a
  misconfiguration): training stops instead of going on with zero advantages. `max_failed_fraction=None` disables.
- 401/403 raise `RewardServiceAuthError` at once (a wrong token fails every request).
Every call logs `quorum/rows`, `quorum/failed_rows`, `quorum/failed_groups` (requests that failed whole) and
`quorum/failed_judgments` (the service's count of unparsed verdicts) for the whole step through `log_metric`, and
the error of each row through `log_extra` (column `quorum_error`).

Dataset columns read when present: `dimension`, `locale` (MENLO's rubric context) and `reference` (scheme
vs_reference). Prompts and completions are normalised first (`quorum_clients.text`: chat markup parsed, roles kept,
a message without text refused). The service records each group under `caller` with TRL's `global_step`.

Light: httpx and the standard library (accelerate, present wherever TRL is, only when several processes run).
"""

from __future__ import annotations

import collections
import math
import sys

from quorum_clients.http import (
    ClientConfig,
    GroupJob,
    RewardServiceAuthError,
    RewardServiceClient,
    resolve_failed_reward,
)
from quorum_clients.text import prompt_text, response_text

COLUMNS = ("reference", "dimension", "locale")


class RewardServiceFailure(RuntimeError):
    """Too many completions went without a reward over the fail-fast window; the message names the service's error."""


class QuorumReward:
    """Callable as TRL's reward function; `__name__` is what TRL logs it under (`rewards/<name>/mean`)."""

    def __init__(self, url: str = "", *, name: str = "quorum", client: RewardServiceClient | None = None,
                 failed_reward: float | str | None = None, max_failed_fraction: float | None = 0.5,
                 failure_window: int = 3, num_generations: int | None = None, **config):
        self.__name__ = name
        self.client = client or RewardServiceClient(ClientConfig(url=url, **config))
        cfg = self.client.cfg
        self.failed_reward = resolve_failed_reward(failed_reward, cfg.scheme, cfg.signal)
        if max_failed_fraction is not None and not 0 <= max_failed_fraction < 1:
            raise ValueError(f"max_failed_fraction: {max_failed_fraction} is not in [0, 1) (None disables it)")
        if failure_window < 1:
            raise ValueError(f"failure_window: {failure_window} calls; at least 1")
        if num_generations is not None and num_generations < 1:
            raise ValueError(f"num_generations: {num_generations}; at least 1")
        self.max_failed_fraction = max_failed_fraction
        self.num_generations = num_generations
        self._window: collections.deque = collections.deque(maxlen=failure_window)
        self._checked_trainer = False

    def close(self) -> None:
        self.client.close()

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, trainer_state=None,
                 log_metric=None, log_extra=None, **columns) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        if not self._checked_trainer:
            self._check_trainer(getattr(log_metric, "__self__", None))
        step = getattr(trainer_state, "global_step", None)
        local = (list(prompts), list(completions), {c: list(columns[c]) for c in COLUMNS if columns.get(c) is not None})
        world = _distributed()
        if world is None:
            outcome = self._judge([local], step)
            rank, sizes = 0, [len(prompts)]
        else:
            gather_object, broadcast_object_list, rank = world
            parts = gather_object([local])  # one entry per process, in process order
            outcome = self._judge(parts, step) if rank == 0 else None
            box = [outcome]
            broadcast_object_list(box, from_process=0)
            outcome = box[0]
            sizes = [len(part[0]) for part in parts]
        if outcome["raise"] is not None:  # raised on every process alike, so none waits on the others
            kind, message = outcome["raise"]
            raise {"auth": RewardServiceAuthError, "value": ValueError}.get(kind, RewardServiceFailure)(message)
        start = sum(sizes[:rank])
        mine = slice(start, start + sizes[rank])
        rewards, errors = outcome["rewards"][mine], outcome["errors"][mine]
        if log_metric is not None:
            for key, value in outcome["metrics"].items():
                log_metric(key, value)
        if log_extra is not None:
            log_extra("quorum_error", errors)
        self._fail_fast(outcome)
        if self.failed_reward is not None:
            rewards = [self.failed_reward if r is None else r for r in rewards]
        return rewards

    # -- process 0: the whole step --------------------------------------------------------------------------------

    def _judge(self, parts: list, step: int | None) -> dict:
        """Every process's rows judged as whole groups: rewards and errors in global row order, or what to raise."""
        prompts, completions, cols = [], [], {c: [] for c in COLUMNS}
        for part_prompts, part_completions, part_cols in parts:
            prompts += part_prompts
            completions += part_completions
            for c in COLUMNS:
                cols[c] += part_cols.get(c, [None] * len(part_prompts))
        try:
            spans = self._groups(prompts)
            jobs = [GroupJob(prompt_text(prompts[a], f"prompts[{a}]"),
                             [response_text(completions[i], f"completions[{i}]") for i in range(a, b)],
                             reference=_value(cols["reference"][a]), dimension=_value(cols["dimension"][a]),
                             locale=_value(cols["locale"][a])) for a, b in spans]
            results = self.client.groups(jobs, step=step)
        except RewardServiceAuthError as exc:
            return {"raise": ("auth", str(exc))}
        except ValueError as exc:
            return {"raise": ("value", f"quorum reward: {exc}")}
        rewards, errors = [], []
        for result, (a, b) in zip(results, spans):
            rewards += result.rewards
            row_error = result.error or ("no judgment of this completion parsed" if None in result.rewards else "")
            errors += [row_error if r is None else "" for r in result.rewards]
        metrics = {"quorum/rows": float(len(rewards)), "quorum/failed_rows": float(sum(r is None for r in rewards)),
                   "quorum/failed_groups": float(sum(bool(r.error) for r in results)),
                   "quorum/failed_judgments": float(sum(r.failed_judgments for r in results))}
        return {"raise": None, "rewards": rewards, "errors": errors, "metrics": metrics,
                "groups": [b - a for a, b in spans]}

    def _groups(self, prompts: list) -> list[tuple[int, int]]:
        """[start, end) row spans of the groups: `num_generations` rows each when given (their prompts must agree),
        else runs of consecutive rows with the same prompt."""
        n = len(prompts)
        if self.num_generations is not None:
            g = self.num_generations
            if n % g:
                raise ValueError(f"{n} rows are not whole groups of num_generations={g}")
            spans = [(a, a + g) for a in range(0, n, g)]
            for a, b in spans:
                if any(prompts[i] != prompts[a] for i in range(a, b)):
                    raise ValueError(f"rows {a}..{b - 1} should be one prompt's {g} completions but their prompts "
                                     "differ: num_generations does not match the trainer's")
            return spans
        spans, start = [], 0
        for i in range(1, n + 1):
            if i == n or prompts[i] != prompts[start]:
                spans.append((start, i))
                start = i
        return spans

    # -- every process alike --------------------------------------------------------------------------------------

    def _check_trainer(self, trainer) -> None:
        self._checked_trainer = True
        funcs = getattr(trainer, "reward_funcs", None)
        if not funcs or len(funcs) < 2 or self.failed_reward is not None:
            return
        if getattr(trainer, "multi_objective_aggregation", "sum_then_normalize") == "sum_then_normalize":
            raise ValueError(
                f"QuorumReward beside {len(funcs) - 1} other reward function(s): TRL sums them with nansum, which "
                "counts a completion the judge could not grade (None -> NaN) as a quorum reward of 0, below the "
                "judge's scale. Set failed_reward (a value on the scale, or 'neutral'), or "
                "multi_objective_aggregation='normalize_then_sum' (NaN is then the group's mean), or use it alone.")

    def _fail_fast(self, outcome: dict) -> None:
        metrics = outcome["metrics"]
        first_error = next((e for e in outcome["errors"] if e), "")
        self._window.append((metrics["quorum/failed_rows"], metrics["quorum/rows"], first_error))
        if self.max_failed_fraction is None or len(self._window) < self._window.maxlen:
            return
        failed = sum(f for f, _, _ in self._window)
        rows = sum(r for _, r, _ in self._window)
        if rows and failed / rows > self.max_failed_fraction:
            errors = list(dict.fromkeys(e for _, _, e in self._window if e))
            raise RewardServiceFailure(
                f"quorum reward: {failed:g} of {rows:g} completions got no reward over the last {len(self._window)} "
                f"calls (max_failed_fraction {self.max_failed_fraction}); the reward service said: "
                + ("; ".join(errors[:3]) or "nothing (unparsed judgments)"))


def _value(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _distributed():
    """(gather_object, broadcast_object_list, rank) when several processes train (torch.distributed initialised
    by accelerate), else None. Looked up in sys.modules: a process that never imported torch trains alone."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if torch.distributed.get_world_size() < 2:
        return None
    from accelerate.utils import broadcast_object_list, gather_object

    return gather_object, broadcast_object_list, torch.distributed.get_rank()
