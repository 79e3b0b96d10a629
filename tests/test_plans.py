"""Every algorithm's plans are proved: the union of all participants' plans is checked for
1..64 participants, and each participant's plan is exactly its part of that union."""

from __future__ import annotations

import pytest

from collectives import algorithms
from collectives.algorithms.base import Layout
from collectives.algorithms.checker import ScheduleError, check, check_plans
from collectives.algorithms.ring import Rings, ring_permutations
from collectives.algorithms.schedule import Collective, Schedule, copy_step, reduce_step

BASE = list(algorithms.MODULES)
ROOTED = (Collective.REDUCE, Collective.BROADCAST)


def prove(collective, name, n, proved=None, **kw):
    """Prove the plans of ``collective`` by ``name`` over ``n``. ``proved``: a set of the plans
    a test has proved already; plans equal to those in every field the proofs read (a root
    that a collective without one ignores, a group or shard count a plan does not use) are
    not proved again, since both proofs are functions of those fields alone."""
    plans = algorithms.all_plans(collective, name, n, **kw)
    key = None
    if proved is not None:
        key = tuple((p.collective, p.size, p.rank, p.den, p.num_rounds, p.root, p.rounds)
                    for p in plans)
        if key in proved:
            return
    check_plans(plans)  # each participant sends exactly what its peers' steps read from it
    check(algorithms.schedule(collective, name, n, **kw))  # and together they are right
    if key is not None:
        proved.add(key)


@pytest.mark.slow
@pytest.mark.parametrize("collective, name", [
    (c, name) for c in Collective for name in BASE if algorithms.supports(c, name)],
    ids=lambda v: getattr(v, "value", v))
def test_every_algorithm_is_proved_for_1_to_64(collective, name):
    for n in range(1, 65):
        for root in sorted({0, n - 1, n // 2}) if collective in ROOTED else [0]:
            prove(collective, name, n, root=root)


@pytest.mark.parametrize("name", ["ring", "shuffle"])
@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
def test_shards(name, shards):
    proved: set = set()
    for n in range(1, 20):
        for collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE):
            prove(collective, name, n, proved, shards=shards, root=n - 1)


@pytest.mark.parametrize("group", [2, 3, 4])
def test_ring_rotations_inside_groups(group):
    proved: set = set()
    for n in range(group, 25, group):
        layout = Layout([range(i, i + group) for i in range(0, n, group)])
        for shards in (1, 2, 3, 4):
            prove(Collective.ALL_REDUCE, "ring", n, proved, shards=shards, layout=layout)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pscpu/pscpu", "ring/ring", "tree/rechd", "rechd/shuffle",
                                  "one_device/tree", "shuffle/ring", "rechd/ring"])
@pytest.mark.parametrize("collective", [Collective.ALL_REDUCE, Collective.REDUCE,
                                        Collective.REDUCE_SCATTER], ids=lambda c: c.value)
def test_two_level(name, collective):
    canonical = algorithms.canonical(name)
    proved: set = set()  # all-reduce and reduce-scatter ignore the root: one proof for the three
    for n in range(1, 17):
        for size in (1, 2, 3, 4):  # equal groups (the sharded form) and a short last group
            layout = Layout([range(i, min(i + size, n)) for i in range(0, n, size)])
            for root in sorted({0, n - 1, n // 2}):
                prove(collective, canonical, n, proved, root=root, shards=2 if n > 3 else 1,
                      layout=layout)
    scattered = Layout([[0, 3, 6], [1, 4, 7], [2, 5, 8]])  # groups need not be contiguous
    prove(collective, canonical, 9, proved, root=4, layout=scattered)


def test_two_level_sends_each_group_minimum_across_groups():
    # 2 groups of 4: every participant sends a quarter of the buffer's ring traffic across.
    layout = Layout([range(0, 4), range(4, 8)])
    whole = algorithms.schedule(Collective.ALL_REDUCE, "ring/ring", 8, layout=layout)
    across = sum((hi - lo) for rnd in whole.rounds for dst, srcs, lo, hi, _ in rnd
                 for q in srcs if (q < 4) != (dst < 4))
    assert across / whole.den == 2 * 1  # 2 (G - 1) / G buffers per group, 2 groups


@pytest.mark.parametrize("name", ["ring", "rechd", "tree", "shuffle", "one_device"])
def test_plans_fit_together_at_4096(name):
    """At scale, sampled participants' sends match their peers' received steps."""
    n = 4096
    for collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER):
        # per peer, its received steps by round (its thousands of rounds indexed once)
        received: dict[int, dict[int, list]] = {}
        for rank in (0, 1, 1234, 2048, 4095):
            plan = algorithms.rank_plan(collective, name, n, rank)
            for index, sends, _ in plan.rounds[:40] + plan.rounds[-40:]:
                for dst, lo, hi in sends[:20] + sends[-20:]:
                    if dst not in received:
                        peer = algorithms.rank_plan(collective, name, n, dst)
                        received[dst] = by_round = {}
                        for i, _, recvs in peer.rounds:
                            by_round.setdefault(i, []).extend(recvs)
                    steps = received[dst].get(index, [])
                    assert any(rank in s[1] and (s[2], s[3]) == (lo, hi) for s in steps)


def test_arithmetic_rings_equal_tensorflows_permutations():
    for workers, group in ((1, 4), (2, 4), (3, 2), (2, 3)):
        n = workers * group
        for shards in range(1, group + 1):
            preds, ranks = ring_permutations(workers, shards, list(range(group)))
            rings = Rings(n, shards, group if workers > 1 else 0)
            for s in range(shards):
                assert [rings.position(s, d) for d in range(n)] == ranks[s]
                assert [rings.device(s, rings.position(s, d) - 1) for d in range(n)] == preds[s]


def test_tensorflow_ring_permutations():
    assert ring_permutations(1, 0, []) == ([], [])
    assert ring_permutations(1, 1, [0]) == ([[0]], [[0]])
    assert ring_permutations(2, 1, [0, 1, 2]) == ([[5, 0, 1, 2, 3, 4]], [[0, 1, 2, 3, 4, 5]])
    assert ring_permutations(1, 4, [0, 1, 2, 3]) == (
        [[3, 0, 1, 2]] * 4, [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]])
    assert ring_permutations(2, 2, [0, 3, 2, 1]) == (
        [[5, 2, 3, 0, 1, 6, 7, 4], [1, 2, 7, 0, 5, 6, 3, 4]],
        [[0, 3, 2, 1, 4, 7, 6, 5], [2, 1, 0, 3, 6, 5, 4, 7]])
    with pytest.raises(ValueError, match="num_subchunks 3 must be <= num_gpus 2"):
        ring_permutations(1, 3, [0, 1])


def test_ring_rounds_follow_tensorflow_worked_example():
    # 1 worker, 3 devices: tick 0 has d0 reduce segment 1 from d2, d1 segment 2 from d0, ...
    schedule = algorithms.schedule(Collective.ALL_REDUCE, "ring", 3)
    first = {(dst, srcs[0], lo) for dst, srcs, lo, _, _ in schedule.rounds[0]}
    assert schedule.den == 3 and first == {(0, 2, 1), (1, 0, 2), (2, 1, 0)}
    assert len(schedule.rounds) == 4 and schedule.wire_fraction() == 4


def test_element_offsets_split_any_length():
    plan = algorithms.rank_plan(Collective.ALL_REDUCE, "ring", 4, 1)
    for length in (0, 1, 3, 4, 7, 1001):
        covered = sorted((a, b) for _, _, recvs in plan.offsets(length)[:3]
                         for _, a, b, _, _ in recvs)
        assert all(0 <= a < b <= length for a, b in covered)
    assert plan.offsets(8) is plan.offsets(8)  # cached per length


def _bad(rounds, n=2, collective=Collective.ALL_REDUCE, den=2):
    return Schedule("bad", collective, n, den, tuple(tuple(r) for r in rounds))


@pytest.mark.parametrize("schedule, complaint", [
    (_bad([[reduce_step(0, [1], 0, 2)]]), "participant 1 ends with contributions"),
    (_bad([[reduce_step(0, [1], 0, 2)], [reduce_step(0, [1], 0, 2)],
           [copy_step(1, 0, 0, 2)]]), r"\(0, 1, 1\)"),
    (_bad([[reduce_step(0, [1], 0, 2), copy_step(1, 0, 0, 2)]]), "reads and writes"),
    (_bad([[reduce_step(0, [1], 0, 1), reduce_step(1, [0], 1, 2)],
           [copy_step(1, 0, 0, 1)]]), "ends with contributions"),
    (_bad([[reduce_step(0, [1], 0, 2), reduce_step(1, [0], 0, 2)]]), "reads and writes"),
    (_bad([[reduce_step(2, [1], 0, 2)]]), "names participant 2"),
    (_bad([[copy_step(0, 1, 0, 2)]], collective=Collective.BROADCAST), "undefined"),
    (_bad([[reduce_step(0, [1], 0, 2)], [copy_step(1, 0, 0, 2), (0, (), 1, 1, False)]]),
     "copies from no one"),
])
def test_checker_rejects(schedule, complaint):
    with pytest.raises(ScheduleError, match=complaint):
        check(schedule)


def test_checker_demands_one_computed_value_everywhere():
    # Right contributions everywhere, but participant 1 recomputes its half instead of
    # receiving participant 0's: two computations of one total need not round alike.
    rounds = [[reduce_step(0, [1], 0, 1), reduce_step(1, [0], 1, 2)],
              [copy_step(1, 0, 0, 1), copy_step(0, 1, 1, 2)],
              [reduce_step(1, [], 0, 1)]]
    check(_bad(rounds[:2]))  # the honest schedule passes
    with pytest.raises(ScheduleError, match="bitwise identical"):
        check(_bad(rounds))


def test_plan_checker_rejects_plans_that_do_not_fit():
    good = algorithms.all_plans(Collective.ALL_REDUCE, "ring", 3)
    check_plans(good)
    index, sends, recvs = good[0].rounds[0]
    wrong = (index, ((sends[0][0], sends[0][1], sends[0][2] + 1),), recvs)
    from dataclasses import replace

    bad = [replace(good[0], rounds=(wrong, *good[0].rounds[1:])), *good[1:]]
    with pytest.raises(ScheduleError, match="but its peers receive"):
        check_plans(bad)


def test_cost_model_prefers_tree_small_ring_large():
    from collectives.algorithms.select import CostModel, choose
    model = CostModel()
    assert choose(Collective.ALL_REDUCE, 8, 64, model) == "tree"
    assert choose(Collective.ALL_REDUCE, 8, 64 << 20, model) in ("ring", "rechd")


def test_draw_command_prints_and_proves(capsys):
    from collectives.tools.cli import main

    assert main(["draw", "rechd", "-n", "5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rechd: all_reduce over 5 participants, 6 rounds")
    assert "round  0: 0+=4[0,1)" in text and text.rstrip().endswith("holds the same computed value")
    assert main(["draw", "ring", "-n", "4096", "--rank", "7"]) == 0
    text = capsys.readouterr().out
    assert "participant 7 of 4096" in text and "round 8189" in text
    with pytest.raises(SystemExit):
        main(["draw", "bogus"])
    assert "unknown algorithm 'bogus'" in capsys.readouterr().err
