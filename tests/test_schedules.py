"""Every algorithm's schedule is proved correct for 1..64 participants; the checker has teeth."""

from __future__ import annotations

from fractions import Fraction

import pytest

from collectives import algorithms
from collectives.algorithms.ring import ring_permutations
from collectives.schedule import (
    Collective,
    Schedule,
    ScheduleError,
    check,
    copy_step,
    element_ranges,
    reduce_step,
)

BASE = list(algorithms.MODULES)


@pytest.mark.parametrize("collective, name", [
    (c, name) for c in Collective for name in BASE if algorithms.supports(c, name)],
    ids=lambda v: getattr(v, "value", v))
def test_every_schedule_is_correct_for_1_to_64(collective, name):
    rooted = collective in (Collective.REDUCE, Collective.BROADCAST)
    for n in range(1, 65):
        for root in sorted({0, n - 1, n // 2}) if rooted else [0]:
            check(algorithms.build(collective, name, n, root=root))


@pytest.mark.parametrize("name", ["ring", "shuffle"])
@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_shards(name, shards):
    for n in range(max(shards, 1), 20):
        check(algorithms.build(Collective.ALL_REDUCE, name, n, shards=shards))
        check(algorithms.build(Collective.REDUCE_SCATTER, name, n, shards=shards))


@pytest.mark.parametrize("name", ["pscpu/pscpu", "ring/ring", "tree/rechd", "rechd/shuffle",
                                  "one_device/tree", "shuffle/ring"])
@pytest.mark.parametrize("collective", [Collective.ALL_REDUCE, Collective.REDUCE,
                                        Collective.REDUCE_SCATTER], ids=lambda c: c.value)
def test_two_level(name, collective):
    canonical = algorithms.canonical(name)
    for n in range(1, 17):
        for size in (1, 2, 3, 4):
            groups = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
            for root in sorted({0, n - 1}):
                check(algorithms.build(collective, canonical, n, root=root, shards=2 if n > 3 else 1,
                                       groups=groups))


def _bad(rounds, n=2, collective=Collective.ALL_REDUCE):
    return Schedule("bad", collective, n, tuple(tuple(r) for r in rounds))


@pytest.mark.parametrize("schedule, complaint", [
    (_bad([[reduce_step(0, [1], 0, 1)]]), "participant 1 ends with contributions"),
    (_bad([[reduce_step(0, [1], 0, 1)], [reduce_step(0, [1], 0, 1)],
           [copy_step(1, 0, 0, 1)]]), r"\(0, 1, 1\)"),
    (_bad([[reduce_step(0, [1], 0, 1), copy_step(1, 0, 0, 1)]]), "reads and writes"),
    (_bad([[reduce_step(0, [1], 0, Fraction(1, 2)), reduce_step(1, [0], Fraction(1, 2), 1)],
           [copy_step(1, 0, 0, Fraction(1, 2))]]), "ends with contributions"),
    (_bad([[reduce_step(0, [1], 0, 1), reduce_step(1, [0], 0, 1)]]), "reads and writes"),
    (_bad([[reduce_step(2, [1], 0, 1)]]), "names participant 2"),
    (_bad([[copy_step(0, 1, 0, 1)]], collective=Collective.BROADCAST), "undefined"),
])
def test_checker_rejects(schedule, complaint):
    with pytest.raises(ScheduleError, match=complaint):
        check(schedule)


def test_checker_demands_one_computed_value_everywhere():
    # Right contributions everywhere, but participant 1 recomputes its half instead of
    # receiving participant 0's: two computations of one total need not round alike.
    half = Fraction(1, 2)
    rounds = [[reduce_step(0, [1], 0, half), reduce_step(1, [0], half, 1)],
              [copy_step(1, 0, 0, half), copy_step(0, 1, half, 1)],
              [reduce_step(1, [], 0, half)]]
    check(_bad(rounds[:2]))  # the honest schedule passes
    with pytest.raises(ScheduleError, match="bitwise identical"):
        check(_bad(rounds))


def test_tensorflow_ring_permutations():
    assert ring_permutations(1, 0, []) == ([], [])
    assert ring_permutations(1, 1, [0]) == ([[0]], [[0]])
    assert ring_permutations(2, 1, [0, 1, 2]) == ([[5, 0, 1, 2, 3, 4]], [[0, 1, 2, 3, 4, 5]])
    assert ring_permutations(1, 2, [0, 1, 2, 3]) == ([[3, 0, 1, 2], [3, 0, 1, 2]],
                                                     [[0, 1, 2, 3], [2, 3, 0, 1]])
    assert ring_permutations(1, 4, [0, 1, 2, 3]) == (
        [[3, 0, 1, 2]] * 4, [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]])
    assert ring_permutations(2, 2, [0, 1, 2, 3]) == (
        [[7, 0, 1, 2, 3, 4, 5, 6], [3, 0, 5, 2, 7, 4, 1, 6]],
        [[0, 1, 2, 3, 4, 5, 6, 7], [2, 3, 0, 1, 6, 7, 4, 5]])
    assert ring_permutations(2, 2, [0, 3, 2, 1]) == (
        [[5, 2, 3, 0, 1, 6, 7, 4], [1, 2, 7, 0, 5, 6, 3, 4]],
        [[0, 3, 2, 1, 4, 7, 6, 5], [2, 1, 0, 3, 6, 5, 4, 7]])
    with pytest.raises(ValueError, match="num_subchunks 3 must be <= num_gpus 2"):
        ring_permutations(1, 3, [0, 1])


def test_ring_rounds_follow_tensorflow_worked_example():
    # 1 worker, 3 devices: tick 0 has d0 reduce segment 1 from d2, d1 segment 2 from d0, ...
    schedule = algorithms.build(Collective.ALL_REDUCE, "ring", 3)
    third = Fraction(1, 3)
    first = {(s.dst, s.srcs[0], s.lo) for s in schedule.rounds[0]}
    assert first == {(0, 2, third), (1, 0, 2 * third), (2, 1, Fraction(0))}
    assert len(schedule.rounds) == 4 and schedule.wire_fraction() == 4


@pytest.mark.parametrize("length, pieces, chunk, pad", [
    (16, 8, 2, 0), (10, 4, 3, 2), (7, 6, 2, 5), (1, 2, 1, 1), (91, 16, 6, 5), (0, 3, 0, 0)])
def test_tensorflow_padded_split(length, pieces, chunk, pad):
    """TF's _padded_split: P chunks of ceil(L/P), padding at the end (here never materialised)."""
    cuts = Schedule("split", Collective.BROADCAST, 2, (tuple(
        copy_step(1, 0, Fraction(i, pieces), Fraction(i + 1, pieces)) for i in range(pieces)),))
    (bounds,) = element_ranges(cuts, length, padded_to=pieces)
    padded = [(i * chunk, (i + 1) * chunk) for i in range(pieces)]
    assert [(lo, hi) for lo, hi in bounds] == [(min(a, length), min(b, length)) for a, b in padded]
    assert pieces * chunk - length == pad


def test_cost_model_prefers_tree_small_ring_large():
    from collectives.select import CostModel, choose
    model = CostModel()
    assert choose(Collective.ALL_REDUCE, 8, 64, model) == "tree"
    assert choose(Collective.ALL_REDUCE, 8, 64 << 20, model) in ("ring", "rechd")


def test_draw_command_prints_and_proves(capsys):
    from collectives.cli import main

    assert main(["draw", "rechd", "-n", "5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rechd: all_reduce over 5 participants, 6 rounds")
    assert "round  0: 0+=4[0,1)" in text and text.rstrip().endswith("holds the same computed value")
    with pytest.raises(SystemExit):
        main(["draw", "bogus"])
    assert "unknown algorithm 'bogus'" in capsys.readouterr().err
