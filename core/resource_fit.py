"""Can the cluster ever grant what a stage asks Ray for? The arithmetic, without Ray.

A stage asks for `count` units of the same shape: Ray Train workers (`num_workers` x `{CPU: cpus_per_worker, ...}`),
the actors of a Ray Data pool (`concurrency` x `{CPU: num_cpus, GPU: num_gpus, ...}`). Ray places each unit whole on
one node, and a request it can never grant is not an error in Ray: it waits, for ever (Ray Train logs "Attempting
to start training worker group" and nothing more). `verdict` compares the request with

- the nodes alive now (each node's total resources, what `ray.nodes()` reports),
- what this job holds for its whole life (`ray job submit --entrypoint-num-cpus 0.25` reserves 0.25 CPU for the
  process that runs the driver; that share never frees while the job runs),
- the autoscaler's node types, when there is one (each type's resources and `max_count`, -1 = no limit),

and says `ok` (fits on the nodes there are), `wait` (fits only once the autoscaler adds nodes: the caller waits,
bounded) or `refuse`, with a message naming the stage, what it asked, what there is, and the keys to change.

The bounds are optimistic where they cannot be exact (free resources of other jobs are not counted as taken,
autoscaled nodes are counted on top of the current ones), so a refusal is certain: the request cannot fit even on
an otherwise idle cluster grown to its limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

OK, WAIT, REFUSE = "ok", "wait", "refuse"


@dataclass(frozen=True)
class Ask:
    """`count` units of `unit` resources for `stage`, set by the config `keys`."""

    stage: str
    what: str
    count: int
    unit: Mapping[str, float]
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeType:
    """One autoscaler node type: the resources of one node, and at most `max_count` of them (-1 = unlimited)."""

    name: str
    resources: Mapping[str, float]
    max_count: int


@dataclass(frozen=True)
class Capacity:
    # the total resources of each alive node
    nodes: tuple[Mapping[str, float], ...]
    # held by this job for its whole life (the entrypoint's reservation under `ray job submit`)
    held: Mapping[str, float] = field(default_factory=dict)
    # the autoscaler's node types; () = no autoscaler (or none that reports its node types)
    node_types: tuple[NodeType, ...] = ()
    # an autoscaler runs but its node types are unknown: a request that does not fit now may still fit later
    autoscaler_unknown: bool = False


@dataclass(frozen=True)
class Verdict:
    kind: str  # OK | WAIT | REFUSE
    message: str = ""


def autoscaler_in_status(status: dict) -> bool:
    """Whether the autoscaler status Ray's monitor writes to the GCS (`__autoscaling_status`) comes from a real
    autoscaler. Every cluster's head runs the monitor; without an autoscaling config it runs a read-only provider
    whose node types are the nodes themselves, named `node_<node id>` (`ray.autoscaler._private.util.
    format_readonly_node_type`), where a real one names its configured types.

    >>> autoscaler_in_status({"autoscaler_report": {"node_type_mapping": {"27a3": "node_27a3"}}})
    False
    >>> autoscaler_in_status({"autoscaler_report": {"node_type_mapping": {"ff00": "ray.head.default"}}})
    True
    >>> autoscaler_in_status({})
    False
    """
    mapping = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(node_type != f"node_{node_id}" for node_id, node_type in mapping.items())


def _num(x: float) -> str:
    return f"{x:g}"


def units_on(node: Mapping[str, float], unit: Mapping[str, float]) -> float:
    """How many whole units fit on one node of these total resources (inf for a unit that asks for nothing).

    >>> units_on({"CPU": 2, "GPU": 1}, {"CPU": 1}), units_on({"CPU": 2, "GPU": 1}, {"CPU": 1, "GPU": 1})
    (2, 1)
    >>> units_on({"CPU": 2}, {"CPU": 0.75}), units_on({"CPU": 16}, {"CPU": 1, "gpu_slot": 1})
    (2, 0)
    """
    fits = math.inf
    for name, amount in unit.items():
        if amount > 0:
            # the small epsilon: 3 x 0.1 CPU must fit 0.3 CPU despite binary floating point
            fits = min(fits, math.floor(node.get(name, 0.0) / amount + 1e-9))
    return fits


def describe(ask: Ask) -> str:
    """`training: 2 workers × 1 CPU = 2 CPU`.

    >>> describe(Ask("training", "workers", 2, {"CPU": 1}))
    'training: 2 workers × 1 CPU = 2 CPU'
    >>> describe(Ask("generate", "actors", 3, {"CPU": 0.5, "gpu_slot": 1}))
    'generate: 3 actors × {0.5 CPU, 1 gpu_slot} = 1.5 CPU, 3 gpu_slot'
    >>> describe(Ask("judge", "actors", 1, {"CPU": 1.5, "GPU": 0}))
    'judge: 1 actor × 1.5 CPU = 1.5 CPU'
    """
    wanted = {name: amount for name, amount in ask.unit.items() if amount > 0}
    shape = ", ".join(f"{_num(v)} {k}" for k, v in wanted.items())
    shape = shape if len(wanted) == 1 else "{" + shape + "}"
    total = ", ".join(f"{_num(ask.count * v)} {k}" for k, v in wanted.items())
    what = ask.what.removesuffix("s") if ask.count == 1 else ask.what
    return f"{ask.stage}: {ask.count} {what} × {shape} = {total}"


def _totals(nodes: tuple[Mapping[str, float], ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            out[name] = out.get(name, 0.0) + amount
    return out


def _fits(ask: Ask, nodes: tuple[Mapping[str, float], ...], held: Mapping[str, float]) -> bool:
    """Each unit whole on one node, and all of them within the totals less what this job holds."""
    totals = _totals(nodes)
    if any(ask.count * amount > totals.get(name, 0.0) - held.get(name, 0.0) + 1e-9
           for name, amount in ask.unit.items() if amount > 0):
        return False
    return sum(units_on(node, ask.unit) for node in nodes) >= ask.count


def _shortfall(ask: Ask, cap: Capacity) -> str:
    """What the nodes there are lack, in numbers."""
    totals = _totals(cap.nodes)
    parts = []
    for name, amount in ask.unit.items():
        if amount <= 0:
            continue
        need, have, held = ask.count * amount, totals.get(name, 0.0), cap.held.get(name, 0.0)
        if need > have - held + 1e-9:
            free = f"{_num(have)} {name} in all"
            if held:
                free += f", {_num(held)} of them held by this job's driver (the entrypoint's reservation): " \
                        f"{_num(max(have - held, 0))} {name} for the stage"
            parts.append(free)
    if parts:
        return "the cluster has " + "; ".join(parts)
    largest = max(cap.nodes, key=lambda n: units_on(n, ask.unit), default={})
    placed = sum(units_on(node, ask.unit) for node in cap.nodes)
    node_list = ", ".join("{" + ", ".join(f"{_num(v)} {k}" for k, v in sorted(n.items()) if k in ask.unit) + "}"
                          for n in cap.nodes[:8])
    if not largest or units_on(largest, ask.unit) == 0:
        return f"no node can hold one of them (nodes: {node_list or 'none'})"
    return f"each of them must sit whole on one node and the nodes ({node_list}) hold only {placed}"


def verdict(ask: Ask, cap: Capacity) -> Verdict:
    """OK when the request fits the nodes alive now (less what this job holds), WAIT when only an autoscaler can
    make it fit, else REFUSE with the numbers.

    >>> two_cpus = Capacity(nodes=({"CPU": 2.0},), held={"CPU": 0.25})
    >>> verdict(Ask("training", "workers", 2, {"CPU": 1}, ("train.trainer.num_workers",)), two_cpus).message
    "training: 2 workers × 1 CPU = 2 CPU, but the cluster has 2 CPU in all, 0.25 of them held by this job's driver (the entrypoint's reservation): 1.75 CPU for the stage, and no autoscaler to add nodes. Change train.trainer.num_workers, or give the cluster more"
    >>> verdict(Ask("training", "workers", 1, {"CPU": 1}), two_cpus).kind
    'ok'
    >>> grows = Capacity(nodes=({"CPU": 2.0},), node_types=(NodeType("cpu", {"CPU": 4}, 2),))
    >>> verdict(Ask("generate", "actors", 4, {"CPU": 2}), grows).kind, verdict(Ask("g", "actors", 6, {"CPU": 2}), grows).kind
    ('wait', 'refuse')
    """
    if ask.count <= 0 or _fits(ask, cap.nodes, cap.held):
        return Verdict(OK)
    grown = list(cap.nodes)
    for node_type in cap.node_types:
        if node_type.max_count < 0:
            if units_on(node_type.resources, ask.unit) > 0:
                return Verdict(WAIT, f"{describe(ask)}: more than the nodes there are ({_shortfall(ask, cap)}); "
                                     f"waiting for the autoscaler to add {node_type.name!r} nodes")
            continue
        grown += [node_type.resources] * node_type.max_count
    if cap.node_types and _fits(ask, tuple(grown), cap.held):
        names = ", ".join(repr(t.name) for t in cap.node_types)
        return Verdict(WAIT, f"{describe(ask)}: more than the nodes there are ({_shortfall(ask, cap)}); waiting for "
                             f"the autoscaler to add nodes (types {names})")
    if cap.autoscaler_unknown:
        return Verdict(WAIT, f"{describe(ask)}: more than the nodes there are ({_shortfall(ask, cap)}); an autoscaler "
                             "runs but does not report its node types: waiting for it to add nodes")
    keys = " or ".join(ask.keys) if ask.keys else "the stage's resources"
    if cap.node_types:
        limit = ", ".join(f"{t.name}: up to {t.max_count} × {{" + ", ".join(
            f"{_num(v)} {k}" for k, v in sorted(t.resources.items())) + "}" for t in cap.node_types)
        where = f"{_shortfall(ask, cap)}, and even grown to its autoscaler's limits ({limit}) it cannot hold them"
    else:
        where = f"{_shortfall(ask, cap)}, and no autoscaler to add nodes"
    return Verdict(REFUSE, f"{describe(ask)}, but {where}. Change {keys}, or give the cluster more")


# ---------------------------------------------------------------------------------------------------------------
# Everything a job must hold at once
#
# Ray Train's worker group is placed whole (one placement group) and waits for ever for what is missing; a Serve app
# keeps its replicas for as long as it runs. A job that needs both at once (policy GRPO: the training workers call
# the reward service's replicas) can never start when their sum exceeds the cluster, though each alone fits. The
# actor pools of one Ray Data plan (a stage's per-model branches, unioned) are not summed: Ray Data provisions pool
# actors asynchronously (DataContext.wait_for_min_actors_s is -1 by default: ray/data/_internal/execution/operators/
# actor_pool_map_operator.py `start`) and a finished operator releases its actors, so pools the cluster cannot
# hold together run partly one after the other instead of waiting for ever.


def _sum(asks: list[Ask]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ask in asks:
        for name, amount in ask.unit.items():
            if amount > 0:
                out[name] = out.get(name, 0.0) + ask.count * amount
    return out


def _packs(asks: list[Ask], nodes: tuple[Mapping[str, float], ...], held: Mapping[str, float]) -> bool:
    """Whether every unit of every ask can be placed whole on one of `nodes` at the same time (first fit, largest
    units first; `held` is taken from the first node that has it). A found placement proves the asks fit."""
    free = [dict(node) for node in nodes]
    for name, amount in held.items():
        for node in free:
            take = min(amount, node.get(name, 0.0))
            node[name] = node.get(name, 0.0) - take
            amount -= take
        if amount > 1e-9:
            return False
    units = sorted(((ask.unit, n) for ask in asks for n in range(ask.count)),
                   key=lambda u: sorted(((-v, k) for k, v in u[0].items() if v > 0)))
    for unit, _ in units:
        for node in free:
            if units_on(node, unit) >= 1:
                for name, amount in unit.items():
                    if amount > 0:
                        node[name] = node.get(name, 0.0) - amount
                break
        else:
            return False
    return True


def _grown(cap: Capacity) -> tuple[tuple[Mapping[str, float], ...], bool]:
    """The nodes there are plus every autoscaler node type at its `max_count`; True when a type has no limit."""
    grown = list(cap.nodes)
    unlimited = False
    for node_type in cap.node_types:
        if node_type.max_count < 0:
            unlimited = True
        else:
            grown += [node_type.resources] * node_type.max_count
    return tuple(grown), unlimited


def describe_all(asks: list[Ask]) -> str:
    """`training: 8 workers × {4 CPU, 1 GPU} = 32 CPU, 8 GPU + serve: 1 replica × ... = 9 GPU, 36 CPU at once`.

    >>> describe_all([Ask("training", "workers", 2, {"CPU": 1, "GPU": 1}), Ask("serve", "replicas", 1, {"GPU": 1})])
    'training: 2 workers × {1 CPU, 1 GPU} = 2 CPU, 2 GPU + serve: 1 replica × 1 GPU = 1 GPU: 2 CPU, 3 GPU at once'
    """
    total = ", ".join(f"{_num(v)} {k}" for k, v in _sum(asks).items())
    return " + ".join(describe(ask) for ask in asks) + f": {total} at once"


def verdict_all(asks: list[Ask], cap: Capacity) -> Verdict:
    """`verdict` for everything a job must hold at the same time (training workers beside the reward service's
    replicas they call): each ask must fit, and so must their sum. REFUSE only when the sum of a
    resource exceeds what the cluster holds even grown to its autoscaler's limits (certain); WAIT when the nodes there
    are cannot hold them all but an autoscaler may add nodes; OK otherwise (a placement was found, or none is ruled
    out: Ray places them).

    >>> two_by_four = Capacity(nodes=(), node_types=(NodeType("gpu_worker", {"CPU": 48, "GPU": 4}, 2),))
    >>> asks = [Ask("training", "workers", 8, {"CPU": 4, "GPU": 1}, ("grpo.num_workers",)),
    ...         Ask("serve", "replicas", 1, {"CPU": 4, "GPU": 1}, ("grm.overrides autoscaling.min_replicas",))]
    >>> verdict_all(asks[:1], two_by_four).kind, verdict_all(asks, two_by_four).kind
    ('wait', 'refuse')
    >>> print(verdict_all(asks, two_by_four).message)  # doctest: +NORMALIZE_WHITESPACE
    training: 8 workers × {4 CPU, 1 GPU} = 32 CPU, 8 GPU + serve: 1 replica × {4 CPU, 1 GPU} = 4 CPU, 1 GPU: 36 CPU,
    9 GPU at once, but the cluster holds at most 8 GPU (the 0 nodes there are and its autoscaler's limits:
    gpu_worker: up to 2 × {48 CPU, 4 GPU}). Change grpo.num_workers or grm.overrides autoscaling.min_replicas, or give
    the cluster more
    """
    asks = [ask for ask in asks if ask.count > 0]
    for ask in asks:
        single = verdict(ask, cap)
        if single.kind == REFUSE:
            return single
    if len(asks) <= 1:
        return verdict(asks[0], cap) if asks else Verdict(OK)
    if _packs(asks, cap.nodes, cap.held):
        return Verdict(OK)
    grown, unlimited = _grown(cap)
    need, have = _sum(asks), _totals(grown)
    short = {name: amount for name, amount in need.items()
             if amount > have.get(name, 0.0) - cap.held.get(name, 0.0) + 1e-9}
    if short and not unlimited and not cap.autoscaler_unknown:
        holds = ", ".join(f"{_num(have.get(k, 0.0) - cap.held.get(k, 0.0))} {k}" for k in short)
        held = ", ".join(f"{_num(cap.held[k])} {k}" for k in short if cap.held.get(k))
        limits = ", ".join(f"{t.name}: up to {t.max_count} × {{" + ", ".join(
            f"{_num(v)} {k}" for k, v in sorted(t.resources.items())) + "}" for t in cap.node_types)
        where = f"the {len(cap.nodes)} nodes there are" + (f" and its autoscaler's limits: {limits}" if limits
                                                             else ", and no autoscaler to add nodes")
        keys = " or ".join(key for ask in asks for key in (ask.keys or (f"{ask.stage}'s resources",)))
        return Verdict(REFUSE, f"{describe_all(asks)}, but the cluster holds at most {holds} ({where})"
                               + (f", {held} of it held by this job's driver" if held else "")
                               + f". Change {keys}, or give the cluster more")
    if cap.node_types or cap.autoscaler_unknown:
        return Verdict(WAIT, f"{describe_all(asks)}: more than the nodes there are hold; waiting for the autoscaler "
                             "to add nodes")
    return Verdict(OK)
