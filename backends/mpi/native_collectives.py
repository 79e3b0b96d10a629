"""The transport's own collectives: MPI's (``"native"``, ``"mpi"``) and the shared window's
(``"shm"``), as the core's ``NativeCollectives``.

What MPI reduces itself runs natively (``datatypes.native_types``); broadcasts and gathers
move bytes, so every dtype runs natively. Small calls run as persistent collectives
(``persistent.py``), large ones as non-blocking calls in pieces (``nonblocking.py``); either
way the call's check rides with the data (``checks.py``, ``rider.py``) and the lane keeps
every rank's collectives in call order (``lane.py``). ``prepare`` binds a call to its
buffers (``hot_path.py``); each start goes the same way as an unprepared call, so prepared,
hot and plain calls of one signature always run the same MPI operations on every rank.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np

from collectives.algorithms.schedule import Collective
from collectives.arrays import ResultPool
from collectives.errors import CollectiveMismatchError
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call
from collectives.runtime.transport import FAST_BYTES

from . import nonblocking, tuning
from .checks import CheckSlots
from .datatypes import native_types
from .hot_path import SPIN_SECONDS, Bound
from .lane import Lane
from .persistent import Entries, PersistentRun
from .shm import ShmRun

ASK_EVERY = 0.25  # seconds between two questions of a stalled call to its peers
NATIVE_COLLECTIVES = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST,
                      Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


class MPINatives:
    """MPI's collectives (and the shared-memory all-reduce) on the data communicator."""

    names = tuning.NAMES
    methods = ("shm",)  # auto's other candidate, where calibration timed it
    persistent = True  # MPI-4's persistent collectives (``prepare``)
    fast_bytes = FAST_BYTES  # the hot path's default limit: its quick form copies the payload

    def __init__(self, comm: Any, control: Any, shm: Any, notices: Any):
        self.comm, self.control, self.shm, self.notices = comm, control, shm, notices
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.single_node = shm is not None and shm.single_node
        self.lane = Lane()
        self.checks = CheckSlots(comm, tuning.CHECKS_IN_FLIGHT)
        self.entries = Entries(self.size)
        self.pool = ResultPool(min_bytes=0)
        self.inflight: dict[int, Call] = {}  # native calls not yet complete, by seq
        self.abandoned: list = []  # failed runs whose requests MPI still holds
        self.last: str | None = None  # what the latest native call ran: "mpi" or "shm"
        self.bounds: weakref.WeakSet[Bound] = weakref.WeakSet()  # calls bound by prepare
        self.spin = SPIN_SECONDS  # how long the hot path spins (the transport may say 0)
        self._asked: tuple[int, int, float] | None = None  # (about seq, question, when)

    def supports(self, call: Call) -> bool:
        collective = call.collective
        if collective not in NATIVE_COLLECTIVES:
            return False  # gather, scatter, all-to-all: the schedules move them
        if call.algorithm in tuning.SHM_NAMES:
            return collective is Collective.ALL_REDUCE and self.single_node
        if collective in (Collective.BROADCAST, Collective.ALL_GATHER):
            return True  # bytes: every dtype
        if native_types(call.dtype, call.op) is None:
            return False
        return collective is not Collective.REDUCE_SCATTER or call.count <= tuning.MAX_COUNT

    def preferred(self, call: Call) -> bool:
        return (tuning.prefer_native(call.collective, self.size, call.nbytes, self.single_node)
                or tuning.use_shm("auto", call.collective, call.nbytes, self.single_node, self.size))

    def start(self, call: Call, src: Any, dst: Any, op: ReduceOp | None, seq: int) -> Any:
        collective = call.collective
        if tuning.use_shm(call.algorithm, collective, call.nbytes, self.single_node, self.size):
            self.last = "shm"
            assert op is not None  # (use_shm picks all-reduces alone)
            return ShmRun(self.shm, call, src, dst, op, seq, self)
        self.last = "mpi"
        total = call.nbytes * self.size if collective is Collective.ALL_GATHER else call.nbytes
        if tuning.persistent(collective, total):
            entry = self.entries.get(call, op)
            if entry is not None:
                return PersistentRun(self, call, seq, entry, src, dst)
        return nonblocking.start(self, call, src, dst, op, seq)

    def prepare(self, call: Call, src: Any, dst: Any, op: ReduceOp | None) -> Bound:
        bound = Bound(self, call, src, dst, op)
        self.bounds.add(bound)  # (a hot call publishes nothing: a rank's exit asks them)
        return bound

    def latest_seq(self) -> int:
        """The latest call a bound (hot) collective of this transport ran (0: none)."""
        return max((bound.seq for bound in list(self.bounds)), default=0)

    def scratch(self, nbytes: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Memory for a copy of an input, reused once the run holding it is done."""
        return self.pool.take(nbytes).view(dtype)[:count]

    def stalled(self, seq: int, call: Call) -> None:
        """Call ``seq`` has waited long: ask the peers which call they run under the number
        of the oldest native call in flight (the one every later call waits behind), and
        raise ``CollectiveMismatchError`` if one runs another call under it. Every stalled
        call lands here, so this costs O(1): one question to each peer every ``ASK_EVERY``
        seconds, however many calls are in flight."""
        now = time.perf_counter()
        asked = self._asked
        if asked is not None:
            about, number, when = asked
            if about == seq:
                for peer, calls in self.notices.answers(number).items():
                    theirs = calls.get(seq)
                    if theirs is not None and theirs[0] != call.check and not _opening_of(
                            theirs[1], call):
                        raise CollectiveMismatchError(
                            f"rank {self.rank}: call {seq}: rank {peer} runs {theirs[1]} where "
                            f"this rank runs {call.describe_fully()}: every rank must make the same "
                            "calls in the same order")
            if now - when <= ASK_EVERY:
                return
        oldest = min(self.inflight, default=seq)
        self._asked = (oldest, self.notices.ask_later(about=oldest), now)

    def free(self) -> None:
        self.checks.free()
        self.entries.free()
        if self.shm is not None:
            self.shm.free()


def _opening_of(theirs: str, call: Call) -> bool:
    """Whether a peer's call, as it described it, is ``call``'s broadcast before the root's
    descriptor reached it (``from_root.Header``: its root alone, so its check differs): the
    same call, not a mismatch (a stalled native broadcast's root raised one, on a loaded
    machine, and broke the communicator)."""
    return call.collective is Collective.BROADCAST and theirs == f"broadcast(root={call.root})"
