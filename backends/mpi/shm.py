"""All-reduce through MPI-3 shared memory, for ranks that all share one node (``"shm"``).

Every rank copies the parts of its input that other ranks reduce into its own segment of a
shared window (``Win.Allocate_shared``), then reduces its ``1/n`` slice from its own input and
every other rank's segment into its segment's free slot (publishing it) and its result, a
cache-sized block at a time, then copies the other slices out of their owners' segments. At
two ranks each rank moves 4.5 times the payload through memory (half in, the reduce reading a
whole and writing half, half published from cache, half out), where point-to-point schedules
move about 7.5 (a copy of the input into the result, two copies per message through MPI's
shared cells, the reduce). Each slice is reduced once, by its owner, in rank order (with
NumPy: NaN propagates, every dtype works), so every rank holds the same bits.

Two ``Ibarrier`` calls on the node's communicator order the phases; they go through the lane
like every native collective, so concurrent calls keep their order. Each segment starts with
a header holding the call's check value: ranks that disagree about the call all see it after
the first barrier and raise. The window holds two buffers used by alternate calls (a rank
may start the next call while a slow peer still reads the previous one); it grows, at a
barrier every rank has passed, to twice the largest payload, and stays until ``free()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.arrays import NUMPY
from collectives.errors import CollectiveMismatchError
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call

from . import tuning

ALIGN = 4096
HEADER = 64  # bytes before each buffer: the call's check value


class SharedWindow:
    """The shared window of one node's ranks."""

    def __init__(self, node: Any, size: int):
        self.node = node  # Split_type(COMM_TYPE_SHARED) of the data communicator
        self.n, self.me = node.Get_size(), node.Get_rank()
        self.single_node = self.n == size
        self.win: Any = None
        self.half = 0
        self.segments: list[np.ndarray] = []
        self.calls = 0

    def fits(self, nbytes: int) -> bool:
        return HEADER + nbytes <= self.half

    def grow(self, nbytes: int) -> None:
        """A window for ``nbytes`` payloads (collective: every rank is past a barrier)."""
        half = -(-(HEADER + max(nbytes, 1)) // ALIGN) * ALIGN
        half = max(half, 2 * self.half)  # at least double: few regrowths
        self.free()
        win = MPI.Win.Allocate_shared(2 * half, 1, comm=self.node)
        win.Lock_all(MPI.MODE_NOCHECK)  # one passive epoch for the window's life; Sync() fences
        self.win, self.half = win, half
        # (mpi4py's stubs make its buffer a Buffer from Python 3.12 on only)
        self.segments = [np.frombuffer(win.Shared_query(r)[0], np.uint8)  # type: ignore[call-overload]
                         for r in range(self.n)]

    def start(self, call: Call, src: Any, dst: Any, op: ReduceOp, seq: int, lane: Any) -> ShmRun:
        return ShmRun(self, call, src, dst, op, seq, lane)

    def free(self) -> None:
        if self.win is not None:
            self.segments = []
            self.win.Unlock_all()
            self.win.Free()
            self.win, self.half = None, 0


class ShmRun:
    """One shared-memory all-reduce: [grow,] copy in, barrier, reduce, barrier, copy out."""

    __slots__ = ("barrier", "call", "dst", "lane", "op", "phase", "seq", "shm", "src", "views")
    holds_turn = False  # (``collectives.runtime.transport.NativeRun``)

    def __init__(self, shm: SharedWindow, call: Call, src: Any, dst: Any, op: ReduceOp,
                 seq: int, lane: Any):
        self.shm, self.call, self.op, self.seq, self.lane = shm, call, op, seq, lane
        self.src = dst if src is None else src
        self.dst = dst
        self.phase = "in"  # or "grow", decided when this run reaches the head of the lane
        self.barrier: Any = None
        self.views: list[np.ndarray] = []
        lane.join(self)

    def _barrier(self) -> None:
        self.shm.win.Sync()  # our stores are visible before the peers pass the barrier
        self.barrier = self.shm.node.Ibarrier()

    def issue(self) -> bool:
        """The lane's side: issue this phase's barrier, if this phase's work is done."""
        shm = self.shm
        if self.phase == "in" and not shm.fits(self.dst.nbytes):
            self.barrier = shm.node.Ibarrier()  # every rank is done with the old window
            self.phase = "growing"
            return False
        if self.phase == "in":
            offset = (shm.calls % 2) * shm.half
            shm.calls += 1
            nbytes = self.dst.nbytes
            header = shm.segments[shm.me][offset:offset + HEADER].view(np.int64)
            header[0], header[1] = self.call.check, self.seq
            self.views = [s[offset:offset + HEADER + nbytes] for s in shm.segments]
            self._copy_in()
            self._barrier()
            self.phase = "reduce"
            return False
        if self.phase == "published":
            self._barrier()
            self.phase = "out"
        return False  # the lane moves on once the result is copied out (``_advance``)

    def advance(self) -> bool:
        try:
            return self._advance()
        except BaseException:
            self.lane.leave(self)
            raise

    def _advance(self) -> bool:
        if self.lane.runs:
            self.lane.pump()
        if self.barrier is None or not self.barrier.Test():
            return False
        self.barrier = None
        shm = self.shm
        if self.phase == "growing":
            shm.grow(self.dst.nbytes)
            self.phase = "in"
        elif self.phase == "reduce":
            shm.win.Sync()
            self._reduce()
            self.phase = "published"
        elif self.phase == "out":
            shm.win.Sync()
            self._copy_out()
            self.phase = "done"
            self.lane.leave(self)  # the next run may write its input now
            return True
        self.lane.pump()
        return False

    def _slices(self) -> list[tuple[int, int]]:
        count, n = len(self.dst), self.shm.n
        return [(p * count // n, (p + 1) * count // n) for p in range(n)]

    def _copy_in(self) -> None:
        """The slices other ranks reduce go into this rank's segment; its own slice stays
        where it is (the reduction reads it from the input)."""
        shm = self.shm
        mine = self.views[shm.me][HEADER:].view(self.dst.dtype)
        for p, (lo, hi) in enumerate(self._slices()):
            if p != shm.me and hi > lo:
                mine[lo:hi] = self.src[lo:hi]

    def _reduce(self) -> None:
        """This rank's slice, from every rank's data in rank order (its own from its input),
        into its segment (for the others) and its result, a cache-sized block at a time."""
        shm, dst = self.shm, self.dst
        checks = {int(v[:HEADER].view(np.int64)[0]) for v in self.views}
        if checks != {self.call.check}:
            raise CollectiveMismatchError(
                f"rank {shm.me}: call {self.seq}: ranks called different collectives, or the same "
                f"one with different arguments, at this point (this rank: {self.call.describe()});"
                " every rank must make the same calls in the same order")
        data = [v[HEADER:].view(dst.dtype) for v in self.views]
        published = data[shm.me]
        data[shm.me] = self.src
        lo, hi = self._slices()[shm.me]
        step = max(tuning.SHM_BLOCK_BYTES // dst.itemsize, 1)
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            block = published[a:b]
            NUMPY.combine_into(self.op, block, data[0][a:b], [d[a:b] for d in data[1:]])
            dst[a:b] = block  # (still in cache; when dst is the input, block a:b is read)

    def _copy_out(self) -> None:
        shm, dst = self.shm, self.dst
        data = [v[HEADER:].view(dst.dtype) for v in self.views]
        for p, (lo, hi) in enumerate(self._slices()):
            if p != shm.me and hi > lo:
                dst[lo:hi] = data[p][lo:hi]

    def pending_peers(self) -> list[int]:
        return [r for r in range(self.shm.n) if r != self.shm.me]
