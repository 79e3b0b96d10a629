"""Binomial tree: reduce up to the root, broadcast back down.

Participants are numbered relative to the root (``v = (p - root) mod n``).

1. reduce, ``ceil(log2 n)`` rounds: in round ``k`` every ``v`` that is an odd multiple of
   ``2^k`` adds its whole buffer into ``v - 2^k``;
2. broadcast, the same rounds in reverse: ``v`` copies the result to ``v + 2^k``.

``2 ceil(log2 n)`` rounds, each moving the whole buffer: ``2 (n - 1) B`` bytes in all and
``ceil(log2 n) B`` into the root. Every participant handles at most one message per round, so
over real links it has the lowest latency for small buffers (one_device and shuffle have
fewer rounds but pile ``n - 1`` messages onto one participant); it loses on bandwidth as
buffers grow.
"""

from __future__ import annotations

from fractions import Fraction

from ..schedule import ONE, ZERO, Collective, Schedule, concat, copy_step, reduce_step


def _levels(n: int) -> int:
    return (n - 1).bit_length()


def reduce_phase(n: int, root: int = 0):
    rounds = []
    for k in range(_levels(n)):
        step = 1 << k
        rounds.append(tuple(
            reduce_step((v - step + root) % n, [(v + root) % n], ZERO, ONE)
            for v in range(n) if v % (2 * step) == step))
    return rounds, [(ZERO, ONE, root)]


def broadcast_rounds(n: int, root: int = 0):
    rounds = []
    for k in reversed(range(_levels(n))):
        step = 1 << k
        rounds.append(tuple(
            copy_step((v + step + root) % n, (v + root) % n, ZERO, ONE)
            for v in range(n) if v % (2 * step) == 0 and v + step < n))
    return rounds


def all_reduce(n: int, shards: int = 1) -> Schedule:
    rounds, _ = reduce_phase(n)
    return concat("tree", Collective.ALL_REDUCE, n, rounds, broadcast_rounds(n))


def broadcast(n: int, root: int, shards: int = 1) -> Schedule:
    return concat("tree", Collective.BROADCAST, n, broadcast_rounds(n, root), root=root)


def all_gather(n: int, shards: int = 1) -> Schedule:
    """Gather up the tree (a subtree's blocks are contiguous under root 0), then broadcast."""
    rounds = []
    for k in range(_levels(n)):
        step = 1 << k
        rounds.append(tuple(
            copy_step(v - step, v, Fraction(v, n), Fraction(min(v + step, n), n))
            for v in range(n) if v % (2 * step) == step))
    return concat("tree", Collective.ALL_GATHER, n, rounds, broadcast_rounds(n))
