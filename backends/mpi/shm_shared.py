"""Arrays in memory every rank of a node maps (``Communicator.shared_empty``), and the
shared-memory all-reduce's way through them.

``SharedArrays.allocate`` makes one MPI-3 shared window per call (``Win.Allocate_shared`` on
the node's communicator: collective there), one segment per rank, and keeps every rank's
segment mapped. An all-reduce through the shared window (``"shm"``) whose input and result
both lie in such segments on every rank copies nothing in and publishes nothing: each rank
reduces its slice, a cache-sized block at a time, reading every rank's input where it lies,
in rank order, and writes the block into every rank's result while it is still in cache;
one barrier after that ends the call (every result is whole, and no rank touches another's
memory again). Only a slice's owner reads that slice of any input, and it writes the slice's
results after reading it, so the call is right in place too. Bytes per rank for S bytes over
n ranks: reads S, writes S, less than the SPMD bound of ``benchmarks/ceiling.py`` counts
(which reads the reduced slices back: (n-1)/n·S more).

The windows are never freed: an array may outlive its communicator, and freeing a window is
collective while whether a rank still holds the array is not. Allocate them once, as a
training loop allocates its gradient buckets once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from collectives.arrays import NUMPY
from collectives.ops import ReduceOp

from . import tuning

SHARED = 1  # header word MODE: this rank's input and result lie in shared segments
BLOCK, SRC, DST, MODE = 4, 5, 6, 7  # header words after the direct path's (check, seq, pid, address)

_WINDOWS: list = []  # every window made, kept for the life of the process (module docstring)


class Place(NamedTuple):
    """Where an array lies: window ``block``, byte ``offset`` into this rank's segment."""

    block: int
    offset: int


class SharedArrays:
    """The node's shared segments made for one transport's communicator, in order of
    allocation (the same order on every rank, so a window's index names it everywhere)."""

    def __init__(self, node: Any, single_node: bool):
        self.node = node
        self.me = node.Get_rank()
        self.single_node = single_node  # (the shared-memory all-reduce runs on one node only)
        self.segments: list[list[np.ndarray]] = []  # per window: every rank's segment
        self.spans: list[tuple[int, int]] = []  # per window: this rank's (first, end) address

    def allocate(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of this rank's segment of a new window (collective on the node), as
        bytes; zeroed."""
        win = MPI.Win.Allocate_shared(max(int(nbytes), 1), 1, comm=self.node)
        _WINDOWS.append(win)
        # (mpi4py's stubs make its buffer a Buffer from Python 3.12 on only)
        segments = [np.frombuffer(win.Shared_query(r)[0], np.uint8)  # type: ignore[call-overload]
                    for r in range(self.node.Get_size())]
        own = segments[self.me][:nbytes]
        own[:] = 0  # (no peer writes it outside an all-reduce, which starts with a barrier)
        first = own.ctypes.data
        self.segments.append(segments)
        self.spans.append((first, first + nbytes))
        return own

    def algorithm_for(self, x: Any, out: Any) -> str | None:
        """What ``auto`` runs for an all-reduce of ``x`` into ``out`` (``tuning.SHARED_AUTO``:
        the shared-memory all-reduce) where both lie in shared arrays, on one node, from
        ``tuning.SHM_SHARED_FROM_BYTES``; else None (``auto``'s usual choice)."""
        if (not self.spans or not self.single_node or not isinstance(x, np.ndarray)
                or not isinstance(out, np.ndarray) or x.nbytes < tuning.SHM_SHARED_FROM_BYTES):
            return None
        return tuning.SHARED_AUTO if place_of(self, x, out) is not None else None

    def locate(self, x: Any) -> Place | None:
        """Where the contiguous ``x`` lies in this rank's segments, or None."""
        if not self.spans or not x.flags.c_contiguous:
            return None
        first = x.ctypes.data
        end = first + x.nbytes
        for block, (lo, hi) in enumerate(self.spans):
            if lo <= first and end <= hi:
                return Place(block, first - lo)
        return None

    def peer(self, block: int, rank: int, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements of rank ``rank``'s segment of window ``block`` from ``offset``."""
        return self.segments[block][rank][offset:offset + count * dtype.itemsize].view(dtype)


def place_of(shared: SharedArrays | None, src: Any, dst: Any) -> tuple[Place, Place] | None:
    """Where input and result lie, where both lie in shared segments (one window), else None."""
    if shared is None:
        return None
    out = shared.locate(dst)
    if out is None:
        return None
    into = out if src is dst else shared.locate(src)
    if into is None or into.block != out.block:
        return None
    return into, out


def publish(header: np.ndarray, places: tuple[Place, Place] | None) -> None:
    """This rank's mode and places, in its header beside the call's check value."""
    if places is None:
        header[MODE] = 0
        return
    header[MODE], header[BLOCK], header[SRC], header[DST] = (
        SHARED, places[1].block, places[0].offset, places[1].offset)


def disagreement(headers: list[np.ndarray]) -> str | None:
    """Why the ranks cannot run a call together where some pass shared arrays (every rank's
    input and result must lie in shared segments of one window, or no rank's), else None."""
    shared = [r for r, h in enumerate(headers) if int(h[MODE]) == SHARED]
    if not shared:
        return None
    if len(shared) < len(headers):
        others = [r for r in range(len(headers)) if r not in shared]
        return (f"the input and result of rank(s) {shared} lie in shared arrays "
                f"(Communicator.shared_empty) and those of rank(s) {others} do not; pass shared "
                "arrays on every rank or on none")
    blocks = [int(h[BLOCK]) for h in headers]
    if len(set(blocks)) > 1:
        return (f"the ranks' shared arrays come from different shared_empty calls (by rank, "
                f"the number of each one's call: {blocks}); pass arrays of the same call on "
                "every rank")
    return None


class SharedRun:
    """One all-reduce whose every rank's input and result are shared: views of them all."""

    __slots__ = ("inputs", "me", "results", "through_scratch")

    def __init__(self, shared: SharedArrays, headers: list[np.ndarray], dst: np.ndarray):
        block, dtype, count = int(headers[0][BLOCK]), dst.dtype, len(dst)
        self.inputs = [shared.peer(block, r, int(h[SRC]), dtype, count) for r, h in enumerate(headers)]
        self.results = [shared.peer(block, r, int(h[DST]), dtype, count) for r, h in enumerate(headers)]
        self.me = shared.me
        me = headers[shared.me]
        # in place, the result is this rank's input, which the rank-order reduction reads:
        # writing it in passing is safe where the first step reads it (ranks 0 and 1)
        self.through_scratch = int(me[SRC]) == int(me[DST]) and shared.me > 1

    def reduce(self, op: ReduceOp, dst: np.ndarray, lo: int, hi: int, scratch: np.ndarray) -> None:
        """Elements ``lo:hi`` of the result, from every rank's input in rank order, into
        ``dst`` and every other rank's result, a block of ``scratch``'s bytes at a time;
        through ``scratch`` where the result would overwrite input the reduction still
        reads."""
        inputs, me = self.inputs, self.me
        others = [r for r in range(len(self.results)) if r != me]
        step = max(scratch.nbytes // dst.itemsize, 1)
        block_of = scratch.view(dst.dtype) if self.through_scratch else None
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            block = dst[a:b] if block_of is None else block_of[:b - a]
            NUMPY.combine_into(op, block, inputs[0][a:b], [x[a:b] for x in inputs[1:]])
            if block_of is not None:
                dst[a:b] = block
            for r in others:
                self.results[r][a:b] = block
