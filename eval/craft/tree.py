"""The records of a TG-MCTS search (paper 002, §5.2): what the search and its caller exchange (expand requests,
proposals, score requests, reward terms) and what it keeps (nodes, counts, the result and its tree dump).

Why a module of its own: the search (`eval.craft.mcts`) mutates these records, while the run store, the reports
and the self-training data builder only read them back from JSON. Everything here converts to plain dicts
(``to_dict``) and back (``from_dict``), so a dumped tree is analysed without the search code's state.

A node stores only the chat turns it adds to the history (root: the planner's initial prompt; a child: the planner's
output as an assistant turn and the observation of its revision as a user turn). The paper's H_j is the
concatenation along the path from the root (:func:`history`), so a 90-node tree does not store 90 growing copies.

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class RewardTerms:
    """What the caller's scorer says about one revision; the search combines it into the reward.

    Attributes:
        quality: R_g, the text-quality term (paper: mean of normalized PPL, BARTScore and SOME, App. D.3; 0..100,
            can be negative because PPL_nom is not clamped).
        accuracy: Fraction of the checked constraint calls that hold, in [0, 1] (0 when nothing is checked).
        n_checks: How many constraint calls the accuracy is over (``text_eval()`` and ``detect_keyword()``
            excluded); 0 = nothing to check, which never triggers the all-constraints-met stop.
        parts: Anything to log with the node, JSON-serialisable (``ppl_nom``, ``bart_nom``, ``some_nom``,
            per-call results, ...).
    """

    quality: float
    accuracy: float
    n_checks: int = 0
    parts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {self.accuracy}")
        if self.n_checks < 0:
            raise ValueError(f"n_checks must be >= 0, got {self.n_checks}")


@dataclass
class Node:
    """One search node s_j = {o_j, H_j, N(s_j), V(s_j)} plus what analysis needs.

    Attributes:
        id: Creation order, 0 = root (ties in selection and final choice go to the lowest id).
        parent_id: None for the root.
        depth: Root 0.
        text: y_j (root: the original text).
        turns: Chat turns this node adds to the history (see the module docstring).
        planner_output / plan / tool_calls: The planner's action that produced this node (empty at the root).
        feedback: Structured tool feedback of this node's revision (the observation's parts).
        visits: N(s_j).
        value_sum: Sum of the rewards backed up through this node; V = value_sum / visits.
        reward: R(s_j) (None at the root and before scoring).
        terms: The scorer's terms (None at the root, for degenerate nodes and before scoring).
        children: Child ids in creation order.
        degenerate: The guard's reason ("" = usable). A degenerate node is never selected, expanded or chosen.
        terminal: At the depth cap: never expanded.
        expanded: Its children were generated (a node is expanded once).
        exhausted: Expanded, and no child can be selected any more.
        model_calls: Model calls spent on this node (reported by the caller).
        parse_errors: The ReAct parser's error codes for the planner output.
        iteration: The iteration that created it (-1 for the root).
    """

    id: int
    parent_id: int | None
    depth: int
    text: str
    turns: list[dict] = field(default_factory=list)
    planner_output: str = ""
    plan: list = field(default_factory=list)
    tool_calls: list[str] = field(default_factory=list)
    feedback: dict = field(default_factory=dict)
    visits: int = 0
    value_sum: float = 0.0
    reward: float | None = None
    terms: RewardTerms | None = None
    children: list[int] = field(default_factory=list)
    degenerate: str = ""
    terminal: bool = False
    expanded: bool = False
    exhausted: bool = False
    model_calls: int = 0
    parse_errors: list[str] = field(default_factory=list)
    iteration: int = -1

    @property
    def value(self) -> float:
        """V(s_j), the mean backed-up reward (0 before any visit)."""
        return self.value_sum / self.visits if self.visits else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["value"] = self.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Node:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if kwargs.get("terms") is not None:
            kwargs["terms"] = RewardTerms(**kwargs["terms"])
        return cls(**kwargs)


@dataclass
class SearchCounts:
    """Counters of one search (what the cost table and the degenerate report need).

    Attributes:
        iterations: Completed select-expand-evaluate-backup cycles.
        expansions: Nodes expanded (equals iterations unless the last one was interrupted).
        short_expansions: Expansions that returned fewer than K proposals.
        children: Nodes created below the root.
        scored: Children the scorer evaluated (the usable ones).
        degenerate: Children the guard flagged; ``degenerate_reasons`` splits them by reason.
        model_calls / prompt_tokens / completion_tokens: Summed over the caller's proposals.
        parse_errors: Proposals whose planner output had at least one parse error.
    """

    iterations: int = 0
    expansions: int = 0
    short_expansions: int = 0
    children: int = 0
    scored: int = 0
    degenerate: int = 0
    degenerate_reasons: dict = field(default_factory=dict)
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_errors: int = 0


@dataclass
class SearchResult:
    """The outcome of one search.

    Attributes:
        text: The chosen revision (the original text when ``chosen_is_root``).
        node_id: The chosen node.
        chosen_is_root: No usable child existed.
        stop_reason: ``all_constraints_met`` | ``exhausted`` | ``patience`` | ``max_iterations``.
        path: Node ids from the root to the chosen node.
        counts: :class:`SearchCounts`.
        rc_calls: The tool calls R_c checked when they were shared (``rc_tools`` first/fixed), else None.
        config: The search config as a dict.
        tree: Every node's ``to_dict()``, in id order.
    """

    text: str
    node_id: int
    chosen_is_root: bool
    stop_reason: str
    path: list[int]
    counts: SearchCounts
    rc_calls: list[str] | None
    config: dict
    tree: list[dict]

    @property
    def node(self) -> dict:
        return self.tree[self.node_id]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SearchResult:
        return cls(**{**d, "counts": SearchCounts(**d["counts"])})


@dataclass(frozen=True)
class ExpandRequest:
    """What the caller needs to expand one node: ``width`` planner samples on ``history``, then revise each."""

    node_id: int
    depth: int
    text: str  # y_j: the text the planner's plan lines quote and the reviser rewrites
    history: list[dict]  # H_j: chat messages for the planner (initial prompt, then assistant/observation pairs)
    k: int
    seed: int  # sampling seed for this expansion; the caller derives one per sample (seed + i)
    iteration: int


@dataclass(frozen=True)
class Proposal:
    """One child as the caller produced it. Everything must be JSON-serialisable (it goes into the tree dump).

    Attributes:
        text: The revision y_{j+1} (the reviser's output joined into one paragraph).
        planner_output: The planner's raw thought + action: the assistant turn of the child's history.
        observation: o_{j+1} as the planner reads it next (``eval.craft.render.build_observation``): the user turn.
        plan: Parsed plan lines, e.g. ``[{"sentence": ..., "improvement_plan": ...}]``.
        tool_calls: The planner's tool-call strings (parsed, never executed).
        feedback: Structured feedback for analysis (constraint messages, E.8 suggestions, quality score).
        model_calls / prompt_tokens / completion_tokens: The cost of producing this child.
        truncated: Some generation for this child stopped at its token limit.
        parse_errors: The ReAct parser's error codes for the planner output.
    """

    text: str
    planner_output: str = ""
    observation: str = ""
    plan: tuple = ()
    tool_calls: tuple[str, ...] = ()
    feedback: dict = field(default_factory=dict)
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: bool = False
    parse_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScoreRequest:
    """The usable children of one expansion, to be scored in one batch (degenerate ones are left out)."""

    node_id: int
    child_ids: tuple[int, ...]
    revisions: tuple[str, ...]
    tool_calls: tuple[tuple[str, ...], ...]


def ancestors(nodes: list[Node], node_id: int) -> list[int]:
    """Ids of the ancestors of ``node_id``, nearest first, root last.

    >>> tree = [Node(0, None, 0, "r"), Node(1, 0, 1, "a"), Node(2, 1, 2, "b")]
    >>> ancestors(tree, 2)
    [1, 0]
    """
    out = []
    parent = nodes[node_id].parent_id
    while parent is not None:
        out.append(parent)
        parent = nodes[parent].parent_id
    return out


def path_to(nodes: list[Node], node_id: int) -> list[int]:
    """Ids from the root down to ``node_id``."""
    return [*reversed(ancestors(nodes, node_id)), node_id]


def history(nodes: list[Node], node_id: int) -> list[dict]:
    """H_j: the chat turns of every node on the path from the root, fresh dicts (each child gets its own copy)."""
    return [dict(turn) for i in path_to(nodes, node_id) for turn in nodes[i].turns]
