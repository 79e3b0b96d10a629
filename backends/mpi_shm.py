"""All-reduce through MPI-3 shared memory, for ranks that all share one node (``algorithm="shm"``).

Every rank copies its input into its own segment of a shared window (``Win.Allocate_shared``),
then reduces its ``1/n`` slice straight out of every rank's segment and publishes it, then
copies the other slices out of their owners' segments. Each byte crosses memory about three
times (in, reduce, out) instead of the two copies per message of a transport plus the reduce:
the "one-pass" design of machine-baselines §2.4. Each slice is reduced once, by its owner, in
rank order, so every rank holds the same bits.

Two polled ``Ibarrier`` calls per call order the phases (timeouts as everywhere). The window
holds two buffers used by alternate calls, so a rank may start the next call while a slow peer
still reads the previous one; it grows (collectively: every rank asks for the same size) to
twice the largest payload and stays, until ``free()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from collectives.ops import ReduceOp, combine_into

if TYPE_CHECKING:  # pragma: no cover
    from .mpi import MPITransport

ALIGN = 4096


class SharedAllReduce:
    """The shared window of one node's ranks and the one-pass all-reduce over it."""

    def __init__(self, transport: MPITransport, node):
        self.transport = transport
        self.node = node  # the ranks of this node: Split_type(COMM_TYPE_SHARED)
        self.single_node = node.Get_size() == transport.size
        self.win = None
        self.capacity = 0
        self.segments: list[np.ndarray] = []
        self.calls = 0

    def _ensure(self, nbytes: int) -> int:
        """Bytes per buffer half, growing the window (collectively) when ``nbytes`` exceeds it."""
        from mpi4py import MPI

        half = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if 2 * half <= self.capacity:
            return self.capacity // 2
        half = max(half, self.capacity)  # at least double the old halves: few regrowths
        self.free()
        win = MPI.Win.Allocate_shared(2 * half, 1, comm=self.node)
        win.Lock_all(MPI.MODE_NOCHECK)  # passive epoch for the window's life; Sync() fences
        self.win, self.capacity = win, 2 * half
        self.segments = [np.frombuffer(win.Shared_query(r)[0], np.uint8)
                         for r in range(self.node.Get_size())]
        return half

    def _barrier(self) -> None:
        self.win.Sync()  # our stores are visible before the peers pass the barrier
        self.transport.wait_requests((self.node.Ibarrier(),), self.transport._everyone)
        self.win.Sync()

    def all_reduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        """``buf`` (flat, this rank's input) becomes the reduction over every rank, in place."""
        n, me = self.node.Get_size(), self.node.Get_rank()
        count, nbytes = len(buf), buf.nbytes
        half = self._ensure(nbytes)
        offset = (self.calls % 2) * half
        self.calls += 1
        seg = [s[offset:offset + nbytes].view(buf.dtype) for s in self.segments]
        np.copyto(seg[me], buf)
        self._barrier()
        bounds = [p * count // n for p in range(n + 1)]
        lo, hi = bounds[me], bounds[me + 1]
        if hi > lo:
            combine_into(op, buf[lo:hi], seg[0][lo:hi], (s[lo:hi] for s in seg[1:]))
            seg[me][lo:hi] = buf[lo:hi]
        self._barrier()
        for p in range(n):
            if p != me and bounds[p + 1] > bounds[p]:
                buf[bounds[p]:bounds[p + 1]] = seg[p][bounds[p]:bounds[p + 1]]

    def free(self) -> None:
        """Release the window (collective over the node)."""
        if self.win is not None:
            self.segments = []
            self.win.Unlock_all()
            self.win.Free()
            self.win, self.capacity = None, 0
