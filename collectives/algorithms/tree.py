"""Binomial tree: reduce up to the root, broadcast back down.

Participants are numbered relative to the root (``v = (p - root) mod n``).

1. reduce, ``ceil(log2 n)`` rounds: in round ``k`` every ``v`` that is an odd multiple of
   ``2^k`` adds its whole buffer into ``v - 2^k``;
2. broadcast, the same rounds in reverse: ``v`` copies the result to ``v + 2^k``.

``2 ceil(log2 n)`` rounds, each moving the whole buffer: ``2 (n - 1) B`` bytes in all and
``ceil(log2 n) B`` into the root. Every participant handles at most one message per round, so
over real links it has the lowest latency for small buffers (one_device and shuffle have
fewer rounds but pile ``n - 1`` messages onto one participant); it loses on bandwidth as
buffers grow. All-gather gathers up the tree (a subtree's blocks are contiguous under root 0)
and broadcasts back.
"""

from __future__ import annotations

from .base import EMPTY, Groups, Layout, Ownership, Phase, concat, phase_of, scatter_to_blocks
from .schedule import Collective, Send, Step

NAME = "tree"
COLLECTIVES: frozenset[Collective] = frozenset(c for c in Collective if c is not Collective.ALL_TO_ALL)
SHARDED = False


def uses_layout(layout: Layout) -> bool:
    return False


def _levels(n: int) -> int:
    return (n - 1).bit_length()


def reduce_phase(n: int, rank: int, root: int) -> tuple[Phase, Ownership]:
    v = (rank - root) % n
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    for k in range(_levels(n)):
        step = 1 << k
        if v % (2 * step) == step:
            rounds.append((k, [((rank - step) % n, 0, 1)], []))
        elif v % (2 * step) == 0 and v + step < n:
            rounds.append((k, [], [(rank, ((rank + step) % n,), 0, 1, True)]))
    return phase_of(1, _levels(n), rounds), Ownership(1, [(0, 1, root)])


def broadcast_phase(n: int, rank: int, root: int, den: int = 1) -> Phase:
    """The tree's broadcast of the whole buffer (out of ``den`` positions) from ``root``."""
    v = (rank - root) % n
    levels = _levels(n)
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    for i, k in enumerate(reversed(range(levels))):
        step = 1 << k
        if v % (2 * step) == 0 and v + step < n:
            rounds.append((i, [((rank + step) % n, 0, den)], []))
        elif v % (2 * step) == step:
            rounds.append((i, [], [(rank, ((rank - step) % n,), 0, den, False)]))
    return phase_of(den, levels, rounds)


def _gather_up(n: int, rank: int) -> Phase:
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    for k in range(_levels(n)):
        step = 1 << k
        if rank % (2 * step) == step:
            rounds.append((k, [(rank - step, rank, min(rank + step, n))], []))
        elif rank % (2 * step) == 0 and rank + step < n:
            child = rank + step
            rounds.append((k, [], [(rank, (child,), child, min(child + step, n), False)]))
    return phase_of(n, _levels(n), rounds)


def _subtree(n: int, root: int, v: int, width: int) -> list[tuple[int, int]]:
    """The blocks of relative participants ``v .. v+width-1`` (absolute numbers wrap around the
    root): one or two ranges."""
    lo, hi = (root + v) % n, (root + v) % n + min(width, n - v)
    return [(lo, hi)] if hi <= n else [(lo, n), (0, hi - n)]


def _gather_to(n: int, rank: int, root: int, up: bool) -> Phase:
    """Gather up the tree to ``root`` (``up``), or scatter down it (its reverse): a subtree's
    blocks travel together, so every participant handles one message per round."""
    v = (rank - root) % n
    levels = _levels(n)
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    for k in range(levels):
        step = 1 << k
        index = k if up else levels - 1 - k
        if v % (2 * step) == step:  # the subtree of v (width step) and its parent v - step
            blocks = _subtree(n, root, v, step)
            peer = (rank - step) % n
            if up:
                rounds.append((index, [(peer, lo, hi) for lo, hi in blocks], []))
            else:
                rounds.append((index, [], [(rank, (peer,), lo, hi, False) for lo, hi in blocks]))
        elif v % (2 * step) == 0 and v + step < n:
            blocks = _subtree(n, root, v + step, step)
            peer = (rank + step) % n
            if up:
                rounds.append((index, [], [(rank, (peer,), lo, hi, False) for lo, hi in blocks]))
            else:
                rounds.append((index, [(peer, lo, hi) for lo, hi in blocks], []))
    return phase_of(n, levels, rounds)


def phase(collective: Collective, size: int, rank: int, *, root: int = 0, shards: int = 0,
          groups: Groups | None = None) -> Phase:
    if size == 1:
        return EMPTY
    if collective in (Collective.GATHER, Collective.SCATTER):
        return _gather_to(size, rank, root, up=collective is Collective.GATHER)
    if collective is Collective.BROADCAST:
        return broadcast_phase(size, rank, root)
    if collective is Collective.ALL_GATHER:
        return concat(_gather_up(size, rank), broadcast_phase(size, rank, 0))
    reduce_root = 0 if collective is Collective.REDUCE_SCATTER else root
    reduced, owners = reduce_phase(size, rank, reduce_root)
    if collective is Collective.ALL_REDUCE:
        return concat(reduced, broadcast_phase(size, rank, root))
    if collective is Collective.REDUCE:
        return reduced
    return concat(reduced, scatter_to_blocks(owners, size, rank))
