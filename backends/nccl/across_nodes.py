"""Two-level all-reduce for GPU arrays across nodes: NCCL inside, MPI between.

1. NCCL reduce-scatter inside the node: local rank ``i`` holds the node's total of shard
   ``i`` (the buffer is padded with the op's identity to a multiple of the node's size);
2. the ranks of local rank ``i`` on every node all-reduce shard ``i`` over MPI. The MPI
   wheels are not CUDA-aware, so the shard goes through pinned host memory in chunks: each
   chunk is copied to the host, all-reduced (``Iallreduce``) while the next chunks copy, and
   copied back while later chunks are still in MPI;
3. NCCL all-gather inside the node.

Only ``1/L`` of the buffer crosses nodes per rank (``L`` ranks per node). With one rank per
node (``COLLECTIVES_RANKS_PER_NODE=1``) the NCCL steps are one-rank communicators, so several
processes can share one GPU. Steps 1 and 3 are enqueued on the transport's stream; step 2
needs the host, so ``TwoLevelRun`` is a state machine the engine drives (with its
deadlines) until the last chunk is back on the stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from collectives.backends.cupy import kernels, nccl_reductions

from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call

CHUNK_BYTES = 4 << 20  # pinned staging per chunk: large enough for MPI's bandwidth, small
# enough that the copies of several chunks overlap the MPI work of others


def two_level_ok(transport: Any, call: Call) -> bool:
    """Whether the two-level path runs this call: all-reduce of a dtype NCCL reduces exactly
    whose wire form MPI also reduces (not float16 or bfloat16: MPI has no 16-bit floats)."""
    if call.collective is not Collective.ALL_REDUCE or call.op is None:
        return False
    plan = nccl_reductions.reduction(transport.nccl, call.dtype, call.op)
    return plan is not None and plan.view.kind in "biuf" and plan.view != np.float16


def _mpi_op(op: ReduceOp):
    from mpi4py import MPI

    return {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
            ReduceOp.MIN: MPI.MIN}[op.wire_op]


class TwoLevelRun:
    """One two-level all-reduce in flight: ``advance()`` until True.

    It issues collectives as it advances (each chunk's MPI all-reduce once that chunk's copy
    has landed, NCCL's all-gather once every chunk is back), at moments that differ between
    ranks. So it keeps the communicator's native turn until it finishes (``holds_turn``): a
    later call's NCCL collective on the same stream, or MPI all-reduce on ``cross``, could
    otherwise be issued between them on one rank and before them on another (a deadlock on
    the stream; mixed data on the MPI communicator).
    """

    holds_turn = True

    def __init__(self, t: Any, call: Call, src: Any, dst: Any, op: ReduceOp, seq: int):
        self.t, self.call, self.dst, self.seq = t, call, dst, seq
        plan = nccl_reductions.reduction(t.nccl, call.dtype, op)
        assert plan is not None  # two_level_ok: NCCL reduces this dtype and op exactly
        self.plan = plan
        self.op = op
        node = t.comms.get("node", call.describe())
        self.cross = t.comms.mpi_group("cross")
        local_size, local_rank = node.size(), node.rank_id()
        view = plan.view
        count = dst.size * plan.scale  # elements of the view
        shard = -(-count // local_size)
        padded = shard * local_size
        arrays = t.arrays
        # The working buffer: dst itself, or (to pad it to a multiple of the node's size) a
        # larger one; padded positions only ever meet padded positions, so they hold anything.
        if padded == count:
            work = dst.reshape(-1)
            if src is not None and src.data.ptr != dst.data.ptr:
                arrays.copy(work, src)
        else:
            raw = arrays.empty((padded * view.itemsize,), np.uint8, like=dst)
            work = raw[:dst.nbytes].view(dst.dtype)
            arrays.copy(work, src if src is not None else dst.reshape(-1))
            flat_all = raw.view(view)
        flat = work.view(view) if padded == count else flat_all
        if plan.keys:
            self._keys(flat, True)
        stream = t.stream.ptr
        mine = flat[local_rank * shard:(local_rank + 1) * shard]
        node.reduceScatter(flat.data.ptr, mine.data.ptr, shard, plan.nccl_type, plan.nccl_op,
                           stream)
        self.work, self.flat, self.mine, self.node = work, flat, mine, node
        self.shard, self.local_rank = shard, local_rank
        # MPI's predefined type, which mpi4py infers from the NumPy buffer: a duplicate of it
        # (mpi4py's from_numpy_dtype) is a user type, on which MPICH refuses predefined ops
        self.mpi_op = _mpi_op(op)
        per = max(1, CHUNK_BYTES // view.itemsize)
        self.chunks = [(lo, min(lo + per, shard)) for lo in range(0, shard, per)]
        self.pinned = t.pinned(shard * view.itemsize)
        self.host = self.pinned[:shard * view.itemsize].view(view)
        self.copied = []  # per chunk: the event after its device-to-host copy
        for lo, hi in self.chunks:  # every chunk's copy to the host, queued at once
            self._copy(self.host[lo:hi], mine[lo:hi], to_host=True)
            self.copied.append(t.record())
        self.requests: list = [None] * len(self.chunks)
        self.back = 0  # chunks copied back so far
        self.finished = False
        t.watch(call.describe(), seq)

    def _copy(self, host, device, to_host: bool) -> None:
        """A chunk's copy on the transport's stream, under its device: the progress thread
        that drives asynchronous calls sits on device 0, and a copy must be ordered after
        the reduce-scatter (and before the all-gather) on this rank's GPU."""
        import cupy

        runtime = cupy.cuda.runtime
        with cupy.cuda.Device(self.t.device):
            if to_host:
                runtime.memcpyAsync(host.ctypes.data, device.data.ptr, device.nbytes,
                                    runtime.memcpyDeviceToHost, self.t.stream.ptr)
            else:
                runtime.memcpyAsync(device.data.ptr, host.ctypes.data, device.nbytes,
                                    runtime.memcpyHostToDevice, self.t.stream.ptr)

    def _keys(self, keys, forward: bool) -> None:
        to_key, from_key = kernels.key_kernels(np.dtype(self.call.dtype), self.op.wire_op)
        with self.t.on_stream():
            (to_key if forward else from_key)(keys)

    def advance(self) -> bool:
        """Start MPI on every chunk whose copy has landed; copy back every chunk MPI has
        finished, in order; once all are back, enqueue the all-gather."""
        if self.finished:
            return True
        for k, (lo, hi) in enumerate(self.chunks):
            if self.requests[k] is None:
                if not self.copied[k].done:
                    break  # chunks land in order
                self.requests[k] = self.cross.Iallreduce(_IN_PLACE(), self.host[lo:hi],
                                                         self.mpi_op)
        while self.back < len(self.chunks):
            request = self.requests[self.back]
            if request is None or not request.Test():
                return False
            lo, hi = self.chunks[self.back]
            self._copy(self.host[lo:hi], self.mine[lo:hi], to_host=False)
            self.back += 1
        self._finish()
        return True

    def _finish(self) -> None:
        t = self.t
        self.node.allGather(self.mine.data.ptr, self.flat.data.ptr, self.shard,
                            self.plan.nccl_type, t.stream.ptr)
        if self.plan.keys:
            self._keys(self.flat, False)
        if self.work.data.ptr != self.dst.data.ptr:
            t.arrays.copy(self.dst.reshape(-1), self.work)
        t.release_pinned(self.pinned)
        self.finished = True
        t.watch(self.call.describe(), self.seq)

    def pending_peers(self) -> list[int]:
        """The ranks of this local rank on other nodes (MPI's part is what waits on them)."""
        t = self.t
        return [members[self.local_rank] for members in t.comms.nodes
                if t.rank not in members and len(members) > self.local_rank]


def _IN_PLACE():
    from mpi4py import MPI

    return MPI.IN_PLACE
