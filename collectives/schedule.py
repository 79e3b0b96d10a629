"""Schedules: algorithms as plain data, and the checker that proves them.

A schedule is a list of rounds; a round is a set of steps that may run at the same time.
A step acts on one contiguous range ``[lo, hi)`` of the buffer, given as exact fractions of
its length so that one schedule serves every buffer size:

* reduce step: ``dst[lo:hi] = op(dst[lo:hi], srcs[0][lo:hi], srcs[1][lo:hi], ...)``
* copy step:   ``dst[lo:hi] = srcs[0][lo:hi]``

Within a round no range is written twice and no range is both written and read on one
participant (a reduce step reading its own destination aside). So the steps of a round can
run in any order or all at once, and every operation is element-wise: position ``i`` of a
buffer only ever meets position ``i`` of other buffers. Executors rely on both facts.

``check`` executes a schedule symbolically on the atoms between all its boundaries and proves
that every output holds each input's contribution exactly once, and that every participant
holding a result holds the *same* computed value (bitwise-identical results, whatever the
floating-point order of operations).
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

ZERO, ONE = Fraction(0), Fraction(1)


class Collective(enum.Enum):
    ALL_REDUCE = "all_reduce"
    REDUCE = "reduce"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"


@dataclass(frozen=True)
class Step:
    dst: int
    srcs: tuple[int, ...]
    lo: Fraction
    hi: Fraction
    reduce: bool

    def __str__(self) -> str:
        arrow = "+=" if self.reduce else "<-"
        srcs = ",".join(map(str, self.srcs))
        return f"{self.dst}{arrow}{srcs}[{self.lo},{self.hi})"


Round = tuple[Step, ...]


def reduce_step(dst: int, srcs: Iterable[int], lo, hi) -> Step:
    return Step(dst, tuple(srcs), Fraction(lo), Fraction(hi), True)


def copy_step(dst: int, src: int, lo, hi) -> Step:
    return Step(dst, (src,), Fraction(lo), Fraction(hi), False)


def block(index: int, count: int) -> tuple[Fraction, Fraction]:
    """Range of block ``index`` when the buffer is cut into ``count`` equal blocks."""
    return Fraction(index, count), Fraction(index + 1, count)


@dataclass(frozen=True, eq=True)
class Schedule:
    """Rounds of steps over ``size`` participants that implement ``collective``."""

    name: str
    collective: Collective
    size: int
    rounds: tuple[Round, ...]
    root: int = 0

    def __hash__(self) -> int:
        # Schedules key the caches on every call; hashing thousands of Fractions each time
        # would cost more than small collectives themselves.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.name, self.collective, self.size, self.rounds, self.root))
            object.__setattr__(self, "_hash", cached)
        return cached

    @property
    def steps(self) -> Iterable[Step]:
        return itertools.chain.from_iterable(self.rounds)

    def wire_fraction(self) -> Fraction:
        """Buffers' worth of data that cross between participants, summed over all steps."""
        return sum(((s.hi - s.lo) * len(s.srcs) for s in self.steps), ZERO)

    def cost(self, nbytes: int, latency: float, seconds_per_byte: float,
             reduce_seconds_per_byte: float = 0.0, message_overhead: float = 0.0) -> float:
        """LogP-flavoured estimate: per round, a latency plus the busiest participant's work.

        A participant's work in a round is ``message_overhead`` per message it sends or
        receives, plus its received bytes at ``seconds_per_byte`` (and reduced bytes at
        ``reduce_seconds_per_byte``).
        """
        total = 0.0
        for rnd in self.rounds:
            if not rnd:
                continue
            load: Counter = Counter()
            for s in rnd:
                width = float(s.hi - s.lo) * nbytes * len(s.srcs)
                per_byte = seconds_per_byte + (reduce_seconds_per_byte if s.reduce else 0.0)
                load[s.dst] += width * per_byte + message_overhead * len(s.srcs)
                for q in s.srcs:
                    load[q] += message_overhead
            total += latency + max(load.values())
        return total

    def draw(self) -> str:
        """A text picture: one line per round, what each participant receives."""
        lines = [f"{self.name}: {self.collective.value} over {self.size} participants, "
                 f"{len(self.rounds)} rounds, {self.wire_fraction()} buffers on the wire"]
        for i, rnd in enumerate(self.rounds):
            lines.append(f"  round {i:>2}: " + "  ".join(str(s) for s in sorted(
                rnd, key=lambda s: (s.dst, s.lo))))
        return "\n".join(lines)


class ScheduleError(AssertionError):
    """A schedule that does not do what its collective promises."""


def concat(name: str, collective: Collective, size: int, *phases: Sequence[Round],
           root: int = 0) -> Schedule:
    """One schedule from phases run one after another (empty rounds dropped)."""
    rounds = tuple(tuple(r) for phase in phases for r in phase if r)
    return Schedule(name, collective, size, rounds, root)


def merge_concurrent(*phases: Sequence[Round]) -> list[Round]:
    """Run phases over disjoint participants side by side: round i is the union of rounds i."""
    merged = []
    for rounds in itertools.zip_longest(*phases, fillvalue=()):
        merged.append(tuple(itertools.chain.from_iterable(rounds)))
    return merged


def relabel(rounds: Sequence[Round], members: Sequence[int]) -> list[Round]:
    """Rename local participant ``i`` to ``members[i]`` (embed a sub-schedule in a group)."""
    return [tuple(Step(members[s.dst], tuple(members[x] for x in s.srcs), s.lo, s.hi, s.reduce)
                  for s in rnd) for rnd in rounds]


# --- deriving collectives from a reduce phase ------------------------------------------------

Ownership = Sequence[tuple[Fraction, Fraction, int]]  # (lo, hi, owner): who holds the total


def gather_to_root(ownership: Ownership, root: int) -> list[Round]:
    """One round: every owner sends its fully reduced ranges to the root."""
    return [tuple(copy_step(root, owner, lo, hi) for lo, hi, owner in ownership if owner != root)]


def scatter_to_blocks(ownership: Ownership, size: int) -> list[Round]:
    """One round: owners send each reduced range to the participant whose block contains it."""
    steps = []
    for lo, hi, owner in ownership:
        for p in range(size):
            blo, bhi = block(p, size)
            a, b = max(lo, blo), min(hi, bhi)
            if a < b and p != owner:
                steps.append(copy_step(p, owner, a, b))
    return [tuple(steps)]


# --- the checker ------------------------------------------------------------------------------

def _atoms(schedule: Schedule) -> list[Fraction]:
    cuts = {ZERO, ONE}
    for s in schedule.steps:
        cuts.update((s.lo, s.hi))
    if schedule.collective in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        cuts.update(Fraction(i, schedule.size) for i in range(schedule.size + 1))
    return sorted(cuts)


def check(schedule: Schedule) -> None:
    """Prove the schedule correct for every buffer length, or raise ScheduleError saying why."""
    n, kind, root = schedule.size, schedule.collective, schedule.root
    cuts = _atoms(schedule)
    atoms = list(zip(cuts[:-1], cuts[1:]))
    index = {lo: i for i, (lo, _) in enumerate(atoms)}
    ids = itertools.count()

    def owner_of(lo: Fraction) -> int:
        return int(lo * n)  # the block holding atom [lo, ...)

    # state[p][a] = (contributions as sorted tuple, value id) or None (undefined)
    state: list[list[tuple | None]] = []
    for p in range(n):
        row: list[tuple | None] = []
        for lo, _ in atoms:
            if kind in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER):
                row.append(((p,), ("input", p)))
            elif kind is Collective.BROADCAST:
                row.append(((root,), ("input", root)) if p == root else None)
            else:  # ALL_GATHER: participant p brings block p
                row.append(((p,), ("input", p)) if owner_of(lo) == p else None)
        state.append(row)

    index[ONE] = len(atoms)

    def span(step: Step) -> range:
        if not ZERO <= step.lo <= step.hi <= ONE:
            raise ScheduleError(f"{schedule.name}: step {step} leaves the buffer or is reversed")
        return range(index[step.lo], index[step.hi])

    for r, rnd in enumerate(schedule.rounds):
        written: set[tuple[int, int]] = set()
        read: set[tuple[int, int]] = set()
        spans = [span(s) for s in rnd]
        for s, atoms_of_s in zip(rnd, spans):
            for p in (s.dst, *s.srcs):
                if not 0 <= p < n:
                    raise ScheduleError(f"{schedule.name}: round {r} names participant {p}")
            if s.dst in s.srcs:
                raise ScheduleError(f"{schedule.name}: round {r} step {s} reads its destination")
            for a in atoms_of_s:
                if (s.dst, a) in written:
                    raise ScheduleError(f"{schedule.name}: round {r} writes {s.dst} twice")
                written.add((s.dst, a))
                read.update((q, a) for q in s.srcs)
        clash = written & read
        if clash:
            raise ScheduleError(f"{schedule.name}: round {r} reads and writes {sorted(clash)[0]}")
        updates = {}
        for s, atoms_of_s in zip(rnd, spans):
            for a in atoms_of_s:
                inputs = [state[q][a] for q in s.srcs] + ([state[s.dst][a]] if s.reduce else [])
                if any(v is None for v in inputs):
                    raise ScheduleError(f"{schedule.name}: round {r} step {s} reads undefined data")
                if s.reduce:
                    contrib = tuple(sorted(itertools.chain.from_iterable(v[0] for v in inputs)))
                    updates[s.dst, a] = (contrib, next(ids))
                else:
                    updates[s.dst, a] = inputs[0]
        for (p, a), value in updates.items():
            state[p][a] = value

    everyone = tuple(range(n))
    for a, (lo, hi) in enumerate(atoms):
        if kind is Collective.ALL_REDUCE:
            holders, want = range(n), everyone
        elif kind is Collective.REDUCE:
            holders, want = [root], everyone
        elif kind is Collective.REDUCE_SCATTER:
            holders, want = [owner_of(lo)], everyone
        elif kind is Collective.BROADCAST:
            holders, want = range(n), (root,)
        else:
            holders, want = range(n), (owner_of(lo),)
        values = {state[p][a][1] if state[p][a] else None for p in holders}
        for p in holders:
            got = state[p][a]
            if got is None or got[0] != want:
                raise ScheduleError(
                    f"{schedule.name}: participant {p} ends with contributions "
                    f"{got[0] if got else None} in [{lo},{hi}), expected {want}")
        if len(values) != 1:
            raise ScheduleError(f"{schedule.name}: participants hold different values in "
                                f"[{lo},{hi}), so results would not be bitwise identical")


# --- fractions to element offsets -------------------------------------------------------------

@lru_cache(maxsize=4096)
def element_ranges(schedule: Schedule, units: int, padded_to: int = 0) -> tuple:
    """Per round, per step, ``(lo, hi)`` in units of the buffer (elements, or rows).

    ``padded_to`` reproduces TensorFlow's padded chunking: the buffer is taken as if padded
    with the op's identity to a multiple of ``padded_to`` units, which never needs to exist
    because identity padding only ever meets identity padding.
    """
    length = units
    if padded_to:
        length = -(-units // padded_to) * padded_to

    def at(f: Fraction) -> int:
        return min(units, f.numerator * length // f.denominator)

    return tuple(tuple((at(s.lo), at(s.hi)) for s in rnd) for rnd in schedule.rounds)


def prune(schedule: Schedule, collective: Collective, root: int = 0) -> Schedule:
    """Keep only the steps whose results reach what ``collective`` delivers.

    Turns an all-reduce into a reduce (to ``root``) or a reduce-scatter by walking the rounds
    backwards from the outputs that must be right and keeping each step that feeds them.
    """
    n = schedule.size
    cuts = set(_atoms(schedule)) | {Fraction(i, n) for i in range(n + 1)}
    cuts = sorted(cuts)
    atoms = list(zip(cuts[:-1], cuts[1:]))

    def covered(lo: Fraction, hi: Fraction) -> list[int]:
        return [a for a, (alo, ahi) in enumerate(atoms) if lo <= alo and ahi <= hi]

    if collective is Collective.REDUCE:
        needed = {(root, a) for a in range(len(atoms))}
    elif collective is Collective.REDUCE_SCATTER:
        needed = {(int(lo * n), a) for a, (lo, _) in enumerate(atoms)}
    else:
        raise ValueError(f"cannot derive {collective.value} by pruning")
    kept_rounds = []
    for rnd in reversed(schedule.rounds):
        kept = [s for s in rnd if any((s.dst, a) in needed for a in covered(s.lo, s.hi))]
        for s in kept:
            span = covered(s.lo, s.hi)
            if not s.reduce:
                needed -= {(s.dst, a) for a in span}
            needed |= {(q, a) for q in s.srcs for a in span}
        kept_rounds.append(tuple(kept))
    return concat(schedule.name, collective, n, kept_rounds[::-1], root=root)
