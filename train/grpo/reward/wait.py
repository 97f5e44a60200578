"""How long one rank of a GRPO worker group can wait on the reward service between two collectives, per phase.

While a rank waits for rewards the others may already sit in the next collective; past `grpo.collective_timeout_s`
(Ray Train's `TorchConfig.timeout_s`) that collective fails the whole worker group, which restarts from its last
checkpoint. One request waits at most `RewardServiceConfig.worst_wait_s` (w); requests that share a client pool of
`reward.concurrency` (c) threads are served first in, first out, so n requests queued at once finish within
ceil(n / c) x w. Three phases of `train.grpo.loop` wait on the service (policy GRPO, the only job whose workers call
one; judge GRPO's reward is local):

- the training step: a worker's `prompts_per_worker` groups, ceil(ppw / c) x w (`step_wait`);
- a validation pass (`train.grpo.validate.validate`): a worker's shard is ceil(val prompts / workers) entries, the
  padding (row 0 again) judged too, sent `prompts_per_worker` at a time, one request each (vs_baseline: one answer
  against the base model's, both orders; reward: the prompt's G rollouts). With val_metric vs_baseline the ranks
  meet in `_any_rank` before every chunk, and with ZeRO-3 hf rollouts every generate is collective, so one chunk's
  rewards are waited for between two collectives; else (vLLM, or ZeRO < 3) nothing separates the chunks until the
  pass's reduction, and their rounds add up. With `rollout.max_staleness: 1` the next step's groups, sent before
  the pass, are still ahead of the first chunk in the same pool (`train.grpo.staleness`);
- the probe (`train.grpo.monitoring.ProbeSet`): rank 0 alone sends one request per probe pair, all at once into a
  pool of its own (c threads), the run's timeout, retries and back-offs, after the monitored step's reduction.
  Where a collective comes next (a validation, a checkpoint, the last step) the others wait in it, so it is checked
  whenever the probe runs; before a validation whose first rewards no collective precedes (val_metric reward, ZeRO
  < 3) rank 0 waits for those too without meeting the others.

A plain `ray.train.report` is no such collective: Ray Train V2's report barrier has no timeout
(`RAY_TRAIN_COLLECTIVE_TIMEOUT_S` unset). Pure: no ray, no torch.
"""

from __future__ import annotations

import dataclasses
import functools

from core.config import dotted, fail
from train.grpo.reward.client import RewardServiceConfig


def rounds(requests: int, concurrency: int) -> int:
    """Rounds of `concurrency` requests that `requests` queued at once take.

    >>> rounds(13, 8), rounds(8, 8), rounds(0, 8)
    (2, 1, 0)
    """
    return -(-requests // concurrency)


def validation_chunks(val_prompts: int, workers: int, prompts_per_worker: int) -> list[int]:
    """Requests one worker sends per validation pass, chunk by chunk (`train.grpo.validate.validation_shard`): its
    shard of ceil(val_prompts / workers) entries, padding included, `prompts_per_worker` at a time.

    >>> validation_chunks(100, 8, 4)  # 13 entries each
    [4, 4, 4, 1]
    >>> validation_chunks(4, 8, 4)    # one each, 4 of them padding
    [1]
    """
    shard = rounds(val_prompts, workers)
    batch = max(prompts_per_worker, 1)
    return [min(batch, shard - start) for start in range(0, shard, batch)]


def validation_rounds(val_prompts: int, workers: int, prompts_per_worker: int, concurrency: int, *,
                      collective_per_chunk: bool, queued: int = 0) -> int:
    """Rounds of requests a worker waits for between two collectives in a validation pass (module docstring):
    `queued` requests already ahead of the first chunk, then one chunk (`collective_per_chunk`) or all of them.

    100 prompts over 8 workers, 4 per chunk, 8 in flight: chunks 4, 4, 4, 1, one round each; 4 groups of the next
    step ahead of the first chunk make it 8 requests, still one round.

    >>> validation_rounds(100, 8, 4, 8, collective_per_chunk=True), validation_rounds(100, 8, 4, 8,
    ...                                                                           collective_per_chunk=False)
    (1, 4)
    >>> validation_rounds(100, 8, 4, 8, collective_per_chunk=False, queued=4)
    4
    >>> validation_rounds(100, 8, 4, 4, collective_per_chunk=True, queued=4)  # 4 + 4 requests, 4 in flight
    2
    """
    chunks = validation_chunks(val_prompts, workers, prompts_per_worker)
    if not chunks:
        return 0
    first = rounds(queued + chunks[0], concurrency)
    return first if collective_per_chunk else first + sum(rounds(c, concurrency) for c in chunks[1:])


@dataclasses.dataclass(frozen=True)
class PhaseWait:
    """The requests one rank waits for between two collectives in one phase, and how they were counted."""

    phase: str  # "validation pass", "probe"
    who: str  # "a worker", "rank 0"
    rounds: int  # rounds of reward.concurrency requests
    counted: str  # how the rounds come about, with the keys that set them
    lead_key: str  # the key the refusal names first
    remedy: str  # what shortens this phase's wait, by key


def one_request(reward: RewardServiceConfig, reward_key: str = "reward") -> str:
    """One request's worst wait, in words.

    >>> one_request(RewardServiceConfig(timeout_s=600, retries=3, backoff_s=5, backoff_max_s=60))
    '4 attempts x reward.timeout_s 600 s + back-offs of up to 38.5 s'
    """
    attempts = (reward.retries + 1) * reward.timeout_s
    return (f"{reward.retries + 1} attempts x {dotted(reward_key, 'timeout_s')} {reward.timeout_s:g} s + back-offs "
            f"of up to {round(reward.worst_wait_s() - attempts, 6):g} s")


def most_rounds(reward: RewardServiceConfig, collective_timeout_s: float) -> int:
    """The most rounds whose worst wait stays below the collective timeout.

    >>> most_rounds(RewardServiceConfig(timeout_s=600, retries=3, backoff_s=5, backoff_max_s=60), 3000)
    1
    >>> most_rounds(RewardServiceConfig(timeout_s=120, retries=3), 1800)  # 483.3 s a round
    3
    """
    one = reward.worst_wait_s()
    fit = int(collective_timeout_s // one)
    return fit - 1 if round(fit * one, 6) >= collective_timeout_s else fit  # as check_phase_wait compares


def check_phase_wait(wait: PhaseWait, reward: RewardServiceConfig, collective_timeout_s: float,
                     reward_key: str = "reward", timeout_key: str = "grpo.collective_timeout_s") -> None:
    """Refuse (ConfigError, exit 2) a phase whose worst wait is not below `collective_timeout_s`.

    >>> reward = RewardServiceConfig(timeout_s=600, retries=3, backoff_s=5, backoff_max_s=60)
    >>> check_phase_wait(PhaseWait("probe", "rank 0", 1, "8 pairs", "monitor.probe_limit", "..."), reward, 3000)
    >>> check_phase_wait(PhaseWait("probe", "rank 0", 4, "32 pairs", "monitor.probe_limit", "Lower it"), reward,
    ...                  3000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    core.errors.ConfigError: monitor.probe_limit: in the probe, rank 0 can wait 9754 s on the reward service (32 pairs: 4 rounds of up to 8 requests (reward.concurrency) x 2438.5 s, ...
    """
    one = reward.worst_wait_s()
    worst = round(wait.rounds * one, 6)
    if worst < collective_timeout_s:
        return
    fail(wait.lead_key,
         f"in the {wait.phase}, {wait.who} can wait {worst:g} s on the reward service ({wait.counted}: {wait.rounds} "
         f"round{'s' if wait.rounds != 1 else ''} of up to {reward.concurrency} requests "
         f"({dotted(reward_key, 'concurrency')}) x {one:g} s, each {one_request(reward, reward_key)}), not less "
         f"than {timeout_key} ({collective_timeout_s:g} s), the longest the other workers wait in a collective: a "
         f"slow judge would then fail the whole worker group (a restart from the last checkpoint). {wait.remedy}, "
         f"lower {dotted(reward_key, 'timeout_s')} or {dotted(reward_key, 'retries')}, or raise {timeout_key} above "
         f"{worst:g}")


def step_wait(grpo, reward: RewardServiceConfig, grpo_key: str = "grpo",
              reward_key: str = "reward") -> PhaseWait:
    """A training step's longest wait: a worker scores its `prompts_per_worker` groups `reward.concurrency` at a
    time, while the others may already sit in the step's next collective (DeepSpeed's gradient reduction, the loop's
    any-worker checks).

    >>> from train.config import GRPOConfig
    >>> step_wait(GRPOConfig(num_workers=8, prompts_per_step=32), RewardServiceConfig(concurrency=3)).rounds
    2
    """
    return PhaseWait("training step", "a worker", rounds(grpo.prompts_per_worker, reward.concurrency),
                     f"its {grpo.prompts_per_worker} groups ({dotted(grpo_key, 'prompts_per_worker')})",
                     dotted(reward_key, "timeout_s"), f"Raise {dotted(reward_key, 'concurrency')}")


def validation_collectives(grpo) -> tuple[bool, bool]:
    """(the ranks meet between a validation pass's chunks, they meet before its first rewards) for a GRPOConfig:
    vs_baseline's `_any_rank` before every chunk; ZeRO-3 hf rollouts' collective generate; a ZeRO-3 vLLM engine's
    adapter sync (`VLLMRollout.sync` gathers) at the start of the pass only.

    >>> from train.config import GRPOConfig
    >>> validation_collectives(GRPOConfig(val_metric="vs_baseline")), validation_collectives(GRPOConfig())
    ((True, True), (False, False))
    >>> vllm = GRPOConfig.from_dict({"rollout": {"kind": "vllm"}, "deepspeed": {"zero_stage": 3}})
    >>> validation_collectives(vllm)  # the adapter sync only
    (False, True)
    """
    per_chunk = grpo.val_metric == "vs_baseline" or (grpo.rollout.kind == "hf" and grpo.deepspeed.zero_stage == 3)
    return per_chunk, per_chunk or grpo.deepspeed.zero_stage == 3


def validation_wait(grpo, reward: RewardServiceConfig, val_prompts: int, val_limit: int,
                    rows_key: str = "data.val_limit", grpo_key: str = "grpo") -> PhaseWait | None:
    """A validation pass's longest wait between two collectives (module docstring); None without validation.

    >>> from train.config import GRPOConfig
    >>> grpo = GRPOConfig(val_metric="reward", num_workers=8, prompts_per_step=32, eval_every=50)
    >>> validation_wait(grpo, RewardServiceConfig(concurrency=8), 100, 0).rounds  # chunks 4, 4, 4, 1
    4
    """
    if not val_prompts:
        return None
    per_chunk, _ = validation_collectives(grpo)
    ppw, workers, c = grpo.prompts_per_worker, grpo.num_workers, reward.concurrency
    queued = ppw if grpo.rollout.max_staleness and grpo.eval_every else 0

    def waits(n: int) -> int:
        return validation_rounds(n, workers, ppw, c, collective_per_chunk=per_chunk, queued=queued)

    key = functools.partial(dotted, grpo_key)
    how = (f"the ranks meet before every chunk ({key('val_metric')} vs_baseline)"
           if grpo.val_metric == "vs_baseline" else "every generate is collective (ZeRO-3 hf rollouts)"
           if per_chunk else f"nothing brings the ranks together between chunks ({key('val_metric')} reward, "
           f"{key('rollout.kind')} {grpo.rollout.kind}, {key('deepspeed.zero_stage')} {grpo.deepspeed.zero_stage})")
    limit = f"{rows_key} {val_limit}" if val_limit else f"all: {rows_key} 0"
    counted = (f"{val_prompts} val prompts ({limit}) over {workers} workers ({key('num_workers')}): "
               f"{rounds(val_prompts, workers)} requests each, padding included, {ppw} at a time "
               f"({key('prompts_per_worker')}); {how}")
    if queued:
        counted += (f"; the next step's {queued} groups, still in flight ({key('rollout.max_staleness')} 1), go "
                    "first")
    fit = most_rounds(reward, grpo.collective_timeout_s)
    best = _largest(val_prompts, lambda n: waits(n) <= fit)
    remedy = f"Lower {rows_key}" + (f" (to at most {best})" if best else "")
    return PhaseWait("validation pass", "a worker", waits(val_prompts), counted, rows_key,
                     f"{remedy}, raise {dotted('reward', 'concurrency')}")


def probe_wait(grpo, reward: RewardServiceConfig, pairs: int, probe_limit: int, probe_path: str, val_prompts: int,
               val_limit: int, probe_key: str = "monitor", rows_key: str = "data.val_limit",
               grpo_key: str = "grpo") -> PhaseWait | None:
    """Rank 0's longest wait in a monitored step with the probe (module docstring); None without a probe.

    >>> from train.config import GRPOConfig
    >>> grpo = GRPOConfig(val_metric="vs_baseline", num_workers=8, prompts_per_step=32, eval_every=50)
    >>> probe_wait(grpo, RewardServiceConfig(concurrency=8), 32, 32, "probe.jsonl", 100, 0).rounds
    4
    >>> grpo.val_metric = "reward"  # ZeRO < 3: the validation's 4 rounds come before any collective
    >>> probe_wait(grpo, RewardServiceConfig(concurrency=8), 32, 32, "probe.jsonl", 100, 0).rounds
    8
    """
    if not pairs:
        return None
    c, key = reward.concurrency, functools.partial(dotted, probe_key)
    counted = (f"{pairs} pairs of {key('probe_path')} {probe_path} ({key('probe_limit')} {probe_limit}), one "
               f"request each, all sent at once")
    then = 0
    if val_prompts and not validation_collectives(grpo)[1]:
        then = validation_wait(grpo, reward, val_prompts, val_limit, rows_key, grpo_key).rounds
        counted += (f", then a validation pass's {then} round{'s' if then != 1 else ''} before any collective "
                    f"({dotted(grpo_key, 'val_metric')} reward, {dotted(grpo_key, 'deepspeed.zero_stage')} "
                    f"{grpo.deepspeed.zero_stage})")
    fit = most_rounds(reward, grpo.collective_timeout_s) - then
    remedy = f"Lower {key('probe_limit')}" + (f" (to at most {fit * c})" if fit > 0 else "")
    remedy += f" or {rows_key}" if then else ""
    return PhaseWait("probe", "rank 0 (alone, the others going on to the next collective)", rounds(pairs, c) + then,
                     counted, key("probe_limit"), f"{remedy}, raise {dotted('reward', 'concurrency')}")


def _largest(upper: int, fits) -> int:
    """The largest n in 1..upper with fits(n) (fits: true up to some n, false after), 0 if none.

    >>> _largest(100, lambda n: n <= 37), _largest(5, lambda n: False), _largest(5, lambda n: True)
    (37, 0, 5)
    """
    low, high = 0, upper
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
