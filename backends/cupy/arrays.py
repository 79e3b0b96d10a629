"""The array backend for CuPy arrays: allocation, copies and combines on the right device.

Every operation is enqueued, never waited for: on the destination device's stream (the
current stream of that device in the calling thread, or a fixed stream where the owner of
this backend gives one, as the NCCL transport does). Before enqueueing, each operation tells
``on_enqueue(dst_device, src_devices)``, so that a multi-device executor can order streams.

Copies are ``cudaMemcpyAsync`` (same GPU) or ``cudaMemcpyPeerAsync`` (another GPU: direct
where peer access is possible, staged through host memory by the driver otherwise). A combine
reads a source on another GPU directly where peer access is possible (through a view that
names the destination device, so CuPy launches there), and otherwise first copies it into
scratch memory on the destination device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectives.ops import ReduceOp

from . import kernels

Enqueue = Callable[[int, Sequence[int]], None]


def _cupy():
    import cupy

    return cupy


class CupyArrays:
    """``collectives.arrays.ArrayBackend`` for ``cupy.ndarray``."""

    name = "cupy"

    def __init__(self, stream: Any = None, on_enqueue: Enqueue | None = None):
        self.fixed_stream = stream
        self.on_enqueue = on_enqueue
        self._peer: dict[tuple[int, int], bool] = {}
        self._lock = threading.Lock()

    @property
    def xp(self):
        return _cupy()

    # --- where work goes ---------------------------------------------------------------

    def stream(self, device: int):
        """The stream work for ``device`` is enqueued on."""
        if self.fixed_stream is not None:
            return self.fixed_stream
        return _cupy().cuda.get_current_stream(device)

    def _enter(self, dst: int, srcs: Sequence[int] = ()) -> None:
        if self.on_enqueue is not None:
            self.on_enqueue(dst, srcs)

    def _context(self, device: int):
        """Device (and fixed stream) context for CuPy calls that enqueue on the current one."""
        cp = _cupy()
        if self.fixed_stream is None:
            return cp.cuda.Device(device)
        return _Both(cp.cuda.Device(device), self.fixed_stream)

    def order(self, device: int, after: int) -> None:
        """Make ``device``'s stream wait for what ``after``'s stream holds now."""
        if device == after:
            return
        cp = _cupy()
        with cp.cuda.Device(after):
            event = cp.cuda.Event(block=False, disable_timing=True)
            event.record(self.stream(after))
        with cp.cuda.Device(device):
            self.stream(device).wait_event(event)

    def peer_access(self, dst: int, src: int) -> bool:
        """Whether kernels on ``dst`` can read ``src``'s memory (enabled on first ask)."""
        key = (dst, src)
        known = self._peer.get(key)
        if known is not None:
            return known
        cp = _cupy()
        runtime = cp.cuda.runtime
        with self._lock:
            ok = bool(runtime.deviceCanAccessPeer(dst, src))
            if ok:
                with cp.cuda.Device(dst):
                    try:
                        runtime.deviceEnablePeerAccess(src)
                    except runtime.CUDARuntimeError as exc:
                        # already enabled (by CuPy or the user): what we wanted
                        if "PeerAccessAlreadyEnabled" not in str(exc):
                            raise
            self._peer[key] = ok
        return ok

    # --- ArrayBackend -------------------------------------------------------------------

    def owns(self, x: object) -> bool:
        return isinstance(x, _cupy().ndarray)

    def _check(self, x: Any, what: str) -> None:
        if not self.owns(x):
            raise TypeError(
                f"{what} is a {type(x).__module__}.{type(x).__name__} among CuPy arrays: a "
                "collective's arrays must all be CuPy arrays (one per device) or all NumPy "
                "arrays; move it with cupy.asarray(x) under the device it belongs to")

    def empty(self, shape, dtype, like=None):
        if like is None:  # the current device
            return self.empty_on(_cupy().cuda.runtime.getDevice(), shape, dtype)
        self._check(like, "an array")
        return self.empty_on(like.device.id, shape, dtype)

    def empty_on(self, device: int, shape, dtype):
        # Allocated under the stream it is used on: CuPy's pool hands freed memory out again
        # in that stream's order.
        with self._context(device):
            return _cupy().empty(shape, dtype)

    def result(self, shape, dtype, like=None):
        # CuPy's memory pool is the pool: freed blocks are reused in stream order.
        return self.empty(shape, dtype, like)

    def flat(self, x):
        self._check(x, "an array")
        if x.flags.c_contiguous:
            return x.reshape(-1)
        device = x.device.id
        self._enter(device, ())
        with self._context(device):
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
            src = self._contiguous_on(src, dd)
            sd, raw = dd, dst.flags.c_contiguous and dst.dtype == src.dtype
        self._enter(dd, (sd,))
        if not raw:
            with self._context(dd):
                cp.copyto(dst, src.reshape(dst.shape), casting="unsafe")
            return
        stream = self.stream(dd).ptr
        runtime = cp.cuda.runtime
        if dd == sd and dst.data.ptr == src.data.ptr:
            return  # the same memory (an in-place call): nothing to move
        if dd == sd:
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                runtime.memcpyDeviceToDevice, stream)
        else:
            with cp.cuda.Device(dd):
                runtime.memcpyPeerAsync(dst.data.ptr, dd, src.data.ptr, sd, src.nbytes, stream)

    def _contiguous_on(self, x, device: int):
        """A contiguous copy of ``x`` (on another GPU) on ``device``, ordered after ``x``'s
        stream: made contiguous where it lives, then copied across."""
        cp = _cupy()
        home = x.device.id
        self._enter(home, ())
        with self._context(home):
            packed = cp.ascontiguousarray(x)
        here = self.empty_on(device, packed.shape, packed.dtype)
        self._enter(device, (home,))
        self.order(device, home)  # the packing above ran on the other GPU's stream
        with cp.cuda.Device(device):
            cp.cuda.runtime.memcpyPeerAsync(here.data.ptr, device, packed.data.ptr, home,
                                            packed.nbytes, self.stream(device).ptr)
        return here

    def _readable(self, x, device: int):
        """``x`` as a kernel on ``device`` can read it: itself, a peer view, or a copy."""
        home = x.device.id
        if home == device:
            return x
        cp = _cupy()
        if self.peer_access(device, home) and x.flags.c_contiguous:
            # A view that names ``device`` as its home: CuPy launches there without its
            # per-call peer check; the pointer is read through peer access.
            memory = cp.cuda.UnownedMemory(x.data.ptr, x.nbytes, x, device)
            return cp.ndarray(x.shape, x.dtype, cp.cuda.MemoryPointer(memory, 0))
        staged = self.empty_on(device, x.shape, x.dtype)
        self.copy(staged, x)
        return staged

    def _launch(self, op: ReduceOp, dst, first, srcs: Sequence) -> None:
        device = dst.device.id
        srcs = list(srcs)
        self._enter(device, tuple({s.device.id for s in srcs}
                                  | ({first.device.id} if first is not None else set())))
        readable = [self._readable(s, device) for s in srcs]
        start = self._readable(first, device) if first is not None else None
        with self._context(device):
            for i in range(0, max(len(readable), 1), kernels.MAX_ARITY):
                part = readable[i:i + kernels.MAX_ARITY]
                if start is not None and i == 0:
                    kernels.combine_kernel(op.wire_op, len(part), True)(start, *part, dst)
                elif part:
                    kernels.combine_kernel(op.wire_op, len(part), False)(*part, dst)

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
            source = self._readable(total, device)
            if source.shape != out.shape:
                source = source.reshape(out.shape)
            self._enter(device, (total.device.id,))
            with self._context(device):
                kernels.divide_kernel(np.dtype(total.dtype))(source, int(count), out)
        return out

    def concatenate(self, arrays, axis):
        arrays = list(arrays)
        device = arrays[0].device.id
        self._enter(device, tuple({a.device.id for a in arrays}))
        with self._context(device):
            return _cupy().concatenate(arrays, axis=axis)

    def contiguous(self, x) -> bool:
        return bool(x.flags.c_contiguous)

    def writable(self, x) -> bool:
        return True  # device memory has no read-only flag

    def extent(self, x) -> tuple[int, int, int]:
        start = end = x.data.ptr
        if x.size:
            for n, stride in zip(x.shape, x.strides):
                if stride < 0:
                    start += (n - 1) * stride
                else:
                    end += (n - 1) * stride
            end += x.itemsize
        return x.device.id, start, end


class _Both:
    """``with device, stream:`` as one context manager."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.device.__enter__()
        self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self.device.__exit__(*exc)
