"""What every algorithm module provides, and the pieces they are built from.

An algorithm module produces, for one participant, a ``Phase``: the rounds that
participant takes part in (what it receives and what it sends), with range positions out of
the phase's ``den``. Phases compose: a collective is often a reduce phase followed by a
distribution phase, and a two-level algorithm embeds whole phases of one algorithm inside
groups of participants and of another across them.

Every module has the same interface (``AlgorithmModule``); derived collectives (reduce,
reduce-scatter) come from a module's reduce phase and who ends up owning which range of the
total (``Ownership``), through ``gather_to_root`` and ``scatter_to_blocks``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from functools import lru_cache
from math import lcm
from typing import NamedTuple, Protocol

from .schedule import Collective, Round, Send, Step


class Layout:
    """A partition of the participants into groups (the devices of a worker, the ranks of a
    node), with each participant's group and place in it precomputed. Hashable in O(1), so
    plans keyed by it cost nothing to look up."""

    __slots__ = ("groups", "group_of", "local_of", "size", "uniform", "runs", "_hash")

    def __init__(self, groups: Sequence[Sequence[int]]):
        self.groups = tuple(tuple(int(p) for p in g) for g in groups)
        self.size = sum(len(g) for g in self.groups)
        self.group_of = [0] * self.size
        self.local_of = [0] * self.size
        for gi, g in enumerate(self.groups):
            for i, p in enumerate(g):
                self.group_of[p], self.local_of[p] = gi, i
        sizes = {len(g) for g in self.groups}
        self.uniform = sizes.pop() if len(sizes) == 1 else 0  # the common group size, or 0
        k = self.uniform
        consecutive = k and self.groups == tuple(tuple(range(i, i + k))
                                                 for i in range(0, self.size, k))
        self.runs = k if consecutive else 0  # groups of k consecutive participants, or 0
        self._hash = hash(self.groups)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.groups == other.groups

    def __repr__(self) -> str:
        return f"Layout({self.groups})"


Groups = Layout


class Phase(NamedTuple):
    """``count`` rounds over positions out of ``den``; ``rounds``: this participant's."""

    den: int
    count: int  # type: ignore[assignment]  # a field named like tuple.count, on purpose
    rounds: tuple[Round, ...]


EMPTY = Phase(1, 0, ())


class AlgorithmModule(Protocol):
    """The interface of ``collectives/algorithms/<name>.py``."""

    NAME: str
    COLLECTIVES: frozenset[Collective]
    SHARDED: bool  # whether ``shards`` changes its plans

    def __hash__(self) -> int:  # modules are: plans are cached by module (lru_cache keys)
        ...

    def uses_layout(self, layout: Layout) -> bool:
        """Whether its plans depend on these groups."""
        ...

    def phase(self, collective: Collective, size: int, rank: int, *, root: int = 0,
              shards: int = 0, groups: Groups | None = None) -> Phase:
        """Participant ``rank``'s rounds of ``collective`` over ``size`` participants.

        ``root``: the root of reduce and broadcast; ``shards``: sub-chunks or gather
        participants where the algorithm has them (0: its default); ``groups``: a partition
        of the participants, which some algorithms use to place their traffic.
        """
        ...


def round_of(index: int, sends: Sequence[Send], recvs: Sequence[Step]) -> Round:
    """A round in the order executors post it: by position, so that the messages between
    two participants are posted in the same order at both ends."""
    if len(sends) > 1:
        sends = sorted(sends, key=_send_order)
    if len(recvs) > 1:
        recvs = sorted(recvs, key=_recv_order)
    return (index, tuple(sends), tuple(recvs))


def _send_order(send: Send) -> tuple[int, int]:
    return send[1], send[0]


def _recv_order(step: Step) -> int:
    return step[2]


def phase_of(den: int, count: int, rounds: Sequence[tuple[int, list, list]]) -> Phase:
    """A phase from ``(index, sends, recvs)`` triples, in any order; rounds with nothing to do
    are dropped."""
    return Phase(den, count, tuple(sorted((round_of(i, s, r) for i, s, r in rounds if s or r),
                                          key=_index)))


def _index(rnd: Round) -> int:
    return rnd[0]


def rescaled(phase: Phase, den: int) -> Phase:
    """The same phase with positions out of ``den`` (a multiple of the phase's own)."""
    if den == phase.den:
        return phase
    k = den // phase.den
    rounds = tuple((index, tuple((dst, lo * k, hi * k) for dst, lo, hi in sends),
                    tuple((dst, srcs, lo * k, hi * k, red) for dst, srcs, lo, hi, red in recvs))
                   for index, sends, recvs in phase.rounds)
    return Phase(den, phase.count, rounds)


def concat(*phases: Phase) -> Phase:
    """Phases one after another, with a common ``den``."""
    den = lcm(*(p.den for p in phases))
    rounds: list[Round] = []
    offset = 0
    for phase in phases:
        if offset:
            rounds.extend((index + offset, sends, recvs)
                          for index, sends, recvs in rescaled(phase, den).rounds)
        else:
            rounds.extend(rescaled(phase, den).rounds)
        offset += phase.count
    return Phase(den, offset, tuple(rounds))


def embedded(phase: Phase, members: Sequence[int], lo: int, hi: int, den: int) -> Phase:
    """``phase`` of a sub-group: local participant ``i`` becomes ``members[i]``, and the whole
    buffer ``[0, phase.den)`` becomes the range ``[lo, hi)`` out of ``den``.

    The result's ``den`` is ``den * phase.den`` so that every position stays an integer.
    """
    big = den * phase.den
    scale, base = hi - lo, lo * phase.den

    def at(x: int) -> int:
        return base + x * scale

    rounds = []
    for index, sends, recvs in phase.rounds:
        sends = tuple((members[dst], at(lo), at(hi)) for dst, lo, hi in sends)
        recvs = tuple((members[dst], tuple(members[q] for q in srcs), at(lo), at(hi), red)
                      for dst, srcs, lo, hi, red in recvs)
        rounds.append((index, sends, recvs))
    return Phase(big, phase.count, tuple(rounds))


def block(index: int, count: int, den: int) -> tuple[int, int]:
    """Positions of block ``index`` when a buffer of ``den`` positions is cut into ``count``."""
    return index * den // count, (index + 1) * den // count


# --- who holds the total after a reduce phase -------------------------------------------------

class Ownership:
    """After a reduce phase: which participant holds the total of which range.

    Built from a sorted list of ``(lo, hi, owner)`` covering ``[0, den)``, computed once per
    algorithm and participant count and shared by every participant's plan.
    """

    def __init__(self, den: int, ranges: Sequence[tuple[int, int, int]]):
        self.den = den
        self.ranges = sorted(ranges)
        self._starts = [lo for lo, _, _ in self.ranges]
        self._mine: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, owner in self.ranges:
            self._mine.setdefault(owner, []).append((lo, hi))

    def owned_by(self, rank: int) -> list[tuple[int, int]]:
        return self._mine.get(rank, [])

    def within(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The owned ranges, clipped to ``[lo, hi)``."""
        i = max(bisect.bisect_right(self._starts, lo) - 1, 0)
        out = []
        while i < len(self.ranges) and self.ranges[i][0] < hi:
            a, b, owner = self.ranges[i]
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append((a, b, owner))
            i += 1
        return out


def gather_to_root(ownership: Ownership, size: int, rank: int, root: int) -> Phase:
    """One round: every owner sends its reduced ranges to the root."""
    den = ownership.den
    if rank == root:
        recvs = [(root, (owner,), lo, hi, False) for lo, hi, owner in ownership.ranges
                 if owner != root]
        return phase_of(den, 1, [(0, [], recvs)])
    sends = [(root, lo, hi) for lo, hi in ownership.owned_by(rank)]
    return phase_of(den, 1, [(0, sends, [])])


def scatter_to_blocks(ownership: Ownership, size: int, rank: int) -> Phase:
    """One round: owners send each reduced range to the participant whose block holds it."""
    den = lcm(ownership.den, size)
    k = den // ownership.den
    lo, hi = block(rank, size, den)
    recvs = [(rank, (owner,), a, b, False)
             for a, b, owner in _scaled_within(ownership, lo, hi, k) if owner != rank]
    sends = []
    for a, b in ownership.owned_by(rank):
        a, b = a * k, b * k
        for p in range(a * size // den, min(size, -(-b * size // den))):
            plo, phi = block(p, size, den)
            x, y = max(a, plo), min(b, phi)
            if x < y and p != rank:
                sends.append((p, x, y))
    return phase_of(den, 1, [(0, sends, recvs)])


def _scaled_within(ownership: Ownership, lo: int, hi: int, k: int):
    # ``within`` in the owner's positions, answered in positions ``k`` times finer.
    for a, b, owner in ownership.within(lo // k, -(-hi // k)):
        a, b = max(a * k, lo), min(b * k, hi)
        if a < b:
            yield a, b, owner


@lru_cache(maxsize=64)
def cached_ownership(build: Callable[..., Ownership], *args) -> Ownership:
    """Ownership depends on the algorithm and participant count only: share it."""
    return build(*args)
