"""The checker: a proof, for every buffer length at once, that a schedule does its job.

``check`` executes a schedule symbolically on the *atoms* between all its range boundaries and
proves two things:

1. every output holds each input's contribution exactly once (and nothing else), and
2. every participant holding a result holds the *same computed value*: one computation,
   copied, so results are bitwise identical whatever the floating-point order of operations.

It also enforces the rules executors rely on: within a round no range is written twice, and no
participant both writes and reads one range (a reduce step reading its own destination aside).

``check_plans`` proves that per-participant plans agree with each other: what each participant
sends is exactly what its peers' received steps read from it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction

from .schedule import Collective, RankPlan, Schedule, Step


class ScheduleError(AssertionError):
    """A schedule that does not do what its collective promises."""


def _cuts(schedule: Schedule) -> list[int]:
    cuts = {0, schedule.den}
    for _, _, lo, hi, _ in schedule.steps:
        cuts.update((lo, hi))
    blocked = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER, Collective.GATHER,
               Collective.SCATTER, Collective.ALL_TO_ALL)
    if schedule.collective in blocked:
        # Block boundaries i/n (i/n^2 for all-to-all's blocks from i to j) must be positions.
        n = schedule.size * (schedule.size if schedule.collective is Collective.ALL_TO_ALL else 1)
        if schedule.den % n:
            raise ScheduleError(f"{schedule.name}: den {schedule.den} does not resolve the "
                                f"{n} blocks of a {schedule.collective.value}")
        cuts.update(i * schedule.den // n for i in range(n + 1))
    return sorted(cuts)


def check(schedule: Schedule) -> None:
    """Prove the schedule correct for every buffer length, or raise ScheduleError saying why."""
    n, kind, root, den = schedule.size, schedule.collective, schedule.root, schedule.den
    cuts = _cuts(schedule)
    atoms = list(zip(cuts[:-1], cuts[1:]))
    index = {lo: i for i, (lo, _) in enumerate(atoms)}
    index[den] = len(atoms)
    ids = itertools.count()

    def block_of(lo: int) -> int:
        return lo * n // den  # the participant whose block holds atom [lo, ...)

    def pair_of(lo: int) -> tuple[int, int]:
        return divmod(lo * n * n // den, n)  # all-to-all: (from, to) of atom [lo, ...)

    # state[p][a] = (contributions, value id), or None where undefined; contributions are a
    # bit mask of participants (``_combined``: a sorted tuple once one is counted twice)
    state: list[list[tuple | None]] = []
    # who brings each atom: all-to-all, participant p brings blocks (p, j); all-gather and
    # gather, participant p brings block p (found once per atom, not per participant)
    if kind is Collective.ALL_TO_ALL:
        owner = [pair_of(lo)[0] for lo, _ in atoms]
    elif kind in (Collective.ALL_GATHER, Collective.GATHER):
        owner = [block_of(lo) for lo, _ in atoms]
    for p in range(n):
        mine: tuple | None = (1 << p, ("input", p))
        row: list[tuple | None]
        if kind in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER):
            row = [mine] * len(atoms)
        elif kind in (Collective.BROADCAST, Collective.SCATTER):
            row = [(1 << root, ("input", root)) if p == root else None] * len(atoms)
        else:
            row = [mine if o == p else None for o in owner]
        state.append(row)

    def span(step: Step) -> range:
        _, _, lo, hi, _ = step
        if not 0 <= lo <= hi <= den or lo not in index or hi not in index:
            raise ScheduleError(f"{schedule.name}: step {step} leaves the buffer or is reversed")
        return range(index[lo], index[hi])

    for r, rnd in enumerate(schedule.rounds):
        written: dict[int, set[int]] = {}  # participant -> the atoms written in this round
        read: dict[int, set[int]] = {}  # participant -> the atoms read from it
        spans = [span(s) for s in rnd]
        for (dst, srcs, _, _, reduce), atoms_of_s in zip(rnd, spans):
            for p in (dst, *srcs):
                if not 0 <= p < n:
                    raise ScheduleError(f"{schedule.name}: round {r} names participant {p}")
            if dst in srcs:
                raise ScheduleError(f"{schedule.name}: round {r}: {dst} reads its destination")
            if not srcs and not reduce:
                raise ScheduleError(f"{schedule.name}: round {r}: {dst} copies from no one")
            mine_written = written.setdefault(dst, set())
            if not mine_written.isdisjoint(atoms_of_s):
                raise ScheduleError(f"{schedule.name}: round {r} writes {dst} twice")
            mine_written.update(atoms_of_s)
            for q in srcs:
                read.setdefault(q, set()).update(atoms_of_s)
        clash = [(p, min(atoms & read[p])) for p, atoms in sorted(written.items())
                 if p in read and not atoms.isdisjoint(read[p])]
        if clash:
            raise ScheduleError(f"{schedule.name}: round {r} reads and writes {clash[0]}")
        # (no step reads what another writes in this round, checked above: each step's
        # result goes in at once, a whole range at a time)
        for (dst, srcs, _, _, reduce), atoms_of_s in zip(rnd, spans):
            lo, hi = atoms_of_s.start, atoms_of_s.stop
            columns = [state[q][lo:hi] for q in srcs] + ([state[dst][lo:hi]] if reduce else [])
            if any(None in column for column in columns):
                raise ScheduleError(f"{schedule.name}: round {r}: {dst} reads undefined data "
                                    f"from {srcs}")
            if not reduce:
                state[dst][lo:hi] = columns[0]
            elif len(columns) == 2:  # (most steps: one peer's values into this one's)
                state[dst][lo:hi] = [
                    (a[0] | b[0] if type(a[0]) is type(b[0]) is int and not a[0] & b[0]
                     else _combined([a, b]), next(ids)) for a, b in zip(*columns)]
            else:
                state[dst][lo:hi] = [(_combined(inputs), next(ids)) for inputs in zip(*columns)]

    everyone = (1 << n) - 1
    holders: Sequence[int]
    for a, (lo, hi) in enumerate(atoms):
        if kind is Collective.ALL_REDUCE:
            holders, want = range(n), everyone
        elif kind is Collective.REDUCE:
            holders, want = [root], everyone
        elif kind is Collective.REDUCE_SCATTER:
            holders, want = [block_of(lo)], everyone
        elif kind is Collective.BROADCAST:
            holders, want = range(n), 1 << root
        elif kind is Collective.SCATTER:
            holders, want = [block_of(lo)], 1 << root
        elif kind is Collective.GATHER:
            holders, want = [root], 1 << block_of(lo)
        elif kind is Collective.ALL_TO_ALL:
            source, target = pair_of(lo)
            holders, want = [target], 1 << source
        else:
            holders, want = range(n), 1 << block_of(lo)
        values = {v[1] if (v := state[p][a]) else None for p in holders}
        for p in holders:
            got = state[p][a]
            if got is None or got[0] != want:
                where = f"[{Fraction(lo, den)},{Fraction(hi, den)})"
                raise ScheduleError(
                    f"{schedule.name}: participant {p} ends with contributions "
                    f"{_members(got[0]) if got else None} in {where}, expected "
                    f"{_members(want)}")
        if len(values) != 1:
            where = f"[{Fraction(lo, den)},{Fraction(hi, den)})"
            raise ScheduleError(f"{schedule.name}: participants hold different values in "
                                f"{where}, so results would not be bitwise identical")


def _combined(inputs: Sequence[tuple]) -> int | tuple:
    """The contributions of a reduction of ``inputs``: the union of their masks where no
    participant is counted twice (a bit mask is one OR a step, where a sorted tuple was a
    sort), else the multiset, as a sorted tuple (the error then lists each count)."""
    total: int | tuple = 0
    for contributions, _ in inputs:
        if type(total) is int and type(contributions) is int and not total & contributions:
            total |= contributions
        else:
            total = tuple(sorted(_members(total) + _members(contributions)))
    return total


def _members(contributions: int | tuple) -> tuple:
    """Contributions as a sorted tuple of participants."""
    if isinstance(contributions, tuple):
        return contributions
    return tuple(p for p in range(contributions.bit_length()) if contributions >> p & 1)


def check_plans(plans: Sequence[RankPlan]) -> None:
    """Prove that the participants' plans fit together: each sends what the others receive.

    For every round, participant ``p``'s sends must be exactly the messages the union's steps
    read from ``p`` (one per step it is a source of), no more and no fewer.
    """
    first = plans[0]
    for p, plan in enumerate(plans):
        if (plan.rank, plan.size, plan.den, plan.num_rounds, plan.collective, plan.root) != (
                p, first.size, first.den, first.num_rounds, first.collective, first.root):
            raise ScheduleError(f"{first.name}: plan of participant {p} disagrees on its header")
        indices = [index for index, _, _ in plan.rounds]
        if indices != sorted(set(indices)) or any(not 0 <= i < plan.num_rounds for i in indices):
            raise ScheduleError(f"{first.name}: participant {p}'s rounds are out of order")
        for _, sends, recvs in plan.rounds:
            if not sends and not recvs:
                raise ScheduleError(f"{first.name}: participant {p} lists an empty round")
            if any(dst != p for dst, *_ in recvs):
                raise ScheduleError(f"{first.name}: participant {p} lists another's step")
    wanted: dict[tuple[int, int], list[tuple]] = {}
    for plan in plans:
        for index, _, recvs in plan.rounds:
            for dst, srcs, lo, hi, _ in recvs:
                for q in srcs:
                    wanted.setdefault((q, index), []).append((dst, lo, hi))
    for plan in plans:
        for index, sends, _ in plan.rounds:
            want = sorted(wanted.pop((plan.rank, index), []))
            if sorted(sends) != want:
                raise ScheduleError(
                    f"{first.name}: participant {plan.rank} sends {sorted(sends)} in round "
                    f"{index}, but its peers receive {want} from it")
    if wanted:
        (q, r), sends = next(iter(wanted.items()))
        raise ScheduleError(f"{first.name}: participant {q} never sends {sends} in round {r}")
