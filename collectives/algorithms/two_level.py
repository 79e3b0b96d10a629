"""Two-level (hierarchical) composition "A/B": A inside each group, B across groups.

Groups are sets of participants that talk cheaply to each other (the devices of one worker,
the ranks of one node). With ``G`` groups, the first member of each being its leader:

1. inside every group at once, algorithm A reduces the group's buffers onto the leader;
2. the ``G`` leaders all-reduce the group totals with algorithm B (``shards`` apply to B);
3. inside every group at once, A's broadcast hands the leader's result to the members.

Rounds and bytes are A's reduce + B's all-reduce over ``G`` + A's broadcast; only ``G``
participants cross the slow level, each with its whole buffer. This is TensorFlow's
"nccl/xring", "nccl/rechd", "nccl/pscpu" and "pscpu/pscpu". It wins when the link between
groups is much slower than inside them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..schedule import Collective, Schedule, concat, gather_to_root, merge_concurrent, relabel
from . import tree


def reduce_to_leader(module, size: int):
    rounds, owners = module.reduce_phase(size)  # every reduce phase defaults to root 0
    return list(rounds) + gather_to_root(owners, 0)


def broadcast_from_leader(module, size: int):
    # rechd has no broadcast of its own; the tree's is the latency-optimal stand-in.
    source = module if hasattr(module, "broadcast") else tree
    return list(source.broadcast(size, 0).rounds) if size > 1 else []


def all_reduce(inner, outer, groups: Sequence[Sequence[int]], shards: int, name: str) -> Schedule:
    n = sum(len(g) for g in groups)
    leaders = [g[0] for g in groups]
    up = merge_concurrent(*(relabel(reduce_to_leader(inner, len(g)), g) for g in groups))
    across = relabel(outer.all_reduce(len(groups), shards).rounds, leaders) if len(groups) > 1 else []
    down = merge_concurrent(*(relabel(broadcast_from_leader(inner, len(g)), g) for g in groups))
    return concat(name, Collective.ALL_REDUCE, n, up, across, down)
