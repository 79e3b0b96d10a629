"""Shuffle, parameter-server style (TensorFlow's "pscpu" / "psgpu").

The buffer is cut into ``g = shards`` shards (``g = n`` unless given); shard ``j`` has gather
participant ``j * n // g`` (``shards`` beyond ``n`` count as ``n``).

1. every participant sends shard ``j`` to its gather participant, which accumulates all
   ``n`` contributions in one n-ary step;
2. every gather participant sends its reduced shard back to everyone.

2 rounds; ``2 (n - 1) B`` bytes on the wire, spread over the ``g`` gather participants. With
``g = 1`` it is reduction to one device; with ``g = n`` it is the direct (all-to-all)
reduce-scatter and all-gather, which has the fewest rounds of the bandwidth-balanced
algorithms and wins when participants can talk to everyone at once (shared memory).
"""

from __future__ import annotations

from fractions import Fraction

from ..schedule import Collective, Schedule, block, concat, copy_step, reduce_step


def _gathers(n: int, shards: int) -> int:
    # Like TensorFlow's ``aux_devices[:num_shards]``, asking for more gather participants than
    # there are uses them all.
    return min(shards, n) if shards and shards > 0 else n


def reduce_phase(n: int, shards: int = 0):
    g = _gathers(n, shards)
    owners = [(*block(j, g), j * n // g) for j in range(g)]
    rounds = [tuple(reduce_step(owner, [p for p in range(n) if p != owner], lo, hi)
                    for lo, hi, owner in owners if n > 1)]
    return rounds, owners


def all_reduce(n: int, shards: int = 0) -> Schedule:
    rounds, owners = reduce_phase(n, shards)
    back = [tuple(copy_step(p, owner, lo, hi) for lo, hi, owner in owners
                  for p in range(n) if p != owner)]
    return concat("shuffle", Collective.ALL_REDUCE, n, rounds, back)


def all_gather(n: int, shards: int = 0) -> Schedule:
    rounds = [tuple(copy_step(p, q, Fraction(q, n), Fraction(q + 1, n))
                    for p in range(n) for q in range(n) if p != q)]
    return concat("shuffle", Collective.ALL_GATHER, n, rounds)


def broadcast(n: int, root: int, shards: int = 0) -> Schedule:
    rounds = [tuple(copy_step(p, root, Fraction(0), Fraction(1)) for p in range(n) if p != root)]
    return concat("shuffle", Collective.BROADCAST, n, rounds, root=root)
