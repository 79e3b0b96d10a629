"""Recursive halving-doubling (Rabenseifner; TensorFlow's "rechd"), for any ``n``.

Let ``m`` be the largest power of two ``<= n`` and ``x = n - m``.

0. if ``x > 0``: participant ``m + i`` adds its whole buffer into participant ``i``
   (``i < x``), leaving ``m`` active participants;
1. halving, ``log2 m`` rounds with partner distance 1, 2, 4, ...: partners split the range
   they share, the lower one keeps the first half, each adds the partner's copy of the half
   it keeps. Participant ``d`` ends holding the total of shard ``bit_reverse(d)``, as in
   TensorFlow;
2. doubling, the same pairs in reverse: partners swap their ranges;
3. if ``x > 0``: participant ``i`` copies the result back to ``m + i``.

``2 log2 m`` rounds (+2 when ``n`` is not a power of two); each active participant sends and
receives ``2 (m - 1) B / m`` bytes, plus ``B`` each way for the folded ones. Unlike
TensorFlow's it needs neither a power-of-two count nor a length divisible by ``m``. It wins at
mid sizes: bandwidth near the ring's with ``log`` instead of linear latency. All-gather is
recursive doubling on blocks (the folded participants' blocks ride with their partners'), and
a participant's plan is ``O(log n)`` steps for every collective.
"""

from __future__ import annotations

from .base import (
    EMPTY,
    Groups,
    Layout,
    Ownership,
    Phase,
    cached_ownership,
    concat,
    gather_to_root,
    phase_of,
    scatter_to_blocks,
)
from .schedule import Collective, Send, Step

NAME = "rechd"
COLLECTIVES: frozenset[Collective] = frozenset({
    Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER})
SHARDED = False


def uses_layout(layout: Layout) -> bool:
    return False


def _split(n: int) -> tuple[int, int]:
    m = 1 << (n.bit_length() - 1)
    return m, n - m


def _held(d: int, k: int, m: int) -> tuple[int, int]:
    """The range (out of ``m``) participant ``d < m`` works on after ``k`` halving rounds."""
    lo, width = 0, m
    for j in range(k):
        width //= 2
        if d >> j & 1:
            lo += width
    return lo, lo + width


def reduce_phase(n: int, rank: int) -> Phase:
    m, extra = _split(n)
    levels = m.bit_length() - 1
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    base = 0
    if extra:
        if rank < extra:
            rounds.append((0, [], [(rank, (m + rank,), 0, m, True)]))
        elif rank >= m:
            rounds.append((0, [(rank - m, 0, m)], []))
        base = 1
    if rank < m:
        for j in range(levels):
            span = 1 << j
            lo, hi = _held(rank, j, m)
            mid = (lo + hi) // 2
            if rank & span:
                partner, keep, give = rank - span, (mid, hi), (lo, mid)
            else:
                partner, keep, give = rank + span, (lo, mid), (mid, hi)
            rounds.append((base + j, [(partner, *give)], [(rank, (partner,), *keep, True)]))
    return phase_of(m, base + levels, rounds)


def _ownership(n: int) -> Ownership:
    m, _ = _split(n)
    levels = m.bit_length() - 1
    return Ownership(m, [(*_held(d, levels, m), d) for d in range(m)])


def _doubling(n: int, rank: int) -> Phase:
    """Rounds that spread the halving's results back to everyone."""
    m, extra = _split(n)
    levels = m.bit_length() - 1
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    if rank < m:
        for i, j in enumerate(reversed(range(levels))):
            partner = rank ^ (1 << j)
            rounds.append((i, [(partner, *_held(rank, j + 1, m))],
                           [(rank, (partner,), *_held(partner, j + 1, m), False)]))
    if extra:
        if rank < extra:
            rounds.append((levels, [(m + rank, 0, m)], []))
        elif rank >= m:
            rounds.append((levels, [], [(rank, (rank - m,), 0, m, False)]))
    return phase_of(m, levels + (1 if extra else 0), rounds)


def _blocks_held(d: int, k: int, m: int, extra: int) -> list[tuple[int, int]]:
    """Blocks (out of ``n``) that ``d < m`` holds after the doubling rounds of span < 2^k:
    those of its aligned group of ``2^k`` participants, and of their folded partners."""
    lo, hi = d >> k << k, (d >> k << k) + (1 << k)
    held = [(lo, hi)]
    if lo < extra:
        held.append((m + lo, m + min(hi, extra)))
    return held


def _all_gather(n: int, rank: int) -> Phase:
    m, extra = _split(n)
    levels = m.bit_length() - 1
    rounds: list[tuple[int, list[Send], list[Step]]] = []
    base = 0
    if extra:
        if rank < extra:
            rounds.append((0, [], [(rank, (m + rank,), m + rank, m + rank + 1, False)]))
        elif rank >= m:
            rounds.append((0, [(rank - m, rank, rank + 1)], []))
        base = 1
    if rank < m:
        for k in range(levels):
            partner = rank ^ (1 << k)
            sends = [(partner, lo, hi) for lo, hi in _blocks_held(rank, k, m, extra)]
            recvs = [(rank, (partner,), lo, hi, False)
                     for lo, hi in _blocks_held(partner, k, m, extra)]
            rounds.append((base + k, sends, recvs))
    if extra:
        last = base + levels
        if rank < extra:
            rounds.append((last, [(m + rank, 0, m + rank), (m + rank, m + rank + 1, n)],
                           []))
        elif rank >= m:
            mine = [(0, rank), (rank + 1, n)]
            rounds.append((last, [], [(rank, (rank - m,), lo, hi, False)
                                      for lo, hi in mine if lo < hi]))
    # the folded participant's own block splits what it receives into two ranges
    return phase_of(n, base + levels + (1 if extra else 0), [
        (i, [s for s in sends if s[1] < s[2]], recvs) for i, sends, recvs in rounds])


def phase(collective: Collective, size: int, rank: int, *, root: int = 0, shards: int = 0,
          groups: Groups | None = None) -> Phase:
    if size == 1:
        return EMPTY
    if collective is Collective.BROADCAST:
        raise ValueError("rechd has no broadcast")
    if collective is Collective.ALL_GATHER:
        return _all_gather(size, rank)
    reduced = reduce_phase(size, rank)
    if collective is Collective.ALL_REDUCE:
        return concat(reduced, _doubling(size, rank))
    owners = cached_ownership(_ownership, size)
    if collective is Collective.REDUCE:
        return concat(reduced, gather_to_root(owners, size, rank, root))
    return concat(reduced, scatter_to_blocks(owners, size, rank))
