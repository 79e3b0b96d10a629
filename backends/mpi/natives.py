"""The transport's own collectives: MPI's (``"native"``, ``"mpi"``) and the shared window's
(``"shm"``), as the core's :class:`~collectives.transport.NativeCollectives`.

What MPI reduces itself runs natively (``datatypes.native_types``); broadcasts and gathers
move bytes, so every dtype runs natively. Small calls run as persistent collectives
(``persistent.py``), large ones as non-blocking calls in pieces (``nonblocking.py``); either
way a check all-reduce rides with the data (``checks.py``) and the lane keeps every rank's
collectives in call order (``lane.py``). ``prepare`` binds a call to its buffers; each start
goes the same way as an unprepared call, so prepared, fast-path and plain calls of one
signature always run the same MPI operations on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays import ResultPool
from collectives.calls import Call
from collectives.ops import ReduceOp
from collectives.schedule import Collective

from . import nonblocking, tuning
from .checks import CheckSlots
from .datatypes import native_types
from .lane import Lane
from .persistent import Entries, PersistentRun


class Bound:
    """A call bound to its buffers (``prepare``): every start runs it as a plain call would."""

    __slots__ = ("call", "dst", "natives", "op", "run", "src")

    def __init__(self, natives: MPINatives, call: Call, src: Any, dst: Any, op: ReduceOp | None):
        self.natives, self.call, self.src, self.dst, self.op = natives, call, src, dst, op
        self.run: Any = None

    def start(self, seq: int) -> None:
        self.run = self.natives.start(self.call, self.src, self.dst, self.op, seq)

    def advance(self) -> bool:
        return self.run.advance()

    def free(self) -> None:
        self.run = None


class MPINatives:
    """MPI's collectives (and the shared-memory all-reduce) on the data communicator."""

    names = tuning.NAMES

    def __init__(self, comm: Any, control: Any, shm: Any):
        self.comm, self.control, self.shm = comm, control, shm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.single_node = shm is not None and shm.single_node
        self.lane = Lane()
        self.checks = CheckSlots(comm, tuning.CHECKS_IN_FLIGHT)
        self.entries = Entries(comm, self.size, self.rank)
        self.pool = ResultPool(min_bytes=0)
        self.abandoned: list = []  # failed runs whose requests MPI still holds
        self.last: str | None = None  # what the latest native call ran: "mpi" or "shm"

    def supports(self, call: Call) -> bool:
        collective = call.collective
        if call.algorithm in tuning.SHM_NAMES:
            return collective is Collective.ALL_REDUCE and self.single_node
        if collective in (Collective.BROADCAST, Collective.ALL_GATHER):
            return True  # bytes: every dtype
        if native_types(call.dtype, call.op) is None:
            return False
        return collective is not Collective.REDUCE_SCATTER or call.count <= tuning.MAX_COUNT

    def preferred(self, call: Call) -> bool:
        return (tuning.prefer_native(call.collective, self.size, call.nbytes)
                or tuning.use_shm("auto", call.collective, call.nbytes, self.single_node))

    def start(self, call: Call, src: Any, dst: Any, op: ReduceOp | None, seq: int) -> Any:
        collective = call.collective
        if tuning.use_shm(call.algorithm, collective, call.nbytes, self.single_node):
            self.last = "shm"
            return self.shm.start(call, src, dst, op, seq, self.lane)
        self.last = "mpi"
        total = call.nbytes * self.size if collective is Collective.ALL_GATHER else call.nbytes
        if tuning.persistent(collective, total):
            entry = self.entries.get(call, op)
            if entry is not None:
                return PersistentRun(self, call, seq, entry, src, dst)
        return nonblocking.start(self, call, src, dst, op, seq)

    def prepare(self, call: Call, src: Any, dst: Any, op: ReduceOp | None) -> Bound:
        return Bound(self, call, src, dst, op)

    def scratch(self, nbytes: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Memory for a copy of an input, reused once the run holding it is done."""
        return self.pool.take(nbytes).view(dtype)[:count]

    def free(self) -> None:
        self.checks.free()
        self.entries.free()
        if self.shm is not None:
            self.shm.free()
