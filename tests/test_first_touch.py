"""Which steps of a rank's plan read the caller's input where it lies (first_touch.py).

The real plans never write part of a range before reading all of it, so the "mixed" path
(fill the fresh part first) is checked here on hand-made rounds; every real plan is checked
by simulating it: reading the input where the annotation says, the buffer elsewhere, must see
exactly what a copy of the input made first would have held.
"""

from __future__ import annotations

import pytest

from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.runtime.execute.first_touch import Fresh, annotate


def test_fresh_intervals():
    fresh = Fresh(10)
    assert fresh.state(0, 10) == "fresh"
    assert fresh.take(2, 4) == [(2, 4)]
    assert fresh.state(0, 10) == "mixed" and fresh.state(2, 4) == "written"
    assert fresh.state(4, 10) == "fresh"
    assert fresh.take(0, 10) == [(0, 2), (4, 10)]
    assert fresh.spans == [] and fresh.state(0, 1) == "written"


def test_mixed_ranges_are_filled_first():
    rounds = (
        (0, ((1, 0, 4, 0),), (((1,), 4, 8, False, 4),)),  # send [0,4) fresh; copy into [4,8)
        (1, ((1, 2, 6, 2),), (((1,), 6, 10, True, 6),)),  # send [2,6): [2,4) fresh -> fill
        (2, (), (((1,), 0, 2, True, 0),)),  # reduce into [0,2): still fresh
    )
    marked, last = annotate(rounds, 12)
    (_, s0, r0, f0), (_, s1, r1, f1), (_, s2, r2, f2) = marked
    assert s0 == ((1, 0, 4, 0, True),) and r0[0][5] is False and f0 == ()
    assert s1 == ((1, 2, 6, 2, False),)  # [2,4) fresh, [4,6) written: filled first
    assert r1[0][5] is False and f1 == ((2, 4), (8, 10))  # [6,8) written, [8,10) fresh
    assert r2[0][5] is True and f2 == ()  # [0,2) first written here, from the input
    assert last == ((10, 12),)


@pytest.mark.parametrize("collective", [Collective.ALL_REDUCE, Collective.REDUCE,
                                        Collective.REDUCE_SCATTER, Collective.BROADCAST])
def test_every_plan_reads_what_a_copy_would_hold(collective):
    """Simulate each rank's plan on labels: the buffer starts as "in" (the input) or
    "unset" (with the annotation); every read must see a value equal to the copied run's."""
    for name in algorithms.names_for(collective):
        for size in (2, 3, 4, 5, 8):
            for length in (1, 7, 64):
                for rank in range(size):
                    try:
                        plan = algorithms.rank_plan(collective, name, size, rank)
                    except ValueError:
                        continue
                    rounds = plan.offsets(length, 1)
                    marked, last = annotate(rounds, length)
                    copied = ["in"] * length
                    lazy = ["unset"] * length
                    for (index, sends, recvs), (_, msends, mrecvs, fills) in zip(rounds, marked):
                        for a, b in fills:
                            lazy[a:b] = ["in"] * (b - a)
                        for (_, a, b, _), (*_, from_input) in zip(sends, msends):
                            sent = ["in"] * (b - a) if from_input else lazy[a:b]
                            assert sent == copied[a:b], (name, size, rank, index, "send")
                        for (_, a, b, reduce, _), (*_, from_input) in zip(recvs, mrecvs):
                            if reduce:
                                base = ["in"] * (b - a) if from_input else lazy[a:b]
                                assert base == copied[a:b], (name, size, rank, index, "reduce")
                            mark = [f"r{index}"] * (b - a)
                            copied[a:b], lazy[a:b] = mark, list(mark)
                    for a, b in last:
                        lazy[a:b] = ["in"] * (b - a)
                    assert lazy == copied, (name, size, rank, length)
