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
mid sizes: bandwidth near the ring's with ``log`` instead of linear latency.
"""

from __future__ import annotations

from fractions import Fraction

from ..schedule import ONE, ZERO, Collective, Schedule, concat, copy_step, reduce_step


def _split(n: int) -> tuple[int, int]:
    m = 1 << (n.bit_length() - 1)
    return m, n - m


def reduce_phase(n: int, shards: int = 1):
    m, extra = _split(n)
    rounds = []
    if extra:
        rounds.append(tuple(reduce_step(i, [m + i], ZERO, ONE) for i in range(extra)))
    ranges = {d: (ZERO, ONE) for d in range(m)}
    span = 1
    while span < m:
        steps = []
        for d in range(m):
            if d % (2 * span) < span:
                lo, hi = ranges[d]
                mid = (lo + hi) / 2
                steps.append(reduce_step(d, [d + span], lo, mid))
                steps.append(reduce_step(d + span, [d], mid, hi))
                ranges[d], ranges[d + span] = (lo, mid), (mid, hi)
        rounds.append(tuple(steps))
        span *= 2
    return rounds, sorted((lo, hi, d) for d, (lo, hi) in ranges.items())


def _doubling(n: int):
    """Rounds that spread the halving's results back to everyone."""
    m, extra = _split(n)
    _, owners = reduce_phase(n)
    held = {d: (lo, hi) for lo, hi, d in owners}
    rounds = []
    span = m // 2
    while span >= 1:
        steps = []
        for d in range(m):
            if d % (2 * span) < span:
                (alo, ahi), (blo, bhi) = held[d], held[d + span]
                steps.append(copy_step(d, d + span, blo, bhi))
                steps.append(copy_step(d + span, d, alo, ahi))
                held[d] = held[d + span] = (min(alo, blo), max(ahi, bhi))
        rounds.append(tuple(steps))
        span //= 2
    if extra:
        rounds.append(tuple(copy_step(m + i, i, ZERO, ONE) for i in range(extra)))
    return rounds


def all_reduce(n: int, shards: int = 1) -> Schedule:
    rounds, _ = reduce_phase(n)
    return concat("rechd", Collective.ALL_REDUCE, n, rounds, _doubling(n))


def all_gather(n: int, shards: int = 1) -> Schedule:
    """Recursive doubling on blocks; the ``x`` extra participants fold in and out as above."""
    m, extra = _split(n)
    held: dict[int, list[tuple[Fraction, Fraction]]] = {
        d: [(Fraction(d, n), Fraction(d + 1, n))] for d in range(m)}
    rounds = []
    if extra:
        rounds.append(tuple(copy_step(i, m + i, Fraction(m + i, n), Fraction(m + i + 1, n))
                            for i in range(extra)))
        for i in range(extra):
            held[i].append((Fraction(m + i, n), Fraction(m + i + 1, n)))
    span = 1
    while span < m:
        steps = []
        for d in range(m):
            if d % (2 * span) < span:
                a, b = held[d], held[d + span]
                steps += [copy_step(d, d + span, lo, hi) for lo, hi in b]
                steps += [copy_step(d + span, d, lo, hi) for lo, hi in a]
                held[d] = held[d + span] = sorted(a + b)
        rounds.append(tuple(steps))
        span *= 2
    if extra:
        own = {i: (Fraction(m + i, n), Fraction(m + i + 1, n)) for i in range(extra)}
        rounds.append(tuple(copy_step(m + i, i, lo, hi) for i in range(extra)
                            for lo, hi in held[i] if (lo, hi) != own[i]))
    return concat("rechd", Collective.ALL_GATHER, n, rounds)
