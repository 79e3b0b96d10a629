"""Reduction to one device (TensorFlow's ReductionToOneDevice).

Steps, for ``n`` participants and a buffer of ``B`` bytes:

1. every participant sends its whole buffer to the root, which accumulates all ``n``
   contributions in one n-ary step (the multi-device API lets ``accumulation_fn`` do it);
2. the root sends the result back to every other participant.

2 rounds; ``2 (n - 1) B`` bytes on the wire, all of them through the root. It wins when the
participants share memory (logical CPU devices) or for tiny buffers on few participants;
elsewhere the root's link is the bottleneck. The root's plan has ``n - 1`` messages per round;
every other participant's has one.
"""

from __future__ import annotations

from .base import EMPTY, Groups, Layout, Ownership, Phase, block, concat, phase_of
from .schedule import Collective, Send, Step

NAME = "one_device"
COLLECTIVES: frozenset[Collective] = frozenset({
    Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.REDUCE_SCATTER,
    Collective.ALL_GATHER})
SHARDED = False


def uses_layout(layout: Layout) -> bool:
    return False


def reduce_phase(n: int, rank: int, root: int) -> tuple[Phase, Ownership]:
    if rank == root:
        others = tuple(p for p in range(n) if p != root)
        rounds: list[tuple[int, list[Send], list[Step]]] = [(0, [], [(root, others, 0, 1, True)])]
    else:
        rounds = [(0, [(root, 0, 1)], [])]
    return phase_of(1, 1, rounds), Ownership(1, [(0, 1, root)])


def broadcast_phase(n: int, rank: int, root: int, den: int = 1, lo: int = 0, hi: int = 1) -> Phase:
    """The root sends ``[lo, hi)`` (out of ``den``) to every other participant in one round."""
    if rank == root:
        return phase_of(den, 1, [(0, [(p, lo, hi) for p in range(n) if p != root], [])])
    return phase_of(den, 1, [(0, [], [(rank, (root,), lo, hi, False)])])


def phase(collective: Collective, size: int, rank: int, *, root: int = 0, shards: int = 0,
          groups: Groups | None = None) -> Phase:
    if size == 1:
        return EMPTY
    if collective is Collective.BROADCAST:
        return broadcast_phase(size, rank, root)
    if collective is Collective.ALL_GATHER:
        # participant 0 collects every block, then sends the whole buffer back out
        if rank == 0:
            gather: list[tuple[int, list[Send], list[Step]]] = [
                (0, [], [(0, (q,), *block(q, size, size), False) for q in range(1, size)])]
        else:
            gather = [(0, [(0, *block(rank, size, size))], [])]
        return concat(phase_of(size, 1, gather), broadcast_phase(size, rank, 0))
    reduce_root = 0 if collective is Collective.REDUCE_SCATTER else root
    reduced, owners = reduce_phase(size, rank, reduce_root)
    if collective is Collective.ALL_REDUCE:
        return concat(reduced, broadcast_phase(size, rank, root))
    if collective is Collective.REDUCE:
        return reduced
    from .base import scatter_to_blocks

    return concat(reduced, scatter_to_blocks(owners, size, rank))
