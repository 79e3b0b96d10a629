"""Where a CuPy array backend's work goes: the stream of each device, device contexts,
ordering one device's stream after another's, and reading an array that lives on another GPU.

A null stream handle means "the current device's" stream, so every operation is enqueued under
its destination's device: on that device's current stream in the calling thread, on a fixed
stream where the owner gives one (the NCCL transport), or on the stream the owner's
``on_enqueue`` names for the destination (the multi-device backend, which may give each
logical device a stream of its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

# (the array an operation writes, the arrays it reads) -> the stream it goes on, or None for
# the destination device's current (or the fixed) stream
Enqueue = Callable[[Any, Sequence[Any]], Any]


def _cupy():
    import cupy

    return cupy


class Placement:
    """The streams and devices of `backends.cupy.arrays.CupyArrays`' work."""

    def __init__(self, stream: Any = None, on_enqueue: Enqueue | None = None,
                 device: int | None = None):
        self.fixed_stream = stream
        self.on_enqueue = on_enqueue
        # where arrays made without ``like`` go: a fixed device (a transport's), else the
        # calling thread's current device
        self.device = None if device is None else int(device)
        self._peer: dict[tuple[int, int], bool] = {}
        self._lock = threading.Lock()

    def stream(self, device: int):
        """The stream work for ``device`` is enqueued on."""
        if self.fixed_stream is not None:
            return self.fixed_stream
        return _cupy().cuda.get_current_stream(device)

    def enter(self, dst: Any, srcs: Sequence[Any] = ()) -> Any:
        """Announce an operation that writes ``dst`` and reads ``srcs``: the stream the owner
        names for it, or None (the destination device's current or fixed stream)."""
        if self.on_enqueue is not None:
            return self.on_enqueue(dst, srcs)
        return None

    def context(self, device: int, stream: Any = None):
        """Device (and stream) context for CuPy calls that enqueue on the current one."""
        cp = _cupy()
        stream = stream if stream is not None else self.fixed_stream
        if stream is None:
            return cp.cuda.Device(device)
        return DeviceAndStream(cp.cuda.Device(device), stream)

    def empty_on(self, device: int, shape, dtype):
        # Allocated under the stream it is used on: CuPy's pool hands freed memory out again
        # in that stream's order.
        with self.context(device):
            return _cupy().empty(shape, dtype)

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

    def contiguous_on(self, x, device: int):
        """A contiguous copy of ``x`` (on another GPU) on ``device``, ordered after ``x``'s
        stream: made contiguous where it lives, then copied across (only outside the steps
        of a call: the executors' buffers are contiguous)."""
        cp = _cupy()
        home = x.device.id
        with self.context(home):
            packed = cp.ascontiguousarray(x)
        here = self.empty_on(device, packed.shape, packed.dtype)
        self.order(device, home)  # the packing above ran on the other GPU's stream
        with cp.cuda.Device(device):
            cp.cuda.runtime.memcpyPeerAsync(here.data.ptr, device, packed.data.ptr, home,
                                            packed.nbytes, self.stream(device).ptr)
        return here

    def readable(self, x, device: int, stream: Any = None):
        """``x`` as a kernel on ``device`` can read it: itself, a peer view, or a copy
        (made on ``stream``, the kernel's; the caller has ordered it after ``x``)."""
        home = x.device.id
        if home == device:
            return x
        cp = _cupy()
        if self.peer_access(device, home) and x.flags.c_contiguous:
            # A view that names ``device`` as its home: CuPy launches there without its
            # per-call peer check; the pointer is read through peer access.
            memory = cp.cuda.UnownedMemory(x.data.ptr, x.nbytes, x, device)
            return cp.ndarray(x.shape, x.dtype, cp.cuda.MemoryPointer(memory, 0))
        if not x.flags.c_contiguous:
            return self.contiguous_on(x, device)
        with self.context(device, stream):  # scratch from the pool of the kernel's stream
            staged = cp.empty(x.shape, x.dtype)
        with cp.cuda.Device(device):
            handle = (stream if stream is not None else self.stream(device)).ptr
            cp.cuda.runtime.memcpyPeerAsync(staged.data.ptr, device, x.data.ptr, home,
                                            x.nbytes, handle)
        return staged


class DeviceAndStream:
    """``with device, stream:`` as one context manager (the NCCL transport's too)."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.device.__enter__()
        self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self.device.__exit__(*exc)
