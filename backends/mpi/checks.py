"""What rides with a native collective: the call's check value and a NaN flag.

Every native collective carries a tiny all-reduce (MAX over ``[check, -check, nan]`` in
int64), issued just before its data on the same communicator. Every rank gets the same
three numbers, so every rank reaches the same verdict:

* ``max(check) == check`` and ``max(-check) == -check`` on a rank means every rank has its
  check value; otherwise ranks called different collectives (or the same one with other
  arguments) and every one of them raises ``CollectiveMismatchError``;
* ``nan`` is 1 where some rank's input holds a NaN of a float MAX/MIN. MPI's MAX and MIN
  may drop a NaN depending on the order of operands (``a > b ? a : b``), so those calls
  repair their result: the ranks all-reduce a mask of their NaN positions (a core schedule
  over the control channel, only in that case) and put NaN wherever some rank had one, the
  same NaN on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.errors import CollectiveMismatchError
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call
from collectives.runtime.execute.spmd import SpmdRun

REPAIR_PART = 4  # the control channel's check field for NaN repairs (agreements use 0..3)


class Slot:
    """One persistent check all-reduce, used by one run at a time."""

    __slots__ = ("inb", "out", "owner", "request")

    def __init__(self, comm: Any):
        self.inb, self.out = np.zeros(3, np.int64), np.zeros(3, np.int64)
        self.request = comm.Allreduce_init(self.inb, self.out, MPI.MAX)
        self.owner: Any = None


class CheckSlots:
    """The check all-reduces of a communicator, taken in turn by every native call.

    They are persistent (a start costs less than building an ``Iallreduce``) and shared by
    every kind of native call, so that the k-th native call of every rank uses the same
    request whatever it is: MPICH matches persistent collectives request by request, so
    ranks calling different collectives must still meet in their checks. A call whose turn
    comes while its slot is still busy with an earlier call waits in the lane.
    """

    def __init__(self, comm: Any, count: int):
        self.slots = [Slot(comm) for _ in range(count)]
        self.turn = 0

    def free_slot(self) -> Slot | None:
        slot = self.slots[self.turn % len(self.slots)]
        return slot if slot.owner is None else None

    def start(self, owner: Any, check: int, nan: bool) -> Slot:
        slot = self.slots[self.turn % len(self.slots)]
        self.turn += 1
        slot.owner = owner
        slot.inb[0], slot.inb[1], slot.inb[2] = check, -check, nan
        slot.request.Start()
        return slot

    def free(self) -> None:
        for slot in self.slots:
            if slot.owner is None:  # an active request (a failed call's) cannot be freed
                slot.request.Free()
        self.slots = []


def verify(out: np.ndarray, call: Call, rank: int, seq: int) -> bool:
    """Raise unless every rank has this call's check value; return whether some rank had NaN."""
    check = call.check
    if int(out[0]) != check or int(out[1]) != -check:
        raise CollectiveMismatchError(
            f"rank {rank}: call {seq}: ranks called different collectives, or the same one "
            f"with different arguments, at this point (this rank: {call.describe()}); every "
            "rank must make the same calls in the same order")
    return bool(out[2])


def local_nans(x: np.ndarray, needed: bool) -> np.ndarray | None:
    """Where this rank's input holds NaN (None: nowhere, or the op does not care)."""
    if not needed or not len(x):
        return None
    if not np.isnan(x.max()):  # one fast pass (NumPy's max propagates NaN)
        return None
    return np.isnan(x).view(np.uint8).copy()


def settle_zeros(result: np.ndarray) -> None:
    """A float MAX or MIN result's zeros made +0 on every rank: MPI's MAX and MIN keep
    whichever of +0 and -0 they met first, in an order that differs between ranks (each
    rank had its peer's sign); adding +0 turns -0 into +0 and leaves every other value. Also
    where every rank had -0 (a rank cannot tell that from mixed signs without another
    exchange): docs/reliability.md says the sign of such a zero is not promised."""
    np.add(result, 0.0, out=result)


class Repair:
    """The NaN repair of one call: all-reduce the ranks' NaN masks, then write NaN."""

    __slots__ = ("mask", "run")

    def __init__(self, control: Any, size: int, rank: int, count: int, mine: np.ndarray | None,
                 seq: int):
        self.mask = mine if mine is not None else np.zeros(count, np.uint8)
        plan = algorithms.rank_plan(Collective.ALL_REDUCE, "rechd", size, rank)
        self.run = SpmdRun(plan, self.mask, ReduceOp.MAX, control, seq=seq, check=REPAIR_PART)

    def advance(self) -> bool:
        return self.run.advance()

    def apply(self, result: np.ndarray, lo: int = 0) -> None:
        """Put NaN into ``result``, which holds elements ``lo ..`` of the full reduction."""
        where = self.mask[lo:lo + len(result)].view(bool)
        result[where] = np.nan

    def abort(self) -> None:
        self.run.abort()
