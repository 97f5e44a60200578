"""The order of one GRPO step's work on a worker, with an optional one-step staleness of its rollouts.

    pipe = StepPipeline(sync, launch, behaviour, reward, max_staleness=1, total=10)
    took = pipe.take(step)            # this step's rollouts, rewarded; the next step's generated (max_staleness 1)
    took.batch.behaviour              # the log-probs of the policy that generated the rollouts, or None
    took.staleness                    # GRPO steps between that policy and the one this step updates

Per step, `take` does, in this order:

1. `sync()`: the rollout engine receives the current policy θ_t (a vLLM engine its adapter: `train.grpo.rollout_vllm`;
   the hf engine samples from the model itself);
2. the step's rollouts: the batch generated during step t-1 (``max_staleness: 1``), else `launch(t)` now (each
   generate call's groups go to the judge as the call returns: `train.grpo.overlap`);
3. with ``max_staleness: 1`` and a next step: `launch(t+1)` with the same θ_t, its groups sent to the judge, and
   `behaviour(batch)`: their log-probs under θ_t, the policy that sampled them, computed now, before step t's
   update changes it;
4. `collect_rewards` of step t's batch: the step blocks only on the answers still missing.

The caller then updates θ_t -> θ_{t+1} with step t's batch. So with ``max_staleness: 1`` the rollouts of step t+1
are generated while step t's last groups are judged, and step t+1 trains on rollouts of θ_t: one step off-policy,
as verl's one-step-off-policy trainer does it (verl/experimental/one_step_off_policy/ray_trainer.py `fit`: the next
batch is generated from the weights synced before the current update). The PPO ratio uses the behaviour policy's
log-probs as its "old" ones (verl's "bypass mode", old_log_probs = the rollout policy's, ray_trainer.py, "Operating
Mode Selection"; computed here by the training engine itself, so the ratio has no engine mismatch), and the clip
bounds it. Step 0 (and the first step of a resumed attempt: the pending batch is not checkpointed) is on-policy,
staleness 0; every later step has staleness 1. Which rollouts a step trains on never depends on timing: a step's
prompts and sampling seeds are functions of its number, whenever they are generated.

``max_staleness: 0`` (the default; the paper's on-policy update) launches and collects each step's own rollouts
with θ_t, exactly as before.

Pure: no ray, no torch; `sync`, `launch`, `behaviour` and `reward` are the caller's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from train.config_sections import STALENESS
from train.grpo.overlap import InFlight, StepRollouts, collect_rewards


@dataclasses.dataclass
class Batch:
    """One step's rollouts in flight, with what the caller prepared for them (`extra`: rows, prompts, ...)."""

    step: int  # the GRPO step that trains on it
    version: int  # the GRPO step whose policy (θ_version, before that step's update) generated it
    flight: InFlight
    extra: Any = None
    behaviour: Any = None  # the generating policy's log-probs; None = on-policy (the update's own)

    @property
    def staleness(self) -> int:
        return self.step - self.version


@dataclasses.dataclass
class Took:
    """One `take`: the step's batch and rewards, and the seconds of each kind of work done in it."""

    batch: Batch
    got: StepRollouts
    sync_s: float
    generate_s: float  # generating in this step (this step's rollouts, or the next step's)
    generated_tokens: int  # tokens generated in this step
    behaviour_s: float  # behaviour log-probs of the next step's batch

    @property
    def staleness(self) -> int:
        return self.batch.staleness


class StepPipeline:
    """Runs steps 2-4 of the module docstring; `take(step)` for each step in order."""

    def __init__(self, sync: Callable[[], None], launch: Callable[[int], tuple[InFlight, Any]],
                 behaviour: Callable[[Batch], Any], reward, max_staleness: int, total: int,
                 clock: Callable[[], float] = time.perf_counter):
        if max_staleness not in STALENESS:
            raise ValueError(f"max_staleness must be one of {list(STALENESS)}, got {max_staleness!r}")
        self.sync, self.launch, self.behaviour, self.reward = sync, launch, behaviour, reward
        self.max_staleness, self.total, self.clock = max_staleness, total, clock
        self.next: Batch | None = None

    def _launch(self, step: int, version: int) -> Batch:
        flight, extra = self.launch(step)
        return Batch(step, version, flight, extra)

    def take(self, step: int) -> Took:
        clock = self.clock()
        self.sync()
        sync_s = self.clock() - clock
        launched: list[Batch] = []
        if self.next is not None and self.next.step == step:
            batch, self.next = self.next, None
        else:  # step 0, a resumed attempt's first step, or max_staleness 0
            self.next = None
            batch = self._launch(step, version=step)
            launched.append(batch)
        behaviour_s = 0.0
        if self.max_staleness and step + 1 < self.total:
            # θ_step generates step + 1's rollouts while step's last groups are judged
            ahead = self._launch(step + 1, version=step)
            launched.append(ahead)
            clock = self.clock()
            ahead.behaviour = self.behaviour(ahead)  # before step's update: the behaviour policy's log-probs
            behaviour_s = self.clock() - clock
            self.next = ahead
        got = collect_rewards(batch.flight, self.reward, self.clock)
        return Took(batch, got, sync_s, generate_s=sum(b.flight.generate_s for b in launched),
                    generated_tokens=sum(b.flight.generated_tokens for b in launched), behaviour_s=behaviour_s)
