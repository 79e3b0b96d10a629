"""Reduction to one device (TensorFlow's ReductionToOneDevice).

Steps, for ``n`` participants and a buffer of ``B`` bytes:

1. every participant sends its whole buffer to the root, which accumulates all ``n``
   contributions in one n-ary step (the multi-device API lets ``accumulation_fn`` do it);
2. the root sends the result back to every other participant.

2 rounds; ``2 (n - 1) B`` bytes on the wire, all of them through the root. It wins when the
participants share memory (logical CPU devices) or for tiny buffers on few participants;
elsewhere the root's link is the bottleneck.
"""

from __future__ import annotations

from ..schedule import ONE, ZERO, Collective, Schedule, block, concat, copy_step, reduce_step


def reduce_phase(n: int, root: int = 0):
    others = [p for p in range(n) if p != root]
    rounds = [(reduce_step(root, others, ZERO, ONE),)] if others else []
    return rounds, [(ZERO, ONE, root)]


def broadcast_rounds(n: int, root: int = 0):
    return [tuple(copy_step(p, root, ZERO, ONE) for p in range(n) if p != root)]


def all_reduce(n: int, shards: int = 1) -> Schedule:
    rounds, _ = reduce_phase(n)
    return concat("one_device", Collective.ALL_REDUCE, n, rounds, broadcast_rounds(n))


def broadcast(n: int, root: int, shards: int = 1) -> Schedule:
    return concat("one_device", Collective.BROADCAST, n, broadcast_rounds(n, root), root=root)


def all_gather(n: int, shards: int = 1) -> Schedule:
    gather = [tuple(copy_step(0, q, *block(q, n)) for q in range(1, n))]
    return concat("one_device", Collective.ALL_GATHER, n, gather, broadcast_rounds(n))
