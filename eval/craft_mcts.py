"""TG-MCTS, the tool-guided Monte Carlo tree search of CRAFT (paper 002, §5.2, App. D.5-D.6), as pure search code.

Why pure: the models (planner, reviser, quality scorers, LLM feedback) live in Ray actors; this module only decides
which node to expand, keeps the counts and picks the answer, so it is tested on hand-worked trees with a fake policy.
The models come in through two injected callables (see :class:`Expander` and :class:`Scorer`):

- ``expand(request) -> list[Proposal]``: **one call per expansion** for the K = ``width`` children, so the caller
  batches its planner / reviser / feedback requests. Each proposal carries the planner output, the revised text,
  the rendered observation (``eval.craft_render.build_observation``) and how many model calls it cost.
- ``score(original, revisions, tool_calls) -> list[RewardTerms]``: the text-quality term R_g and the constraint
  accuracy of each revision, batched over one expansion's usable children. Constraint accuracy comes from the
  caller's tools (``eval.craft_tools.constraint_accuracy``), which this module does not import.

One iteration (paper's four operations):

1. **Selection** (Eq. 3): from the root, take the child with the largest
   ``UCT(s) = V(s) + alpha * sqrt(ln N(parent) / N(s))`` until a node that was never expanded. Children that are
   degenerate, at the depth cap, or whose subtree has nothing left to expand are skipped. Ties: lowest node id
   (or the injected ``random.Random`` with ``tie_break: random``).
2. **Tool-guided expansion**: ``expand`` returns up to K proposals; each becomes a child at depth + 1 whose
   history is the parent's plus ``[assistant: planner output, user: observation]`` (its own copy; the reference
   code shares one list between siblings, a bug). The degenerate guard (``eval.craft_guard``) flags children.
3. **Tool-based evaluation**: ``R = reward_scale * (w_g * R_g + w_c * constraint_scale * accuracy)``, each term
   switchable. Paper: ``R = R_g + R_c`` with R_g on 0..100 (App. D.3) and R_c an accuracy, so
   ``constraint_scale = 100`` puts both on the same scale. A degenerate child is not scored and gets
   ``degenerate_reward``.
4. **Backpropagation** (Eqs. 4-5): each child, in creation order, starts with ``N = 1, V = R`` and adds 1 visit and
   R to every ancestor up to the root (V = value_sum / N is the running mean of Eq. 5).

Scale: with the paper's rewards (0..200) and alpha = 0.2 the exploration term is at most
``0.2 * sqrt(ln 90) = 0.42``, so the search is nearly greedy, as the paper's is; ``reward_scale = 1/200`` makes
alpha = 0.2 a real exploration weight. Both are knobs.

Stops: ``all_constraints_met`` (a usable child has accuracy 1 over at least ``stop_min_checks`` checks),
``exhausted`` (no node left to expand), ``patience`` (best reward not improved by more than ``min_improvement``
for ``patience`` iterations: the paper's "ceases to improve", D.5), ``max_iterations``. The answer is then picked
by ``final_strategy``: ``best_reward`` (default; the paper is silent), ``greedy_value_path`` (the authors' code:
highest-V child from the root down to a leaf) or ``best_accuracy`` (accuracy, then reward). Degenerate nodes are
never the answer; if no usable node exists the original text is returned.

Callers that run many searches at once drive :class:`TGMCTS` step by step (``select`` -> ``add_children`` ->
``record_scores``) and batch the model requests of all searches together; :func:`run_search` is the plain loop.

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

from core.config import Section, dotted, fail, one_of, positive
from eval.craft_guard import GuardConfig, degenerate_reason
from eval.craft_tree import (
    ExpandRequest,
    Node,
    Proposal,
    RewardTerms,
    ScoreRequest,
    SearchCounts,
    SearchResult,
    ancestors,
    history,
    path_to,
)

FINAL_STRATEGIES = ("best_reward", "greedy_value_path", "best_accuracy")
RC_TOOLS = ("node", "first", "fixed")
TIE_BREAKS = ("id", "random")
# accuracy counts as 1 within float noise (a caller may compute it as a mean of floats)
_ALL_MET = 1.0 - 1e-9


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
        rc_tools: Which tool calls R_c checks: ``node`` (each child's own planner calls; paper D.5 "tools
            generated by pi_p"), ``first`` (the first usable child's calls, frozen for the search: the authors'
            code checks the planner's initial prediction), ``fixed`` (calls given to the search, e.g. CORD's
            gold calls: an oracle, for analysis only).
        stop_when_all_met: Stop once a usable child satisfies every checked constraint.
        stop_min_checks: ... over at least this many constraint checks (C0 has none, so it never stops early).
        patience: Iterations without improvement of the best reward before stopping; 0 = off.
        min_improvement: An improvement must exceed this (reward units after ``reward_scale``).
        final_strategy: How the answer is picked (see the module docstring).
        tie_break: Selection ties: ``id`` (lowest node id wins) or ``random`` (the injected ``random.Random``;
            the authors' code breaks ties at random). The final choice always breaks ties by id, so calling
            ``result()`` twice gives the same answer.
        degenerate_reward: Reward of a degenerate child (backed up like any other; after ``reward_scale``).
        guard: Degenerate-revision guard knobs.
        seed: Seeds the search's ``random.Random`` when the caller injects none; per-expansion sampling seeds
            come from it.
    """

    exploration: float = 0.2
    width: int = 3
    max_depth: int = 5
    max_iterations: int = 30
    use_quality: bool = True
    use_constraints: bool = True
    quality_weight: float = 1.0
    constraint_weight: float = 1.0
    constraint_scale: float = 100.0
    reward_scale: float = 1.0
    rc_tools: Literal["node", "first", "fixed"] = "node"
    stop_when_all_met: bool = True
    stop_min_checks: int = 1
    patience: int = 5
    min_improvement: float = 0.0
    final_strategy: Literal["best_reward", "greedy_value_path", "best_accuracy"] = "best_reward"
    tie_break: Literal["id", "random"] = "id"
    degenerate_reward: float = 0.0
    guard: GuardConfig = field(default_factory=GuardConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()  # a search built in code is checked like one loaded from YAML (`core.config.Section`)

    def check(self, where: str = "") -> None:
        # every number finite and >= 0 (exploration, weights, scales, degenerate_reward, patience, seed, ...) is
        # check_tree's floor; `guard` is a nested section and checks itself
        positive(self.reward_scale, dotted(where, "reward_scale"))
        for name in ("width", "max_depth", "max_iterations"):
            if getattr(self, name) < 1:
                fail(dotted(where, name), f"must be >= 1, got {getattr(self, name)}")
        for name, allowed in (("rc_tools", RC_TOOLS), ("final_strategy", FINAL_STRATEGIES),
                              ("tie_break", TIE_BREAKS)):
            one_of(getattr(self, name), allowed, dotted(where, name))
        if not (self.use_quality or self.use_constraints):
            fail(dotted(where, "use_quality, use_constraints"), "at least one reward term must be on")


class Expander(Protocol):
    def __call__(self, request: ExpandRequest) -> list[Proposal]: ...


class Scorer(Protocol):
    def __call__(self, original: str, revisions: list[str], tool_calls: list[list[str]]) -> list[RewardTerms]: ...


def uct(value: float, visits: int, parent_visits: int, exploration: float) -> float:
    """Eq. 3: ``V + alpha * sqrt(ln N(parent) / N)``; an unvisited node is +inf (never happens in TG-MCTS).

    >>> round(uct(0.5, 2, 6, 0.2), 6)
    0.689302
    """
    if visits == 0:
        return math.inf
    return value + exploration * math.sqrt(math.log(parent_visits) / visits)


def combine_reward(terms: RewardTerms, config: MCTSConfig) -> float:
    """The node reward ``reward_scale * (w_g * R_g + w_c * constraint_scale * accuracy)`` with switched-off terms 0.

    >>> round(combine_reward(RewardTerms(quality=60.0, accuracy=0.75, n_checks=4), MCTSConfig()), 6)
    135.0
    """
    total = 0.0
    if config.use_quality:
        total += config.quality_weight * terms.quality
    if config.use_constraints:
        total += config.constraint_weight * config.constraint_scale * terms.accuracy
    return config.reward_scale * total


class TGMCTS:
    """One search over one (instruction, text) task. Not thread-safe; one pending expansion at a time."""

    def __init__(self, original: str, initial_messages: list[dict], config: MCTSConfig | None = None,
                 rng: random.Random | None = None, fixed_calls: list[str] | None = None) -> None:
        self.config = config or MCTSConfig()
        if self.config.rc_tools == "fixed" and fixed_calls is None:
            raise ValueError("rc_tools 'fixed' needs fixed_calls")
        self.original = original
        self.rng = rng if rng is not None else random.Random(self.config.seed)
        self.nodes = [Node(id=0, parent_id=None, depth=0, text=original, turns=[dict(m) for m in initial_messages])]
        self.counts = SearchCounts()
        self.stop_reason = ""
        self._rc_calls: tuple[str, ...] | None = tuple(fixed_calls) if fixed_calls is not None else None
        self._pending: ExpandRequest | None = None
        self._scoring: ScoreRequest | None = None
        self._best = -math.inf
        self._stall = 0

    # -- selection ---------------------------------------------------------------------------------------------

    def _selectable(self, node: Node) -> bool:
        return not (node.degenerate or node.terminal or node.exhausted)

    def _argmax(self, nodes: list[Node], key, *, random_ties: bool = False) -> Node:
        best = max(key(n) for n in nodes)
        tied = [n for n in nodes if key(n) == best]
        if len(tied) == 1 or not random_ties:
            return min(tied, key=lambda n: n.id)
        return self.rng.choice(sorted(tied, key=lambda n: n.id))

    def _uct_key(self, parent_visits: int):
        return lambda c: uct(c.value, c.visits, parent_visits, self.config.exploration)

    def select(self) -> ExpandRequest | None:
        """Selection: the next node to expand, or None when the search has stopped (see ``stop_reason``)."""
        if self._pending is not None or self._scoring is not None:
            raise RuntimeError("select() called while an expansion is still pending")
        if not self.stop_reason and self.counts.iterations >= self.config.max_iterations:
            self.stop_reason = "max_iterations"
        if self.stop_reason:
            return None
        node = self.nodes[0]
        while node.expanded:
            children = [self.nodes[i] for i in node.children if self._selectable(self.nodes[i])]
            node = self._argmax(children, self._uct_key(node.visits), random_ties=self.config.tie_break == "random")
        self._pending = ExpandRequest(node_id=node.id, depth=node.depth, text=node.text,
                                      history=history(self.nodes, node.id), k=self.config.width,
                                      seed=self.rng.randrange(2**31), iteration=self.counts.iterations)
        return self._pending

    # -- expansion ---------------------------------------------------------------------------------------------

    def add_children(self, request: ExpandRequest, proposals: list[Proposal]) -> ScoreRequest:
        """Expansion: turn the caller's proposals into children; returns the usable ones to score."""
        if request is not self._pending:
            raise RuntimeError("add_children() needs the request select() returned last")
        if len(proposals) > request.k:
            raise ValueError(f"expand returned {len(proposals)} proposals for width {request.k}")
        parent = self.nodes[request.node_id]
        parent.expanded = True
        self.counts.expansions += 1
        self.counts.short_expansions += len(proposals) < request.k
        ids, texts, calls = [], [], []
        for proposal in proposals:
            child = Node(
                id=len(self.nodes), parent_id=parent.id, depth=parent.depth + 1, text=proposal.text,
                turns=[{"role": "assistant", "content": proposal.planner_output},
                       {"role": "user", "content": proposal.observation}],
                planner_output=proposal.planner_output, plan=[_plain(p) for p in proposal.plan],
                tool_calls=list(proposal.tool_calls), feedback=dict(proposal.feedback),
                model_calls=proposal.model_calls, parse_errors=list(proposal.parse_errors),
                iteration=request.iteration, terminal=parent.depth + 1 >= self.config.max_depth,
            )
            child.degenerate = degenerate_reason(proposal.text, parent.text, self.original, self.config.guard,
                                                 truncated=proposal.truncated)
            self.nodes.append(child)
            parent.children.append(child.id)
            self._count(proposal, child)
            if child.degenerate:
                continue
            if self._rc_calls is None and self.config.rc_tools == "first":
                self._rc_calls = tuple(proposal.tool_calls)
            ids.append(child.id)
            texts.append(proposal.text)
            calls.append(tuple(proposal.tool_calls) if self.config.rc_tools == "node" else self._rc_calls)
        self._pending = None
        self._scoring = ScoreRequest(request.node_id, tuple(ids), tuple(texts), tuple(calls))
        return self._scoring

    def _count(self, proposal: Proposal, child: Node) -> None:
        c = self.counts
        c.children += 1
        c.model_calls += proposal.model_calls
        c.prompt_tokens += proposal.prompt_tokens
        c.completion_tokens += proposal.completion_tokens
        c.parse_errors += bool(proposal.parse_errors)
        if child.degenerate:
            c.degenerate += 1
            c.degenerate_reasons[child.degenerate] = c.degenerate_reasons.get(child.degenerate, 0) + 1

    # -- evaluation and backpropagation -----------------------------------------------------------------------

    def record_scores(self, request: ScoreRequest, terms: list[RewardTerms]) -> None:
        """Evaluation + backpropagation for every child of the expansion, then the stop checks."""
        if request is not self._scoring:
            raise RuntimeError("record_scores() needs the request add_children() returned last")
        if len(terms) != len(request.child_ids):
            raise ValueError(f"score returned {len(terms)} results for {len(request.child_ids)} revisions")
        by_id = dict(zip(request.child_ids, terms))
        parent = self.nodes[request.node_id]
        all_met = False
        for child_id in parent.children:
            child = self.nodes[child_id]
            if child.degenerate:
                reward = self.config.degenerate_reward
            else:
                child.terms = by_id[child_id]
                reward = combine_reward(child.terms, self.config)
                self.counts.scored += 1
                all_met |= child.terms.accuracy >= _ALL_MET and child.terms.n_checks >= self.config.stop_min_checks
            child.reward = reward
            child.visits, child.value_sum = 1, reward
            for ancestor_id in ancestors(self.nodes, child_id):
                self.nodes[ancestor_id].visits += 1
                self.nodes[ancestor_id].value_sum += reward
        self._scoring = None
        self._mark_exhausted(parent)
        self.counts.iterations += 1
        self._update_patience()
        if self.config.stop_when_all_met and all_met:
            self.stop_reason = "all_constraints_met"
        elif self.nodes[0].exhausted:
            self.stop_reason = "exhausted"
        elif self.config.patience and self._stall >= self.config.patience:
            self.stop_reason = "patience"
        elif self.counts.iterations >= self.config.max_iterations:
            self.stop_reason = "max_iterations"

    def _mark_exhausted(self, node: Node) -> None:
        # a node is exhausted when it was expanded and none of its children can be selected; walk up to the root
        while True:
            node.exhausted = node.expanded and not any(self._selectable(self.nodes[i]) for i in node.children)
            if node.parent_id is None:
                return
            node = self.nodes[node.parent_id]

    def _update_patience(self) -> None:
        best = max((n.reward for n in self._candidates()), default=-math.inf)
        if best > self._best + self.config.min_improvement:
            self._best, self._stall = best, 0
        else:
            self._stall += 1

    # -- final selection ---------------------------------------------------------------------------------------

    def _candidates(self) -> list[Node]:
        return [n for n in self.nodes[1:] if not n.degenerate and n.terms is not None]

    def choose(self) -> Node:
        """The answer node by ``final_strategy``; the root when no usable node exists."""
        candidates = self._candidates()
        if not candidates:
            return self.nodes[0]
        strategy = self.config.final_strategy
        if strategy == "best_reward":
            return self._argmax(candidates, lambda n: n.reward)
        if strategy == "best_accuracy":
            return self._argmax(candidates, lambda n: (n.terms.accuracy, n.reward))
        node = self.nodes[0]  # greedy_value_path
        while True:
            children = [self.nodes[i] for i in node.children if not self.nodes[i].degenerate
                        and self.nodes[i].terms is not None]
            if not children:
                return node
            node = self._argmax(children, lambda n: n.value)

    def result(self) -> SearchResult:
        """The chosen text and node, the stop reason, the counts and the whole tree as JSON-serialisable dicts."""
        chosen = self.choose()
        return SearchResult(
            text=chosen.text, node_id=chosen.id, chosen_is_root=chosen.id == 0, stop_reason=self.stop_reason,
            path=path_to(self.nodes, chosen.id), counts=self.counts,
            rc_calls=list(self._rc_calls) if self._rc_calls is not None else None,
            config=asdict(self.config), tree=[n.to_dict() for n in self.nodes],
        )


def run_search(original: str, initial_messages: list[dict], expand: Expander, score: Scorer,
               config: MCTSConfig | None = None, rng: random.Random | None = None,
               fixed_calls: list[str] | None = None) -> SearchResult:
    """Run a whole TG-MCTS search: select, expand (one ``expand`` call), score (one ``score`` call), back up.

    Args:
        original: The task's input text (root text y_0; the reference for the guard and the scorer).
        initial_messages: The planner's first prompt (``configs/prompts/craft_planner.yaml`` rendered): H_0.
        expand: Makes up to K children of one node (see :class:`ExpandRequest`, :class:`Proposal`).
        score: Scores the usable children of one expansion (see :class:`RewardTerms`).
        config: Search knobs (defaults: the paper's).
        rng: Source of all randomness in the search (seeded from ``config.seed`` when None).
        fixed_calls: The tool calls R_c checks when ``rc_tools == "fixed"``.

    Returns:
        The :class:`SearchResult`.
    """
    search = TGMCTS(original, initial_messages, config, rng, fixed_calls)
    while (request := search.select()) is not None:
        scoring = search.add_children(request, list(expand(request)))
        # an expansion whose children are all degenerate has nothing to score: no scorer call
        terms = list(score(original, list(scoring.revisions), [list(c) for c in scoring.tool_calls])) \
            if scoring.revisions else []
        search.record_scores(scoring, terms)
    return search.result()


def _plain(item: object) -> object:
    """A plan line as a JSON-able value (dataclasses such as ``craft_react.PlanLine`` become dicts)."""
    return asdict(item) if hasattr(item, "__dataclass_fields__") else item
