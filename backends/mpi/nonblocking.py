"""Native collectives as non-blocking MPI calls on the caller's buffers (large payloads).

Each builder turns one call into a run: its steps (``Iallreduce``, ``Ireduce``, ``Ibcast``,
``Iallgather``, ``Ireduce_scatter``, in pieces where the payload is large) and what to do
once the data has arrived. Inputs are never written: an input that overlaps the result (or
is the result: in place) is first copied to scratch, since MPI reads and writes the two at
once, and ``MPI_IN_PLACE`` would have to be used by every rank or none.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call

from . import tuning
from .checks import local_nans, settle_zeros
from .datatypes import has_nan_issue, native_types
from .runs import NativeRun


class NonblockingRun(NativeRun):
    """A run of non-blocking collectives, after its check all-reduce."""

    __slots__ = ("after",)

    def __init__(self, natives: Any, call: Call, seq: int, mine: np.ndarray | None, steps: list,
                 after: Any, keep: list):
        super().__init__(natives, call, seq, mine)
        self.steps.extend(steps)
        self.keep = keep
        self.after = after
        natives.lane.join(self)

    def finish(self) -> None:
        if self.after is not None:
            self.after(self.repair)


def _separate(natives: Any, src: np.ndarray | None, dst: np.ndarray) -> np.ndarray:
    """``src`` as an array MPI may read while it writes ``dst``."""
    if src is not None and src is not dst and not np.may_share_memory(src, dst):
        return src
    copy = natives.scratch(dst.nbytes, dst.dtype, len(dst))
    np.copyto(copy, dst if src is None else src)
    return copy


def _pieces(count: int, itemsize: int, throttled: bool = True):
    limit = tuning.MAX_COUNT
    if throttled:
        limit = max(1, min(limit, tuning.NATIVE_PIECE_BYTES // max(itemsize, 1)))
    return tuning.chunks(count, limit)


def _repair(result: np.ndarray, lo: int = 0, zeros: bool = False):
    def after(repair) -> None:
        if repair is not None:
            repair.apply(result, lo)
        if zeros:
            settle_zeros(result)
    return after


def start(natives: Any, call: Call, src: Any, dst: Any, op: ReduceOp | None, seq: int
          ) -> NonblockingRun:
    comm, rank, size = natives.comm, natives.rank, natives.size
    collective = call.collective
    if collective is Collective.BROADCAST:
        raw = dst.view(np.uint8)
        if rank == call.root and src is not None and src is not dst:
            np.copyto(raw, src.view(np.uint8))
        steps = [("call", partial(comm.Ibcast, [raw[a:b], MPI.BYTE], call.root))
                 for a, b in _pieces(len(raw), 1, False)]
        return NonblockingRun(natives, call, seq, None, steps, None, [raw])
    if collective is Collective.ALL_GATHER:
        raw = dst.view(np.uint8)
        block = len(raw) // size
        if block <= tuning.MAX_COUNT:
            steps = [("call", partial(comm.Iallgather, MPI.IN_PLACE, [raw, MPI.BYTE]))]
        else:  # blocks beyond one call's count: each rank broadcasts its block in pieces
            steps = [("call", partial(comm.Ibcast, [raw[p * block + a:p * block + b], MPI.BYTE], p))
                     for p in range(size) for a, b in _pieces(block, 1, False)]
        return NonblockingRun(natives, call, seq, None, steps, None, [raw])
    types = native_types(call.dtype, op)
    assert op is not None and types is not None  # a reduction MPI runs (Natives.supports)
    datatype, mop = types
    src = _separate(natives, src, dst)
    nan = has_nan_issue(call.dtype, op)  # (float MAX and MIN: NaN and signed zeros)
    mine = local_nans(src, nan)
    if collective is Collective.ALL_REDUCE:
        steps = [("piece", partial(comm.Iallreduce, [src[a:b], datatype], [dst[a:b], datatype],
                                   mop)) for a, b in _pieces(len(dst), dst.itemsize)]
        return NonblockingRun(natives, call, seq, mine, steps, _repair(dst, zeros=nan), [src, dst])
    if collective is Collective.REDUCE:
        root = call.root
        steps = [("piece", partial(comm.Ireduce, [src[a:b], datatype],
                                   [dst[a:b], datatype] if rank == root else None, mop, root))
                 for a, b in _pieces(len(dst), dst.itemsize)]
        after = _repair(dst, zeros=nan) if rank == root else None
        return NonblockingRun(natives, call, seq, mine, steps, after, [src, dst])
    lo, hi, counts = scatter_bounds(call, size, rank)
    steps = [("call", partial(comm.Ireduce_scatter, [src, datatype], [dst[lo:hi], datatype],
                              counts, mop))]
    return NonblockingRun(natives, call, seq, mine, steps, _repair(dst[lo:hi], lo, nan), [src, dst])


def scatter_bounds(call: Call, size: int, rank: int) -> tuple[int, int, list[int]]:
    """Rank ``rank``'s elements ``[lo, hi)`` of a reduce-scatter, and every rank's count."""
    rows = call.shape[0] if call.shape else 0
    row = call.count // rows if rows else 0
    bounds = [i * rows // size * row for i in range(size + 1)]
    counts = [bounds[i + 1] - bounds[i] for i in range(size)]
    return bounds[rank], bounds[rank + 1], counts
