"""The shared window of one node's ranks, that the shared-memory all-reduce (``shm``) runs
through: two buffers per rank, each one slot per rank after a header (the call's check value),
and a flag per rank (the last round it arrived at). Made by the first call, at a barrier every
rank has passed; kept until ``free()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import shm_cma, shm_shared, tuning
from .waiting import node_oversubscribed

ALIGN = 4096
HEADER = 64  # bytes before each buffer: the call's check value
FLAG = 64  # bytes before the buffers of each segment: the last round this rank arrived at
SLOT_ALIGN = 64  # a slot's bytes: a multiple of every dtype's size (and of a cache line)


class SharedWindow:
    """The shared window of one node's ranks."""

    def __init__(self, node: Any, size: int):
        self.node = node  # Split_type(COMM_TYPE_SHARED) of the data communicator
        self.n, self.me = node.Get_size(), node.Get_rank()
        self.single_node = self.n == size
        self.win: Any = None
        self.half = 0
        self.segments: list[np.ndarray] = []
        self.flags: list[np.ndarray] = []
        self._scratch = np.empty(0, np.uint8)
        self.calls = 0  # rounds numbered so far (their parity picks the buffer)
        self.slot = 0  # bytes of each rank's slot in a buffer, fixed by the first call
        # every rank can read the others' memory (asked here, where every rank constructs
        # the window at once: later, a collective could cross a call's barriers)
        self.direct = self.n > 1 and shm_cma.usable(node)
        self.spin = 0.0  # seconds a wait between rounds spins (0 on an oversubscribed node)
        self.shared = shm_shared.SharedArrays(node, self.single_node)  # (shared_empty)

    def slot_bytes(self) -> int:
        """Each buffer holds one slot per rank, at the same bytes for every call (whatever
        its dtype or length), so that a slot's role never changes: see the module docstring."""
        if not self.slot:
            per_rank = -(-max(tuning.SHM_ROUND_BYTES, 1) // self.n)
            self.slot = -(-per_rank // SLOT_ALIGN) * SLOT_ALIGN
        return self.slot

    def fits(self) -> bool:
        return HEADER + self.n * self.slot_bytes() <= self.half

    def grow(self) -> None:
        """A window of two buffers of n slots (collective: every rank is past a barrier)."""
        half = -(-(HEADER + self.n * self.slot_bytes()) // ALIGN) * ALIGN
        self.free()
        self.spin = 0.0 if node_oversubscribed(self.node) else tuning.SHM_SPIN_SECONDS
        win = MPI.Win.Allocate_shared(FLAG + 2 * half, 1, comm=self.node)
        win.Lock_all(MPI.MODE_NOCHECK)  # one passive epoch for the window's life; Sync() fences
        self.win, self.half = win, half
        # (mpi4py's stubs make its buffer a Buffer from Python 3.12 on only)
        self.segments = [np.frombuffer(win.Shared_query(r)[0], np.uint8)  # type: ignore[call-overload]
                         for r in range(self.n)]
        self.flags = [segment[:8].view(np.int64) for segment in self.segments]
        self.flags[self.me][0] = 0

    def arrive(self, number: int) -> None:
        """Tell the others this rank is at round ``number`` (its earlier stores visible)."""
        self.win.Sync()
        self.flags[self.me][0] = number

    def arrived(self, number: int) -> bool:
        """Whether every rank is at round ``number`` or later (else MPI progresses: a peer
        may still wait for this rank's part of the first barrier)."""
        if all(int(flag[0]) >= number for flag in self.flags):
            return True
        self.node.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        return False

    def scratch(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of this rank's private memory, kept from call to call (fresh pages would
        fault in every time)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def free(self) -> None:
        if self.win is not None:
            self.segments, self.flags = [], []
            self.win.Unlock_all()
            self.win.Free()
            self.win, self.half = None, 0
