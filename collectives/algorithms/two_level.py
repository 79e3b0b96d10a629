"""Two-level (hierarchical) composition "A/B": A inside each group, B across groups.

Groups are sets of participants that talk cheaply to each other (the devices of one worker,
the ranks of one node). TensorFlow's "nccl/xring", "nccl/rechd", "nccl/pscpu" and
"pscpu/pscpu" are such compositions. With ``G`` groups of ``L`` participants each:

1. inside every group at once, A reduce-scatters the group's buffers: local participant
   ``i`` ends with the group's total of shard ``i`` (``1/L`` of the buffer);
2. across groups, the ``i``-th participants of all groups all-reduce shard ``i`` with B, all
   ``L`` shards at once (``shards`` apply to B);
3. inside every group at once, A all-gathers the shards.

Only ``1/L`` of the buffer leaves each participant across the slow level, so each group sends
``2 (G - 1) B / G`` bytes over its link in all: the minimum, spread over all of its members
(not funnelled through one leader). Reduce ends with the root's group gathering the shards to
the root; reduce-scatter with each group handing its members their blocks.

When groups differ in size, the classic form runs instead: A reduces each group onto its first
member (the leader), the leaders all-reduce with B, and A broadcasts back inside each group.
"""

from __future__ import annotations

from functools import lru_cache
from math import lcm

from . import tree
from .base import (
    AlgorithmModule,
    Layout,
    Ownership,
    Phase,
    block,
    concat,
    embedded,
    gather_to_root,
    phase_of,
    rescaled,
)
from .schedule import Collective

REDUCING = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})


def phase(inner: AlgorithmModule, outer: AlgorithmModule, collective: Collective, size: int,
          rank: int, *, root: int = 0, shards: int = 0, layout: Layout | None = None) -> Phase:
    """Participant ``rank``'s rounds of ``collective`` by "inner/outer" over ``layout``."""
    if collective not in REDUCING:
        raise ValueError(f"two-level algorithms have no {collective.value}")
    layout = layout or Layout([range(size)])
    if layout.uniform:
        return _sharded(inner, outer, collective, layout, rank, root, shards)
    return _through_leaders(inner, outer, collective, layout, rank, root, shards)


def _inside(inner: AlgorithmModule, collective: Collective, members, i: int, **kw) -> Phase:
    local = inner.phase(collective, len(members), i, **kw)
    return embedded(local, members, 0, 1, 1)


def _sharded(inner, outer, collective, layout: Layout, rank, root, shards) -> Phase:
    g, i = layout.group_of[rank], layout.local_of[rank]
    members, L, G = layout.groups[g], layout.uniform, len(layout.groups)
    peers = [grp[i] for grp in layout.groups]  # the i-th participant of every group
    up = _inside(inner, Collective.REDUCE_SCATTER, members, i)
    if collective is Collective.ALL_REDUCE:
        across = outer.phase(Collective.ALL_REDUCE, G, g, shards=shards)
        down = _inside(inner, Collective.ALL_GATHER, members, i)
        return concat(up, embedded(across, peers, i, i + 1, L), down)
    if collective is Collective.REDUCE:
        home = layout.group_of[root]
        across = outer.phase(Collective.REDUCE, G, g, root=home, shards=shards)
        owners = Ownership(L, [(j, j + 1, p) for j, p in enumerate(layout.groups[home])])
        down = gather_to_root(owners, layout.size, rank, root)
        return concat(up, embedded(across, peers, i, i + 1, L), down)
    across = outer.phase(Collective.ALL_REDUCE, G, g, shards=shards)
    return concat(up, embedded(across, peers, i, i + 1, L), _blocks_in_group(layout, rank))


def _blocks_in_group(layout: Layout, rank: int) -> Phase:
    """Each participant takes its block (of ``n``) from the members of its own group, whose
    ``i``-th holds the total of shard ``i`` (of ``L``)."""
    n, L = layout.size, layout.uniform
    den = n * L
    members = layout.groups[layout.group_of[rank]]
    i = layout.local_of[rank]
    lo, hi = block(rank, n, den)
    recvs = []
    for j in range(lo * L // den, min(L, -(-hi * L // den))):
        a, b = max(lo, j * n), min(hi, (j + 1) * n)
        if a < b and members[j] != rank:
            recvs.append((rank, (members[j],), a, b, False))
    sends = []
    for q in members:
        a, b = max(i * n, q * L), min((i + 1) * n, (q + 1) * L)
        if a < b and q != rank:
            sends.append((q, a, b))
    return phase_of(den, 1, [(0, sends, recvs)])


@lru_cache(maxsize=256)
def _shape_inside(inner: AlgorithmModule, collective: Collective, size: int) -> tuple[int, int]:
    """``(rounds, den)`` of A over a group of ``size``: groups of other sizes wait for the
    longest, and every participant's positions must share one ``den``."""
    local = inner.phase(collective, size, 0)
    return local.count, local.den


def _widest(inner: AlgorithmModule, collective: Collective, local: Phase, sizes) -> Phase:
    shapes = [_shape_inside(inner, collective, s) for s in sizes]
    den = lcm(*(d for _, d in shapes))
    return rescaled(local, den)._replace(count=max(c for c, _ in shapes))


def _through_leaders(inner, outer, collective, layout: Layout, rank, root, shards) -> Phase:
    g, i = layout.group_of[rank], layout.local_of[rank]
    members = layout.groups[g]
    leaders = [grp[0] for grp in layout.groups]
    sizes = {len(grp) for grp in layout.groups}
    up = _widest(inner, Collective.REDUCE, _inside(inner, Collective.REDUCE, members, i, root=0),
                 sizes)
    if collective is Collective.ALL_REDUCE:
        across = outer.phase(Collective.ALL_REDUCE, len(leaders), g, shards=shards)
    elif collective is Collective.REDUCE:
        across = outer.phase(Collective.REDUCE, len(leaders), g, root=layout.group_of[root],
                             shards=shards)
    else:
        across = outer.phase(Collective.ALL_REDUCE, len(leaders), g, shards=shards)
    across = embedded(across, leaders, 0, 1, 1) if i == 0 else across._replace(rounds=())
    if collective is Collective.ALL_REDUCE:
        source: AlgorithmModule = inner if Collective.BROADCAST in inner.COLLECTIVES else tree
        down = _widest(source, Collective.BROADCAST,
                       _inside(source, Collective.BROADCAST, members, i, root=0), sizes)
    elif collective is Collective.REDUCE:
        leader = layout.groups[layout.group_of[root]][0]
        owners = Ownership(1, [(0, 1, leader)])
        down = gather_to_root(owners, layout.size, rank, root)
    else:
        n = layout.size
        if i == 0:
            sends = [(q, q, q + 1) for q in members[1:]]
            down = phase_of(n, 1, [(0, sends, [])])
        else:
            down = phase_of(n, 1, [(0, [], [(rank, (members[0],), rank, rank + 1, False)])])
    return concat(up, across, down)
