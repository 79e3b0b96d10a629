"""The array backend for CuPy arrays: allocation, copies and combines on the right device.

Every operation is enqueued, never waited for, under its destination's device, on the stream
`placement.Placement` names for it. Before enqueueing, each operation tells
``on_enqueue(dst, srcs)``, the arrays it writes and reads, so that a multi-device executor can
order streams.

Copies are ``cudaMemcpyAsync`` (same GPU) or ``cudaMemcpyPeerAsync`` (another GPU: direct
where peer access is possible, staged through host memory by the driver otherwise). A combine
reads a source on another GPU directly where peer access is possible (through a view that
names the destination device, so CuPy launches there), and otherwise first copies it into
scratch memory on the destination device.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.algorithms.fusion import DEFAULT_BUCKET_BYTES
from collectives.ops import ReduceOp

from . import gather, kernels
from .kept import KeptBuckets
from .placement import Placement


def _cupy():
    import cupy

    return cupy


def owns(x: object) -> bool:
    """Whether ``x`` is a CuPy array (the core routes these to this backend; see
    ``collectives.registry.owner_of``): looked up without importing CuPy, which a CuPy array
    has imported already."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


class CupyArrays(KeptBuckets, Placement):
    """``collectives.arrays.ArrayBackend`` for ``cupy.ndarray``."""

    name = "cupy"

    @property
    def xp(self):
        return _cupy()

    # --- ArrayBackend -------------------------------------------------------------------

    def owns(self, x: object) -> bool:
        return owns(x)

    def dtype_of(self, x: Any) -> np.dtype:
        return x.dtype

    def alone_bytes(self, x: Any) -> int:
        return DEFAULT_BUCKET_BYTES  # (device memory: a copy costs little beside a call)

    def _check(self, x: Any, what: str) -> None:
        if not self.owns(x):
            raise TypeError(
                f"{what} is a {type(x).__module__}.{type(x).__name__} among CuPy arrays: a "
                "collective's arrays must all be CuPy arrays (one per device) or all NumPy "
                "arrays; move it with cupy.asarray(x) under the device it belongs to")

    def empty(self, shape, dtype, like=None):
        if like is None:  # this backend's device, else the calling thread's current one
            device = self.device if self.device is not None else \
                _cupy().cuda.runtime.getDevice()
            return self.empty_on(device, shape, dtype)
        self._check(like, "an array")
        return self.empty_on(like.device.id, shape, dtype)

    def result(self, shape, dtype, like=None):
        # CuPy's memory pool is the pool: freed blocks are reused in stream order.
        return self.empty(shape, dtype, like)

    def flat(self, x):
        self._check(x, "an array")
        if x.flags.c_contiguous:
            return x if x.ndim == 1 else x.reshape(-1)  # (a reshape costs CuPy microseconds)
        with self.context(x.device.id):  # a new array, before any step of a call reads it
            return _cupy().ascontiguousarray(x).reshape(-1)

    def copy(self, dst, src) -> None:
        self._check(dst, "an output")
        self._check(src, "an input")
        if src.size == 0:
            return
        cp = _cupy()
        dd, sd = dst.device.id, src.device.id
        raw = (dst.flags.c_contiguous and src.flags.c_contiguous and dst.dtype == src.dtype
               and dst.size == src.size)
        if not raw and dd != sd:
            src = self.contiguous_on(src, dd)
            sd, raw = dd, dst.flags.c_contiguous and dst.dtype == src.dtype
        stream = self.enter(dst, (src,))
        if not raw:
            with self.context(dd, stream):
                cp.copyto(dst, src.reshape(dst.shape), casting="unsafe")
            return
        if dd == sd and dst.data.ptr == src.data.ptr:
            return  # the same memory (an in-place call): nothing to move
        runtime = cp.cuda.runtime
        # Under the destination's device: a null stream handle means the current device's
        # legacy stream, and the copy must be ordered with the destination's work.
        with cp.cuda.Device(dd):
            handle = (stream if stream is not None else self.stream(dd)).ptr
            if dd == sd:
                runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                    runtime.memcpyDeviceToDevice, handle)
            else:
                runtime.memcpyPeerAsync(dst.data.ptr, dd, src.data.ptr, sd, src.nbytes, handle)

    def _launch(self, op: ReduceOp, dst, first, srcs: Sequence) -> None:
        device = dst.device.id
        srcs = list(srcs)
        stream = self.enter(dst, srcs + ([first] if first is not None else []))
        readable = [self.readable(s, device, stream) for s in srcs]
        start = self.readable(first, device, stream) if first is not None else None
        with self.context(device, stream):
            for i in range(0, max(len(readable), 1), kernels.MAX_ARITY):
                part = readable[i:i + kernels.MAX_ARITY]
                if start is not None and i == 0:
                    kernels.combine_kernel(op.wire_op, len(part), True)(start, *part, dst)
                elif part:
                    kernels.combine_kernel(op.wire_op, len(part), False)(*part, dst)

    def round_inward(self, narrow, exact, limit, inside) -> None:
        if not narrow.size:
            return
        kind = narrow.dtype.type
        device = narrow.device.id
        stream = self.enter(narrow, (exact,))
        if not gather.available():  # (an array module without kernels of its own: on the host)
            host = narrow.get()
            np.clip(host, -inside, inside, out=host, where=np.abs(exact.get()) <= limit)
            with self.context(device, stream):
                narrow.set(host)
            return
        with self.context(device, stream):  # (one pass, no look at the values first: a wait)
            kernels.inward_kernel()(exact, float(limit), kind(-inside), kind(inside), narrow)

    def spread(self, op: ReduceOp, dsts: Sequence, srcs: Sequence) -> bool:
        """Every ``dsts[i] = op(srcs[0], srcs[1], ...)``, left to right, in one launch: True
        where it ran (every array on one GPU, as many outputs as inputs, at most
        ``kernels.MAX_ARITY``), False where the caller must combine and copy instead. An
        output may be its own input (each element is read before it is written)."""
        n = len(srcs)
        if not 1 < n <= kernels.MAX_ARITY or len(dsts) != n or op is ReduceOp.MEAN:
            return False
        device = dsts[0].device.id
        if not gather.available() or any(a.device.id != device for a in (*dsts, *srcs)):
            return False  # (a stand-in for CuPy compiles no kernels of its own)
        # ordered after everything it reads and writes; the other outputs' streams (one
        # stream, unless the owner gives logical devices streams of their own) after it
        stream = self.enter(dsts[0], [*srcs, *dsts[1:]])
        with self.context(device, stream):
            kernels.spread_kernel(op.wire_op, n)(*srcs, *dsts)
        for dst in dsts[1:]:
            self.enter(dst, [dsts[0]])
        return True

    def combine(self, op, dst, srcs) -> None:
        if dst.size and len(srcs):
            self._launch(op, dst, None, srcs)

    def combine_into(self, op, dst, first, srcs) -> None:
        if not dst.size:
            return
        if not len(srcs):
            self.copy(dst, first)
            return
        self._launch(op, dst, first, srcs)

    def divide(self, total, count, out=None):
        from collectives.ops import result_dtype

        self._check(total, "a total")
        if out is None:
            out = self.empty(total.shape, result_dtype(ReduceOp.MEAN, total.dtype), like=total)
        if total.size:
            device = out.device.id
            stream = self.enter(out, (total,))
            source = self.readable(total, device, stream)
            if source.shape != out.shape:
                source = source.reshape(out.shape)
            with self.context(device, stream):
                kernels.divide_kernel(np.dtype(total.dtype))(source, int(count), out)
        return out

    def concatenate(self, arrays, axis):
        arrays = list(arrays)  # (blocks of one array on one device: no ordering needed)
        with self.context(arrays[0].device.id):
            return _cupy().concatenate(arrays, axis=axis)

    def fuse(self, arrays, out=None, views=None):
        # (``views`` of ``out``, where it is a kept bucket: the gather needs none)
        # (the arrays were checked; the gather reads contiguous ones as they are, whatever
        # their shape, and needs copies of the others)
        flats = [a if a.flags.c_contiguous else self.flat(a) for a in arrays]
        if len(flats) < 2 or not gather.available():
            fused = self.concatenate([f if f.ndim == 1 else f.reshape(-1) for f in flats], 0)
            if out is not None:
                self.copy(out, fused)
                return out
            return fused
        with self.context(flats[0].device.id):  # one launch, and little host time per array
            if out is None:
                out = _cupy().empty((sum(f.size for f in flats),), flats[0].dtype)
            return gather.gather(flats, out)

    def contiguous(self, x) -> bool:
        return bool(x.flags.c_contiguous)

    def writable(self, x) -> bool:
        return True  # device memory has no read-only flag

    def misplaced(self, x) -> str | None:
        if self.device is None or x.device.id == self.device:
            return None  # (the multi-device backend takes every GPU: results stay on theirs)
        return (f"is on GPU {x.device.id}, but this rank's communicator works on GPU "
                f"{self.device}; make it there (under cupy.cuda.Device({self.device})) or "
                "pass no out=")

    def extent(self, x) -> tuple[int, int, int]:
        start = end = x.data.ptr
        if x.flags.c_contiguous:  # (the usual case, asked on every call: no walk of strides)
            return x.device.id, start, start + x.nbytes
        if x.size:
            for n, stride in zip(x.shape, x.strides):
                if stride < 0:
                    start += (n - 1) * stride
                else:
                    end += (n - 1) * stride
            end += x.itemsize
        return x.device.id, start, end
