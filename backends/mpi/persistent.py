"""Small native collectives as MPI-4 persistent collectives over the transport's buffers.

A persistent start skips what MPICH does on every non-blocking call (building the schedule),
which is most of a small collective's cost. MPICH matches persistent collectives request by
request (the k-th ``*_init`` of one rank with the k-th of every other) and never with a
non-blocking or blocking call, so whether a call runs persistent must not depend on which
code path issued it: every native call of the persistent class (``tuning.persistent``) goes
through :class:`Entries`, whether it came from a plain call, a prepared call or the fast
path, and the first ``PERSISTENT_CALLS`` distinct signatures (in call order: the same on
every rank) get an entry, created at their first call (ranks that disagree about a call
still create one each, so their later requests stay paired; their checks fail first). An
entry's request is bound to buffers of its own: each run copies its input in and its result
out (for payloads this small the copies cost less than any per-call setup). One entry serves
one run at a time; a second
call with the same signature waits for it in the lane.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.calls import Call
from collectives.ops import ReduceOp
from collectives.schedule import Collective

from . import tuning
from .checks import local_nans
from .datatypes import has_nan_issue, native_types
from .nonblocking import scatter_bounds
from .runs import NativeRun


class Entry:
    """The persistent request of one call signature, over buffers of its own. It is created
    (``MPI_*_init``, itself a collective in MPI's order of collectives) when its first run
    issues, in the lane, so that it takes the same place among the collectives on every rank."""

    __slots__ = ("call", "collective", "data_req", "inb", "lo", "hi", "nan", "op", "outb",
                 "owner", "root")

    def __init__(self, call: Call, op: ReduceOp | None):
        self.call, self.op = call, op
        self.collective, self.root = call.collective, call.root
        self.owner: Any = None
        self.data_req: Any = None
        self.nan = op is not None and has_nan_issue(call.dtype, op)

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
        datatype, mop = native_types(call.dtype, op)
        self.inb = np.empty(count, call.dtype)
        if c is Collective.ALL_REDUCE:
            self.outb = np.empty(count, call.dtype)
            self.data_req = comm.Allreduce_init([self.inb, datatype], [self.outb, datatype], mop)
        elif c is Collective.REDUCE:
            self.outb = np.empty(count if rank == call.root else 0, call.dtype)
            self.data_req = comm.Reduce_init([self.inb, datatype],
                                             [self.outb, datatype] if rank == call.root else None,
                                             mop, call.root)
        else:
            self.lo, self.hi, counts = scatter_bounds(call, size, rank)
            self.outb = np.empty(self.hi - self.lo, call.dtype)
            self.data_req = comm.Reduce_scatter_init([self.inb, datatype], [self.outb, datatype],
                                                     counts, mop)

    def free(self) -> None:
        if self.owner is None and self.data_req is not None:  # an active one cannot be freed
            self.data_req.Free()


class Entries:
    """The persistent entries of one communicator, by call signature."""

    def __init__(self, comm: Any, size: int, rank: int):
        self.comm, self.size, self.rank = comm, size, rank
        self.entries: dict[tuple, Entry | None] = {}

    def get(self, call: Call, op: ReduceOp | None) -> Entry | None:
        entry = self.entries.get(call.signature, False)
        if entry is False:
            made = sum(e is not None for e in self.entries.values())
            entry = Entry(call, op) if made < tuning.PERSISTENT_CALLS else None
            self.entries[call.signature] = entry
        return entry

    def free(self) -> None:
        for entry in self.entries.values():
            if entry is not None:
                entry.free()
        self.entries = {}


class PersistentRun(NativeRun):
    """One start of an entry: check, copy in and start, copy out."""

    __slots__ = ("dst", "entry", "src")

    def __init__(self, natives: Any, call: Call, seq: int, entry: Entry, src: Any, dst: Any):
        mine = local_nans(src if src is not None else dst, entry.nan)
        super().__init__(natives, call, seq, mine)
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
            np.copyto(entry.inb, src if src is not None else dst)
        entry.data_req.Start()
        return entry.data_req

    def finish(self) -> None:
        entry, dst = self.entry, self.dst
        c = entry.collective
        if c is Collective.ALL_REDUCE:
            np.copyto(dst, entry.outb)
        elif c is Collective.REDUCE:
            if self.natives.rank == entry.root:
                np.copyto(dst, entry.outb)
        elif c is Collective.REDUCE_SCATTER:
            np.copyto(dst[entry.lo:entry.hi], entry.outb)
        elif c is Collective.BROADCAST:
            if self.natives.rank != entry.root:
                dst.view(np.uint8)[:] = entry.inb
        else:
            dst.view(np.uint8)[:] = entry.inb
        entry.owner = None
        if self.repair is not None:
            lo = entry.lo if c is Collective.REDUCE_SCATTER else 0
            if c is not Collective.REDUCE or self.natives.rank == entry.root:
                self.repair.apply(dst[lo:lo + len(entry.outb)], lo)
        if self.natives.lane.runs:
            self.natives.lane.pump()
