"""A happens-before check of stream order, on the NumPy stand-in for CuPy.

The stand-in runs every copy and kernel at once, so a missing event wait cannot show as a
wrong result there. :func:`recording` instead notes, for every copy (by its stream handle)
and kernel (on the current stream), the byte ranges it reads and writes, and keeps a vector
clock per stream that event records and waits carry across. Each access must then happen
after every earlier conflicting one on another stream (a read after the last write; a write
after every read and write), as CUDA would order them; a fresh allocation starts a range's
history anew. What the check cannot see: NCCL calls (they are not recorded) and the host.
"""

from __future__ import annotations

import collections
import threading
from contextlib import contextmanager


class Order:
    """Vector clocks per stream and the accesses so far; ``violations`` lists the races."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.clocks: dict = {}
        self.history: list = []  # (lo, hi, "r"/"w", stream, tick, what)
        self.violations: list[str] = []
        self.lock = threading.RLock()

    def key(self, stream) -> tuple:
        handle = stream if isinstance(stream, int) else stream.ptr
        return ("legacy", self.runtime.getDevice()) if handle == 0 else ("stream", handle)

    def clock(self, key) -> dict:
        return self.clocks.setdefault(key, collections.defaultdict(int))

    def access(self, key, reads, writes, what: str) -> None:
        with self.lock:
            mine = self.clock(key)
            mine[key] += 1
            for lo, hi, kind in [(lo, hi, "r") for lo, hi in reads] + [
                    (lo, hi, "w") for lo, hi in writes]:
                for a, b, other, stream, tick, by in self.history:
                    if a < hi and lo < b and stream != key and mine[stream] < tick and (
                            kind == "w" or other == "w"):
                        self.violations.append(f"{what} on {key} {kind} [{lo}, {hi}) is not "
                                               f"ordered after {by} ({other}) on {stream}")
            self.history += [(lo, hi, "r", key, mine[key], what) for lo, hi in reads if hi > lo]
            self.history += [(lo, hi, "w", key, mine[key], what) for lo, hi in writes if hi > lo]

    def forget(self, ptr: int, size: int) -> None:
        with self.lock:
            self.history = [h for h in self.history if not (h[0] < ptr + size and ptr < h[1])]


@contextmanager
def recording():
    """Record the stand-in's device work inside the block; yields the :class:`Order`."""
    import cupy
    from cupy import cuda
    from cupy.cuda import runtime

    order = Order(runtime)
    saved = [(runtime, "register"), (runtime, "memcpyAsync"), (runtime, "memcpyPeerAsync"),
             (cuda.Event, "record"), (cuda.Stream, "wait_event"),
             (cupy.ElementwiseKernel, "__call__")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in saved]
    register, memcpy, peer = runtime.register, runtime.memcpyAsync, runtime.memcpyPeerAsync
    record, wait, launch = cuda.Event.record, cuda.Stream.wait_event, cupy.ElementwiseKernel.__call__

    def span(a):
        return (a._a.ctypes.data, a._a.ctypes.data + a._a.nbytes) if a.size else (0, 0)

    def on_register(ptr, size, device):
        order.forget(ptr, max(size, 1))
        register(ptr, size, device)

    def on_memcpy(dst, src, size, kind, stream):
        order.access(order.key(stream), [(src, src + size)], [(dst, dst + size)], "copy")
        memcpy(dst, src, size, kind, stream)

    def on_peer(dst, dd, src, sd, size, stream):
        order.access(order.key(stream), [(src, src + size)], [(dst, dst + size)], "peer copy")
        peer(dst, dd, src, sd, size, stream)

    def on_record(event, stream=None):
        record(event, stream)
        key = order.key(stream if stream is not None else cuda.get_current_stream())
        with order.lock:
            event.clock = dict(order.clock(key))

    def on_wait(stream, event):
        wait(stream, event)
        with order.lock:
            mine = order.clock(order.key(stream))
            for other, tick in getattr(event, "clock", {}).items():
                mine[other] = max(mine[other], tick)

    def on_launch(kernel, *args, **kw):
        arrays = [a for a in args if isinstance(a, cupy.ndarray)]
        ins, outs = arrays[:kernel.nin], arrays[kernel.nin:]
        reads = [span(a) for a in (ins if kernel.nin else outs)]  # (key kernels: in place)
        order.access(order.key(cuda.get_current_stream()), reads, [span(a) for a in outs],
                     kernel.name)
        return launch(kernel, *args, **kw)

    runtime.register, runtime.memcpyAsync, runtime.memcpyPeerAsync = (on_register, on_memcpy,
                                                                      on_peer)
    cuda.Event.record, cuda.Stream.wait_event = on_record, on_wait
    cupy.ElementwiseKernel.__call__ = on_launch
    try:
        yield order
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
