"""Shuffle, parameter-server style (TensorFlow's "pscpu" / "psgpu").

The buffer is cut into ``g = shards`` shards (``g = n`` unless given); shard ``j`` has gather
participant ``j * n // g`` (``shards`` beyond ``n`` count as ``n``).

1. every participant sends shard ``j`` to its gather participant, which accumulates all
   ``n`` contributions in one n-ary step;
2. every gather participant sends its reduced shard back to everyone.

2 rounds; ``2 (n - 1) B`` bytes on the wire, spread over the ``g`` gather participants. With
``g = 1`` it is reduction to one device; with ``g = n`` it is the direct (all-to-all)
reduce-scatter and all-gather, which has the fewest rounds of the bandwidth-balanced
algorithms and wins when participants can talk to everyone at once (shared memory). Each
participant's plan has ``O(n)`` messages: it talks to everyone.
"""

from __future__ import annotations

from .base import (
    EMPTY,
    Groups,
    Layout,
    Ownership,
    Phase,
    block,
    cached_ownership,
    concat,
    gather_to_root,
    phase_of,
    scatter_to_blocks,
)
from .schedule import Collective

NAME = "shuffle"
COLLECTIVES: frozenset[Collective] = frozenset(Collective)
SHARDED = True


def uses_layout(layout: Layout) -> bool:
    return False


def _gathers(n: int, shards: int) -> int:
    # Like TensorFlow's ``aux_devices[:num_shards]``, asking for more gather participants than
    # there are uses them all.
    return min(shards, n) if shards and shards > 0 else n


def _ownership(n: int, g: int) -> Ownership:
    return Ownership(g, [(*block(j, g, g), j * n // g) for j in range(g)])


def reduce_phase(n: int, rank: int, shards: int) -> tuple[Phase, Ownership]:
    g = _gathers(n, shards)
    owners = cached_ownership(_ownership, n, g)
    others = tuple(p for p in range(n) if p != rank)
    recvs = [(rank, others, lo, hi, True) for lo, hi in owners.owned_by(rank)]
    sends = [(owner, lo, hi) for lo, hi, owner in owners.ranges if owner != rank]
    return phase_of(g, 1, [(0, sends, recvs)]), owners


def _back(n: int, rank: int, owners: Ownership) -> Phase:
    recvs = [(rank, (owner,), lo, hi, False) for lo, hi, owner in owners.ranges
             if owner != rank]
    sends = [(p, lo, hi) for lo, hi in owners.owned_by(rank) for p in range(n) if p != rank]
    return phase_of(owners.den, 1, [(0, sends, recvs)])


def phase(collective: Collective, size: int, rank: int, *, root: int = 0, shards: int = 0,
          groups: Groups | None = None) -> Phase:
    if size == 1:
        return EMPTY
    n = size
    if collective is Collective.GATHER:
        if rank == root:
            return phase_of(n, 1, [(0, [], [(root, (p,), p, p + 1, False)
                                            for p in range(n) if p != root])])
        return phase_of(n, 1, [(0, [(root, rank, rank + 1)], [])])
    if collective is Collective.SCATTER:
        if rank == root:
            return phase_of(n, 1, [(0, [(p, p, p + 1) for p in range(n) if p != root], [])])
        return phase_of(n, 1, [(0, [], [(rank, (root,), rank, rank + 1, False)])])
    if collective is Collective.ALL_TO_ALL:  # block (i, j) sits at position i * n + j
        sends = [(j, rank * n + j, rank * n + j + 1) for j in range(n) if j != rank]
        recvs = [(rank, (i,), i * n + rank, i * n + rank + 1, False) for i in range(n) if i != rank]
        return phase_of(n * n, 1, [(0, sends, recvs)])
    if collective is Collective.BROADCAST:
        if rank == root:
            return phase_of(1, 1, [(0, [(p, 0, 1) for p in range(n) if p != root], [])])
        return phase_of(1, 1, [(0, [], [(rank, (root,), 0, 1, False)])])
    if collective is Collective.ALL_GATHER:
        recvs = [(rank, (q,), q, q + 1, False) for q in range(n) if q != rank]
        sends = [(p, rank, rank + 1) for p in range(n) if p != rank]
        return phase_of(n, 1, [(0, sends, recvs)])
    reduced, owners = reduce_phase(n, rank, shards)
    if collective is Collective.ALL_REDUCE:
        return concat(reduced, _back(n, rank, owners))
    if collective is Collective.REDUCE:
        return concat(reduced, gather_to_root(owners, n, rank, root))
    return concat(reduced, scatter_to_blocks(owners, n, rank))
