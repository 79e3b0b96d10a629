"""``algorithm="auto"``: pick the algorithm with the lowest estimated time.

Every candidate is costed by the alpha-beta-gamma model of ``collectives.algorithms.schedule.cost``
(per round a latency, per byte received a transfer time, per byte reduced a compute time,
per message an overhead) with the transport's own constants, over the plans of a few sample
participants (the first, the last, one in the middle: the busiest in every algorithm here), so
the choice follows from the algorithms themselves and costs the same at 4 or 4,096 ranks.
Transports with native collectives decide between those and this choice themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import algorithms
from .schedule import Collective, cost

CANDIDATES = ("tree", "rechd", "ring", "shuffle", "one_device")


@dataclass(frozen=True)
class CostModel:
    """Seconds per round, per byte moved, per byte reduced, per message. ``shared_memory``
    backends run every schedule tile by tile at the same memory traffic, so there the cost is
    the per-step and per-message bookkeeping: fewer steps and messages win."""

    latency: float = 5e-6
    seconds_per_byte: float = 1 / 5e9
    reduce_seconds_per_byte: float = 1 / 10e9
    message_overhead: float = 10e-6
    shared_memory: bool = False


def _bucket(nbytes: int) -> int:
    return max(nbytes, 1).bit_length()  # one decision per power of two


def _samples(size: int) -> list[int]:
    return sorted({0, size // 2, size - 1})


@lru_cache(maxsize=4096)
def _choose(collective: Collective, size: int, bucket: int, model: CostModel) -> str:
    if size == 1:  # nothing moves: the simplest algorithm that has this collective
        return "one_device" if algorithms.supports(collective, "one_device") else "shuffle"
    nbytes = 1 << (bucket - 1)
    best, best_cost = "ring", float("inf")
    for name in CANDIDATES:
        if not algorithms.supports(collective, name):
            continue
        if size > 64 and name in ("shuffle", "one_device"):
            continue  # one participant talks to all others: never the cheapest at scale
        plans = [algorithms.rank_plan(collective, name, size, r) for r in _samples(size)]
        if model.shared_memory:
            whole = algorithms.schedule(collective, name, size)
            estimate = sum(1 + len(s[1]) for s in whole.steps) * model.latency
        else:
            estimate = cost(plans, nbytes, model.latency, model.seconds_per_byte,
                            model.reduce_seconds_per_byte, model.message_overhead)
        if estimate < best_cost:
            best, best_cost = name, estimate
    return best


def choose(collective: Collective, size: int, nbytes: int, model: CostModel) -> str:
    """The canonical name of the cheapest algorithm for this call."""
    return _choose(collective, size, _bucket(nbytes), model)


# --- across nodes: links between groups are slower than inside them ---------------------------

TWO_LEVEL_CANDIDATES = ("ring/ring", "rechd/ring", "ring/rechd", "shuffle/ring", "tree/tree")


@dataclass(frozen=True)
class LinkModel:
    """Two cost models: between participants of one group (``intra``: shared memory) and
    across groups (``inter``: the network, whose link every member of a group shares)."""

    intra: CostModel = CostModel(latency=5e-6, seconds_per_byte=1 / 8e9)
    inter: CostModel = CostModel(latency=30e-6, seconds_per_byte=1 / 1.25e9)


def hierarchical_cost(plans, layout, nbytes: int, link: LinkModel) -> float:
    """Per round, a latency plus the busier of: the busiest participant's local traffic, and
    the busiest group's traffic over its link (what its members receive from other groups,
    added up: they share the link). ``plans``: a sample of participants, one per group position."""
    den = plans[0].den
    members = len(layout.groups[0]) if layout.uniform else max(len(g) for g in layout.groups)
    total = 0.0
    rounds: dict[int, list[float]] = {}
    for plan in plans:
        home = layout.group_of[plan.rank]
        for index, _, recvs in plan.rounds:
            local = remote = 0.0
            for _, srcs, lo, hi, _ in recvs:
                width = (hi - lo) / den * nbytes
                for q in srcs:
                    if layout.group_of[q] == home:
                        local += width
                    else:
                        remote += width
            slot = rounds.setdefault(index, [0.0, 0.0, 0.0])
            slot[0] = max(slot[0], local * link.intra.seconds_per_byte)
            slot[1] = max(slot[1], remote * members * link.inter.seconds_per_byte)
            slot[2] = max(slot[2], link.inter.latency if remote else link.intra.latency)
    for local, remote, latency in rounds.values():
        total += latency + max(local, remote)
    return total


@lru_cache(maxsize=1024)
def choose_across(collective: Collective, size: int, bucket: int, layout, link: LinkModel) -> str:
    """The cheapest flat or two-level algorithm over ``layout``'s groups (nodes)."""
    nbytes = 1 << (bucket - 1)
    best, best_cost = "ring", float("inf")
    sample = sorted({g[i] for g in layout.groups[:2] for i in (0, len(g) // 2, len(g) - 1)})
    names = [n for n in CANDIDATES if n not in ("shuffle", "one_device")]
    if layout.uniform and len(layout.groups) > 1:
        names += list(TWO_LEVEL_CANDIDATES)
    for name in names:
        if not algorithms.supports(collective, name):
            continue
        plans = [algorithms.rank_plan(collective, name, size, r, layout=layout) for r in sample]
        estimate = hierarchical_cost(plans, layout, nbytes, link)
        if estimate < best_cost:
            best, best_cost = name, estimate
    return best
