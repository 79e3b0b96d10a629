"""Schedules: algorithms as plain data, one participant at a time.

A collective runs in *rounds*; a round is a set of *steps* that may run at the same time. A
step acts on one contiguous range of the buffer, given as integer positions ``lo < hi`` out of
``den`` (the range ``[lo/den, hi/den)`` of the buffer's length), so one plan serves every
buffer length:

* reduce step: ``dst[lo:hi] = op(dst[lo:hi], srcs[0][lo:hi], srcs[1][lo:hi], ...)``
* copy step:   ``dst[lo:hi] = srcs[0][lo:hi]``

Within a round no range is written twice and no range is both written and read on one
participant (a reduce step reading its own destination aside). So the steps of a round can
run in any order or all at once, and every operation is element-wise: position ``i`` of a
buffer only ever meets position ``i`` of other buffers. Executors rely on both facts.

Algorithms produce a ``RankPlan`` for one participant directly (the rounds it takes part
in: what it receives, as steps, and what it sends, as ``(dst, lo, hi)``), in time proportional
to its own work, so a rank of a 4,096-rank job never looks at the other ranks' steps. The
global ``Schedule`` is the union of every participant's received steps; the checker
(``collectives.algorithms.checker``) proves it and ``collectives draw`` prints it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

# Lengths whose element offsets a plan keeps: per-tensor all-reduces of a model's gradients
# cycle through a few dozen lengths with one plan.
OFFSET_LENGTHS = 64


class Collective(enum.Enum):
    ALL_REDUCE = "all_reduce"
    REDUCE = "reduce"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    GATHER = "gather"  # block p of the root's buffer comes from participant p
    SCATTER = "scatter"  # participant p gets block p of the root's buffer
    ALL_TO_ALL = "all_to_all"  # block (i, j) at position i*n + j goes from i to j


# Plans are plain tuples: a rank of a large job builds thousands of them, and a tuple costs a
# tenth of an object. Their layouts:
Step = tuple  # (dst, srcs, lo, hi, reduce): dst receives [lo, hi) from srcs (added if reduce)
Send = tuple  # (dst, lo, hi): this participant sends its [lo, hi) to dst
Round = tuple  # (index, sends, recvs): what one participant does in round ``index``


def reduce_step(dst: int, srcs, lo: int, hi: int) -> Step:
    return (dst, tuple(srcs), lo, hi, True)


def copy_step(dst: int, src: int, lo: int, hi: int) -> Step:
    return (dst, (src,), lo, hi, False)


def describe(step: Step, den: int) -> str:
    """``d+=s[lo,hi)`` for a reduce into ``d`` of ``s``'s range, ``d<-s[lo,hi)`` for a copy."""
    dst, srcs, lo, hi, reduce = step
    arrow = "+=" if reduce else "<-"
    return f"{dst}{arrow}{','.join(map(str, srcs))}[{Fraction(lo, den)},{Fraction(hi, den)})"


@dataclass(frozen=True, eq=False)
class RankPlan:
    """The rounds participant ``rank`` takes part in, in order (rounds it sits out are absent)."""

    name: str
    collective: Collective
    size: int
    rank: int
    den: int
    num_rounds: int
    rounds: tuple[Round, ...]
    root: int = 0
    _offsets: dict = field(default_factory=dict, repr=False, compare=False)

    def offsets(self, units: int, granule: int = 1) -> tuple:
        """Per round, ``(index, sends, recvs)`` with positions turned into element offsets.

        The buffer holds ``units`` units (elements, or rows) of ``granule`` elements; sends
        become ``(dst, a, b, lo)`` and receives ``(srcs, a, b, reduce, lo)`` in elements,
        where the position ``lo`` names the message; empty ranges are dropped. Cached per
        length: a training loop calls with the same few lengths.
        """
        key = (units, granule)
        cached = self._offsets.get(key)
        if cached is not None:
            return cached
        den, g = self.den, granule
        out = []
        for index, sends, recvs in self.rounds:
            sends = tuple((dst, lo * units // den * g, hi * units // den * g, lo)
                          for dst, lo, hi in sends if lo * units // den < hi * units // den)
            recvs = tuple((srcs, lo * units // den * g, hi * units // den * g, reduce, lo)
                          for _, srcs, lo, hi, reduce in recvs
                          if lo * units // den < hi * units // den)
            if sends or recvs:
                out.append((index, sends, recvs))
        cached = tuple(out)
        if len(self._offsets) >= OFFSET_LENGTHS:  # the oldest length goes (dicts keep order)
            try:
                self._offsets.pop(next(iter(self._offsets)), None)
            except (StopIteration, RuntimeError):  # another thread's call got there first
                pass
        self._offsets[key] = cached
        return cached

    def draw(self) -> str:
        """One line per round this participant takes part in."""
        lines = [f"{self.name}: {self.collective.value}, participant {self.rank} of "
                 f"{self.size}, {len(self.rounds)} of {self.num_rounds} rounds"]
        for index, sends, recvs in self.rounds:
            out = "  ".join(f"->{dst}[{Fraction(lo, self.den)},{Fraction(hi, self.den)})"
                            for dst, lo, hi in sends)
            into = "  ".join(describe(s, self.den) for s in recvs)
            lines.append(f"  round {index:>2}: {into}  {out}".rstrip())
        return "\n".join(lines)


@dataclass(frozen=True)
class Schedule:
    """Every participant's steps, round by round: the union of the rank plans."""

    name: str
    collective: Collective
    size: int
    den: int
    rounds: tuple[tuple[Step, ...], ...]
    root: int = 0
    # per buffer length, the steps in elements (collectives.runtime.execute.steps)
    elements: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def steps(self) -> Iterable[Step]:
        for rnd in self.rounds:
            yield from rnd

    def wire_fraction(self) -> Fraction:
        """Buffers' worth of data that cross between participants, summed over all steps."""
        return sum((Fraction(hi - lo, self.den) * len(srcs) for _, srcs, lo, hi, _ in self.steps),
                   Fraction(0))

    def draw(self) -> str:
        """A text picture: one line per round, what each participant receives."""
        busy = [(i, rnd) for i, rnd in enumerate(self.rounds) if rnd]  # skip rounds nobody acts in
        rounds = f"{len(self.rounds)} rounds" + (
            f" ({len(busy)} with work)"
            if len(busy) < len(self.rounds) else "")
        lines = [f"{self.name}: {self.collective.value} over {self.size} participants, "
                 f"{rounds}, {self.wire_fraction()} buffers on the wire"]
        for i, rnd in busy:
            lines.append(f"  round {i:>2}: " + "  ".join(
                describe(s, self.den) for s in sorted(rnd, key=lambda s: (s[0], s[2]))))
        return "\n".join(lines)


def union(plans: Sequence[RankPlan]) -> Schedule:
    """The global schedule of one plan per participant (each step is listed by its receiver)."""
    first = plans[0]
    rounds: list[list[Step]] = [[] for _ in range(first.num_rounds)]
    for plan in plans:
        for index, _, recvs in plan.rounds:
            rounds[index].extend(recvs)
    return Schedule(first.name, first.collective, first.size, first.den,
                    tuple(tuple(r) for r in rounds), first.root)


def cost(plans: Sequence[RankPlan], nbytes: int, latency: float, seconds_per_byte: float,
         reduce_seconds_per_byte: float = 0.0, message_overhead: float = 0.0) -> float:
    """LogP-flavoured estimate: per round, a latency plus the busiest participant's work.

    ``plans`` may be a sample of the participants (the root, the first, a middle one): a
    participant's work in a round is ``message_overhead`` per message it sends or receives,
    plus its received bytes at ``seconds_per_byte`` (and reduced bytes at
    ``reduce_seconds_per_byte``).
    """
    loads: list[Counter] = [Counter() for _ in range(plans[0].num_rounds)]
    den = plans[0].den
    for plan in plans:
        for index, sends, recvs in plan.rounds:
            load = loads[index]
            load[plan.rank] += message_overhead * len(sends)
            for _, srcs, lo, hi, reduce in recvs:
                width = (hi - lo) / den * nbytes * len(srcs)
                per_byte = seconds_per_byte + (reduce_seconds_per_byte if reduce else 0.0)
                load[plan.rank] += width * per_byte + message_overhead * len(srcs)
    return sum(latency + max(load.values()) for load in loads if load)
