"""Small native collectives as MPI-4 persistent collectives over the transport's buffers.

A persistent start skips what MPICH does on every non-blocking call (building the schedule),
which is most of a small collective's cost. MPICH matches persistent collectives request by
request (the k-th ``*_init`` of one rank with the k-th of every other) and never with a
non-blocking or blocking call, so whether a call runs persistent must not depend on which
code path issued it: every native call of the persistent class (``tuning.persistent``) goes
through ``Entries``, whether it came from a plain call, a prepared call or the fast
path, and the first ``PERSISTENT_CALLS`` distinct signatures (in call order: the same on
every rank) get an entry, created at their first call (ranks that disagree about a call
still create one each, so their later requests stay paired; their checks fail first). An
entry's request is bound to buffers of its own: each run copies its input in and its result
out (for payloads this small the copies cost less than any per-call setup); all-reduces run
in place on one buffer, whose trailer each start writes again. One entry serves one run at a
time; a second call with the same signature waits for it in the lane.

All-reduces carry their check in a few extra elements of the reduction (``rider.py``), so a
repeated small all-reduce is one persistent start; other calls take a check slot.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from collectives.algorithms.schedule import Collective
from collectives.errors import CollectiveMismatchError
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call, pairing_key

from . import tuning
from .checks import local_nans, settle_zeros
from .datatypes import has_nan_issue, native_types
from .nonblocking import scatter_bounds
from .rider import Rider
from .runs import NativeRun


class Entry:
    """The persistent request of one call signature, over buffers of its own. It is created
    (``MPI_*_init``, itself a collective in MPI's order of collectives) when its first run
    issues, in the lane, so that it takes the same place among the collectives on every rank."""

    __slots__ = ("call", "collective", "data_req", "head", "hi", "inb", "lo", "nan", "op",
                 "outb", "owner", "result", "rider", "root", "tail", "trailer")

    def __init__(self, call: Call, op: ReduceOp | None, size: int):
        self.call, self.op = call, op
        self.collective, self.root = call.collective, call.root
        self.owner: Any = None
        self.data_req: Any = None
        self.nan = op is not None and has_nan_issue(call.dtype, op)
        self.rider: Rider | None = None
        if call.collective is Collective.ALL_REDUCE:
            assert op is not None  # an all-reduce has its op
            self.rider = Rider.make(call.dtype, op, size, call.check)

    def create(self, comm: Any, size: int, rank: int) -> None:
        call, op = self.call, self.op
        count, c = call.count, call.collective
        self.lo, self.hi = 0, count
        if c in (Collective.BROADCAST, Collective.ALL_GATHER):
            nbytes = call.nbytes * (size if c is Collective.ALL_GATHER else 1)
            self.inb = self.outb = np.empty(nbytes, np.uint8)
            if c is Collective.BROADCAST:
                self.data_req = comm.Bcast_init([self.inb, MPI.BYTE], call.root)
            else:
                self.lo, self.hi = rank * call.nbytes, (rank + 1) * call.nbytes
                self.data_req = comm.Allgather_init(MPI.IN_PLACE, [self.inb, MPI.BYTE])
            return
        types = native_types(call.dtype, op)
        assert types is not None  # a reduction MPI runs (Natives.supports found its types)
        datatype, mop = types
        if c is Collective.ALL_REDUCE:
            # in place (every rank alike): MPICH copies no send buffer into the result first;
            # the reduced trailer overwrites this rank's, which each start writes again
            extra = self.rider.length if self.rider is not None else 0
            self.inb = self.outb = np.empty(count + extra, call.dtype)
            self.head, self.tail = self.inb[:count], self.inb[count:]
            self.result = self.outb[:count]
            if self.rider is not None:
                self.trailer = self.outb[count:count + len(self.rider.mine)]
            self.data_req = comm.Allreduce_init(MPI.IN_PLACE, [self.inb, datatype], mop)
            return
        self.inb = self.head = np.empty(count, call.dtype)
        if c is Collective.REDUCE:
            self.outb = np.empty(count if rank == call.root else 0, call.dtype)
            self.data_req = comm.Reduce_init([self.inb, datatype],
                                             [self.outb, datatype] if rank == call.root else None,
                                             mop, call.root)
        else:
            self.lo, self.hi, counts = scatter_bounds(call, size, rank)
            self.outb = np.empty(self.hi - self.lo, call.dtype)
            self.data_req = comm.Reduce_scatter_init([self.inb, datatype], [self.outb, datatype],
                                                     counts, mop)

    def verify(self, rank: int, seq: int) -> bool:
        """After an all-reduce with a rider: raise unless every rank had this call; return
        whether some rank's input held NaN."""
        rider, count = self.rider, self.call.count
        assert rider is not None  # only an all-reduce with a rider is verified
        trailer = self.outb[count:]
        if not rider.agrees(trailer):
            raise CollectiveMismatchError(
                f"rank {rank}: call {seq}: ranks called different collectives, or the same one "
                f"with different arguments, at this point (this rank: {self.call.describe()}); "
                "every rank must make the same calls in the same order")
        return rider.any_nan(trailer)

    def free(self) -> None:
        if self.owner is None and self.data_req is not None:  # an active one cannot be freed
            self.data_req.Free()


class Entries:
    """The persistent entries of one communicator, by call signature."""

    def __init__(self, size: int):
        self.size = size
        self.entries: dict[tuple, Entry | None] = {}
        self.made = 0

    def get(self, call: Call, op: ReduceOp | None) -> Entry | None:
        key = pairing_key(call.signature)  # (as its peers' requests are made: by the call)
        entry: Entry | None | Literal[False] = self.entries.get(key, False)
        if entry is False:
            entry = None
            if self.made < tuning.PERSISTENT_CALLS:
                entry = Entry(call, op, self.size)
                self.made += 1
            self.entries[key] = entry
        return entry

    def free(self) -> None:
        for entry in self.entries.values():
            if entry is not None:
                entry.free()
        self.entries = {}


class PersistentRun(NativeRun):
    """One start of an entry: [check,] copy in and start, copy out."""

    __slots__ = ("dst", "entry", "src")

    def __init__(self, natives: Any, call: Call, seq: int, entry: Entry, src: Any, dst: Any):
        mine = local_nans(src if src is not None else dst, entry.nan)
        super().__init__(natives, call, seq, mine, slot=entry.rider is None)
        self.entry, self.src, self.dst = entry, src, dst
        self.steps.append(("entry", self._start))
        natives.lane.join(self)

    def ready(self) -> bool:
        return self.entry.owner is None

    def _start(self) -> Any:
        entry, src, dst = self.entry, self.src, self.dst
        if entry.data_req is None:
            natives = self.natives
            entry.create(natives.comm, natives.size, natives.rank)
        entry.owner = self
        c = entry.collective
        if c is Collective.ALL_GATHER:
            entry.inb[entry.lo:entry.hi] = dst.view(np.uint8)[entry.lo:entry.hi]
        elif c is Collective.BROADCAST:
            if self.natives.rank == entry.root:
                entry.inb[:] = (src if src is not None else dst).view(np.uint8)
        else:
            entry.head[...] = src if src is not None else dst
            if entry.rider is not None:  # (in place: the last run's reduced trailer is there)
                entry.rider.fill(entry.tail, self.mine is not None)
        entry.data_req.Start()
        return entry.data_req

    def landed(self) -> bool:
        entry = self.entry
        if entry.rider is None:
            return False
        try:
            return entry.verify(self.natives.rank, self.seq)
        except CollectiveMismatchError:
            entry.owner = None  # the request completed: the entry is idle, whatever it says
            raise

    def finish(self) -> None:
        entry, dst = self.entry, self.dst
        c = entry.collective
        if c is Collective.ALL_REDUCE:
            dst[...] = entry.result
        elif c is Collective.REDUCE:
            if self.natives.rank == entry.root:
                np.copyto(dst, entry.outb)
        elif c is Collective.REDUCE_SCATTER:
            np.copyto(dst[entry.lo:entry.hi], entry.outb)
        else:  # a broadcast's root too: its result need not be its input
            dst.view(np.uint8)[:] = entry.inb
        entry.owner = None
        if entry.nan and (c is not Collective.REDUCE or self.natives.rank == entry.root):
            lo = entry.lo if c is Collective.REDUCE_SCATTER else 0
            if self.repair is not None:
                self.repair.apply(dst[lo:lo + entry.hi - entry.lo], lo)
            settle_zeros(dst[lo:lo + entry.hi - entry.lo])
        if self.natives.lane.runs:
            self.natives.lane.pump()
