"""The knobs of TG-MCTS, CRAFT's tool-guided tree search (paper 002, App. D.6): :class:`MCTSConfig`.

The search itself (selection, expansion, rewards, backpropagation, stops and the final choice that these knobs
steer) is ``eval.craft.mcts``; this module holds only the validated config section that jobs nest in their configs.

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

from core.config import ConfigError, FieldCheck, Section, dotted, fail, one_of, positive
from eval.craft.guard import GuardConfig


def _finite(value: float, key: str) -> None:
    """A reward may be negative (D.3's R_g has no lower bound); it must be a finite number."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")


FINAL_STRATEGIES = ("best_reward", "greedy_value_path", "best_accuracy")
RC_TOOLS = ("node", "first", "fixed", "oracle")
TIE_BREAKS = ("id", "random")


@dataclass(frozen=True)
class MCTSConfig(Section):
    """TG-MCTS knobs; paper values (App. D.6) where it gives one, otherwise our documented choice.

    Attributes:
        exploration: alpha of Eq. 3 (paper 0.2).
        width: K, planner samples per expansion (paper 3).
        max_depth: Deepest node depth, root = 0 (paper: "6 layers" = depths 0..5). Nodes at this depth are
            leaves that are never expanded (``terminal``).
        max_iterations: Expansions at most (paper 30).
        use_quality / use_constraints: Switch R_g / R_c (the paper's "w/o R_g" / "w/o R_c" ablations). Both
            terms are still computed and logged.
        quality_weight / constraint_weight: Weights of R_g and R_c (paper: plain sum, 1 and 1).
        constraint_scale: R_c = constraint_scale * accuracy (100: same 0..100 scale as R_g).
        reward_scale: Multiplies the total reward before it enters V and UCT (1 = paper scale).
        rc_tools: Which tool calls R_c checks: ``first`` (default: the planner's first prediction, frozen for the
            whole search, as the authors' code), ``node`` (each child's own planner calls), ``fixed`` (calls
            given to the search), ``oracle`` (the same with CORD's gold calls, which the job passes: the
            oracle-planner control that isolates the search from the planner's tool choice; analysis only).
        stop_when_all_met: Also stop once a usable child satisfies every checked constraint (off: the paper
            stops on stalled quality or the iteration limit only).
        stop_min_checks: ... over at least this many constraint checks (C0 has none, so it never stops early).
        patience: Iterations without improvement of the best reward before stopping; 0 = off.
        min_improvement: An improvement must exceed this (reward units after ``reward_scale``).
        final_strategy: How the answer is picked (see eval.craft.mcts's docstring).
        tie_break: Selection ties: ``id`` (lowest node id wins) or ``random`` (the injected ``random.Random``;
            the authors' code breaks ties at random). The final choice always breaks ties by id, so calling
            ``result()`` twice gives the same answer.
        degenerate_reward: Reward of a degenerate child, backed up like any other (after ``reward_scale``). None
            (default) = below every usable child: ``min(0, the lowest reward of a usable child so far, this
            expansion's included) - degenerate_margin``, as the authors' code scores an empty revision far below any
            usable one. A number (negative allowed) is used as is; D.3's R_g has no lower bound, so a fixed number
            can rank a degenerate child above a usable one.
        degenerate_margin: How far below the lowest usable reward the default degenerate reward lies, in R's units
            before ``reward_scale`` (100: one whole R_c range).
        guard: Degenerate-revision guard knobs.
        seed: Seeds the search's ``random.Random`` when the caller injects none; per-expansion sampling seeds
            come from it.
    """

    exploration: float = 0.2  # alpha of Eq. 3 (paper 0.2)
    width: int = 3  # K, planner samples per expansion (paper 3)
    # deepest node depth, root = 0 (paper: "6 layers" = depths 0..5). Nodes at this depth are leaves that are never
    # expanded (`terminal`)
    max_depth: int = 5
    max_iterations: int = 30  # expansions at most (paper 30)
    # switch R_g on (false = the paper's "w/o R_g" ablation); R_g is still computed and logged
    use_quality: bool = True
    # switch R_c on (false = the paper's "w/o R_c" ablation); R_c is still computed and logged
    use_constraints: bool = True
    quality_weight: float = 1.0  # weight of R_g in the reward (paper: plain sum, 1)
    constraint_weight: float = 1.0  # weight of R_c in the reward (paper: plain sum, 1)
    constraint_scale: float = 100.0  # R_c = constraint_scale * accuracy (100: same 0..100 scale as R_g)
    reward_scale: float = 1.0  # multiplies the total reward before it enters V and UCT (1 = paper scale)
    # which tool calls R_c checks: `first` (default: the planner's first prediction, frozen for the whole search, as
    # the authors' code), `node` (each child's own planner calls), `fixed` (calls given to the search, e.g. CORD's gold
    # calls: an oracle, for analysis only), `oracle` (the job passes CORD's gold calls: the oracle-planner control)
    rc_tools: Literal["node", "first", "fixed", "oracle"] = "first"
    # also stop once a usable child satisfies every checked constraint (off: the paper stops on stalled quality or the
    # iteration limit only)
    stop_when_all_met: bool = False
    # stop_when_all_met needs at least this many constraint checks (C0 has none: it never stops early)
    stop_min_checks: int = 1
    patience: int = 5  # iterations without improvement of the best reward before stopping; 0 = off
    min_improvement: float = 0.0  # an improvement must exceed this (reward units after `reward_scale`)
    # how the answer is picked: best_reward | greedy_value_path | best_accuracy (eval.craft.mcts)
    final_strategy: Literal["best_reward", "greedy_value_path", "best_accuracy"] = "best_reward"
    # selection ties: `id` (lowest node id wins) or `random` (the injected `random.Random`; the authors' code breaks
    # ties at random). The final choice always breaks ties by id, so calling `result()` twice gives the same answer
    tie_break: Literal["id", "random"] = "id"
    # reward of a degenerate child, backed up like any other (after `reward_scale`); None = below every usable child:
    # min(0, lowest usable reward so far) - degenerate_margin. A fixed number (negative allowed) is used as is
    degenerate_reward: Annotated[float | None, FieldCheck(_finite)] = None
    # how far below the lowest usable reward the default degenerate reward lies (100: one whole R_c range)
    degenerate_margin: float = 100.0
    guard: GuardConfig = field(default_factory=GuardConfig)  # degenerate-revision guard knobs
    # seeds the search's random.Random when the caller injects none (per-expansion sampling seeds come from it)
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()  # a search built in code is checked like one loaded from YAML (`core.config.Section`)

    def check(self, where: str = "") -> None:
        # every number finite and >= 0 (exploration, weights, scales, degenerate_margin, patience, seed, ...) is
        # check_tree's floor (degenerate_reward: finite, any sign); `guard` is a nested section and checks itself
        positive(self.reward_scale, dotted(where, "reward_scale"))
        for name in ("width", "max_depth", "max_iterations"):
            if getattr(self, name) < 1:
                fail(dotted(where, name), f"must be >= 1, got {getattr(self, name)}")
        for name, allowed in (("rc_tools", RC_TOOLS), ("final_strategy", FINAL_STRATEGIES),
                              ("tie_break", TIE_BREAKS)):
            one_of(getattr(self, name), allowed, dotted(where, name))
        if not (self.use_quality or self.use_constraints):
            fail(dotted(where, "use_quality, use_constraints"), "at least one reward term must be on")
