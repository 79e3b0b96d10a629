"""NCCL's own collectives as the transport's native collectives (stream-ordered).

``allReduce``, ``reduce``, ``broadcast``, ``allGather`` and ``reduceScatter`` over all ranks,
on the transport's stream. The core passes MEAN as SUM and divides once afterwards. Dtypes
travel as ``collectives.backends.cupy.nccl_reductions`` says (complex SUM as floats, bool as
bytes, float MAX/MIN as integer keys so NaN survives); others, and reduce-scatters whose rows
do not split evenly, run the library's schedules over NCCL send/recv instead. Across nodes,
``algorithm="two_level"`` (and ``auto`` where a world communicator is impossible, e.g. several
simulated nodes sharing one GPU) runs ``.across_nodes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from collectives.backends.cupy import kernels, nccl_reductions

from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call

from .across_nodes import TwoLevelRun, two_level_ok
from .hot_path import HotAllReduce

NAMES = ("nccl", "native", "two_level")
NCCL_COLLECTIVES = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST,
                              Collective.ALL_GATHER, Collective.REDUCE_SCATTER})


class _Done:
    """A collective already enqueued: complete as far as the host is concerned."""

    holds_turn = False

    def advance(self) -> bool:
        return True

    def pending_peers(self) -> list[int]:
        return []  # (the stream waits for the peers; the host waits for nobody)


class NcclNative:
    """``NativeCollectives`` of ``NcclTransport``."""

    names = NAMES
    methods: tuple[str, ...] = ()
    last: str | None = None  # (one method)

    def __init__(self, transport: Any):
        self.t = transport

    # --- choosing ------------------------------------------------------------------------

    def _plan(self, call: Call):
        if call.op is None:
            return "bytes"
        return nccl_reductions.reduction(self.t.nccl, call.dtype, call.op)

    def mode(self, call: Call) -> str | None:
        """"world" (NCCL's collective), "two_level", or None (a schedule runs it)."""
        t = self.t
        if call.collective not in NCCL_COLLECTIVES:
            return None  # gather, scatter, all-to-all: the library's plans over send/recv
        if call.algorithm == "two_level" or (call.algorithm in ("auto", "native")
                                             and not t.world_possible):
            return "two_level" if two_level_ok(t, call) else None
        if not t.world_possible or self._plan(call) is None:
            return None
        if call.collective is Collective.REDUCE_SCATTER and call.shape[0] % t.size:
            return None  # NCCL needs equal blocks
        return "world"

    def supports(self, call: Call) -> bool:
        return self.mode(call) is not None

    def preferred(self, call: Call) -> bool:
        return True  # NCCL (or the two-level path) beats the library's schedules on GPUs

    # no persistent collectives (every call is one enqueue anyway), but the core's hot path
    # asks prepare() for an agreed all-reduce's quick form: NCCL reads the caller's buffers,
    # so calls of every size take it
    persistent = True
    fast_bytes = 1 << 62

    def prepare(self, call: Call, src: Any, dst: Any, op: ReduceOp | None):
        """``HotAllReduce`` (``.hot_path``) for the core's hot path: an all-reduce NCCL runs as
        one collective, unbound (``src`` and ``dst`` None); None for anything else."""
        if (src is not None or dst is not None or call.collective is not Collective.ALL_REDUCE
                or call.op is ReduceOp.MEAN or self.mode(call) != "world"):
            return None
        plan = self._plan(call)
        return None if plan.keys else HotAllReduce(self.t, call, plan)

    # --- running -------------------------------------------------------------------------

    def start(self, call: Call, src: Any, dst: Any, op: ReduceOp | None, seq: int):
        t = self.t
        if self.mode(call) == "two_level":
            assert op is not None  # two_level_ok: an all-reduce, which has its op
            return TwoLevelRun(t, call, src, dst, op, seq)
        comm = t.comms.get("world", call.describe())
        stream = t.stream.ptr
        collective = call.collective
        if op is None:  # broadcast, all-gather: bytes
            byte, nbytes = t.byte_type, dst.nbytes
            if collective is Collective.BROADCAST:
                send = src if src is not None else dst
                comm.broadcast(send.data.ptr, dst.data.ptr, nbytes, byte, call.root, stream)
            else:
                block = nbytes // t.size
                comm.allGather(dst.data.ptr + t.rank * block, dst.data.ptr, block, byte, stream)
            t.watch(call.describe(), seq)
            return _Done()
        plan = self._plan(call)
        if plan.keys:  # keys are made in dst: the input stays untouched
            if src is not None and src.data.ptr != dst.data.ptr:
                t.arrays.copy(dst, src)
            src = None
            self._keys(dst, call.dtype, op, True)
        send = src if src is not None else dst
        count = dst.size * plan.scale
        if collective is Collective.ALL_REDUCE:
            comm.allReduce(send.data.ptr, dst.data.ptr, count, plan.nccl_type, plan.nccl_op,
                           stream)
        elif collective is Collective.REDUCE:
            comm.reduce(send.data.ptr, dst.data.ptr, count, plan.nccl_type, plan.nccl_op,
                        call.root, stream)
        else:  # reduce-scatter: this rank's block lands where the core reads it
            block = count // t.size
            offset = t.rank * block * plan.view.itemsize
            comm.reduceScatter(send.data.ptr, dst.data.ptr + offset, block, plan.nccl_type,
                               plan.nccl_op, stream)
        if plan.keys:
            self._keys(dst, call.dtype, op, False)
        t.watch(call.describe(), seq)
        return _Done()

    def _keys(self, buf, dtype: np.dtype, op: ReduceOp, forward: bool) -> None:
        to_key, from_key = kernels.key_kernels(np.dtype(dtype), op)
        key = np.dtype(np.int32 if np.dtype(dtype).itemsize == 4 else np.int64)
        with self.t.on_stream():
            (to_key if forward else from_key)(buf.reshape(-1).view(key))
