"""The hot path of a repeated all-reduce over NCCL: one enqueue, nothing else per call.

A training loop makes the same all-reduce every step. Once its signature is agreed, the
core's hot path (``collectives.runtime.hot_path.FastAllReduce``) calls ``HotAllReduce.quick``
instead of building an operation with stages, turns and a finishing step. ``quick`` does
exactly what the engine's way does for a blocking NCCL all-reduce, in the same order, on the
caller's own buffers (NCCL reads and writes through pointers: no copy at any size):

1. tell peers which call this rank is in (what a hang report shows);
2. the transport's stream waits for the caller's current stream (the input's producers);
3. ``ncclAllReduce`` from ``x`` into ``out`` (or a new array) on the transport's stream;
4. the call's check value into the digest all-reduce (ranks that disagree still raise
   ``CollectiveMismatchError``, see ``.watchdog``);
5. one event after it: the watchdog watches it, and the caller's current stream waits for
   it, so the result is ready for the caller's next work.

Anything unusual (an input on another GPU, an ``out`` it cannot write into as it is, a
failed transport) returns None before step 1, and the engine's way runs the call and says
why. MEAN (a division after the sum) and dtypes that travel as keys (float MAX/MIN) are
not hot: ``prepare`` gives them no ``HotAllReduce``.

Another library's GPU arrays (PyTorch CUDA tensors) take the same steps without crossing
through DLPack: ``for_kind`` binds the call to their array kind (``DevicePointers``: the
device, pointer and current stream of an array, read from the array itself), and the caller's
stream in steps 2 and 5 is that library's current stream. Results are that library's arrays.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from collectives.backends.cupy import nccl_reductions

from collectives.runtime.calls import Call


@runtime_checkable
class DevicePointers(Protocol):
    """What an array kind (``collectives.foreign``) tells the hot path about its arrays."""

    def device_index(self, x: Any) -> int:
        """The CUDA device of ``x``'s memory."""
        ...

    def pointer(self, x: Any) -> int:
        """The address of ``x``'s first element."""
        ...

    def by_pointer(self, x: Any) -> bool:
        """Whether ``x`` may be read and written through its pointer: contiguous, holding its
        values as they are, untracked (where not, the call takes the edge's way, which
        refuses what it must, naming the fix)."""
        ...

    def empty_like(self, x: Any) -> Any:
        """A new contiguous array of ``x``'s shape, dtype and device."""
        ...

    def stream_handle(self, device: int) -> int:
        """The library's current stream on ``device`` (a raw ``cudaStream_t``)."""
        ...


_GIVES_POINTERS: dict[type, bool] = {}  # array kinds' types, asked once each


def with_pointers(kind: Any) -> DevicePointers | None:
    """``kind`` where it gives device pointers (``DevicePointers``), else None: asked once per
    type of kind (a runtime-checkable protocol's ``isinstance`` looks up each of its members:
    several microseconds, at every asynchronous wait before)."""
    known = _GIVES_POINTERS.get(type(kind))
    if known is None:
        known = _GIVES_POINTERS[type(kind)] = isinstance(kind, DevicePointers)
    return kind if known else None


class HotAllReduce:
    """NCCL's all-reduce of one agreed call, bound once (see the module's docstring)."""

    __slots__ = ("call", "comm", "count", "cupy", "description", "generation", "nbytes",
                 "nccl_op", "nccl_type", "t")

    def __init__(self, transport: Any, call: Call, plan: nccl_reductions.Reduction):
        import cupy

        self.t, self.call, self.cupy = transport, call, cupy
        self.count, self.nbytes = call.count * plan.scale, call.nbytes
        self.nccl_type, self.nccl_op = plan.nccl_type, plan.nccl_op
        self.description = call.describe()
        self.comm: Any = None  # NCCL's communicator, looked up at the first call
        self.generation = -1  # the transport's communicators it belongs to

    def for_kind(self, kind: Any) -> KindAllReduce | None:
        """This call's hot path on the arrays of another library's ``kind``, where the kind
        gives device pointers (``DevicePointers``); else None."""
        return KindAllReduce(self, kind) if with_pointers(kind) is not None else None

    def issue(self, x: Any, out: Any, seq: int) -> Any:
        """None: an asynchronous call takes this hot path through the communicator, as a
        blocking call that only enqueues (``NcclCommunicator.all_reduce``, ``hot_ready``)."""
        return None

    def quick(self, x: Any, out: Any, seq: int) -> Any:
        """Run call ``seq`` on ``x`` into ``out`` (None: a new array); None where the engine's
        way must run it (nothing was enqueued)."""
        t = self.t
        device = t.device
        if (t.failed is not None or x.device.id != device or not x.flags.c_contiguous):
            return None
        if out is None:
            out = t.arrays.result(self.call.shape, self.call.dtype)
        elif out.device.id != device or not out.flags.c_contiguous:
            return None  # (the engine's way checks it again and says what is wrong)
        with self.cupy.cuda.Device(device):
            return out if self.enqueue(x.data.ptr, out.data.ptr, seq, None) else None

    def enqueue(self, send: int, receive: int, seq: int, handle: int | None) -> bool:
        """Steps 1-5 from ``send`` into ``receive`` (with this device current; ``handle``:
        the caller's stream if not CuPy's current one); False for buffers that partly
        overlap (the engine's way goes through a buffer)."""
        nbytes = self.nbytes
        if send != receive and send < receive + nbytes and receive < send + nbytes:
            return False
        t, comm = self.t, self.comm
        if self.generation != t.comms.generation:
            comm = self.comm = t.comms.get("world", self.description)
            self.generation = t.comms.generation
        caller = t.caller_stream(handle)
        t.notices.activity = (seq, self.call, "moving")
        t.follow(caller, seq)
        comm.allReduce(send, receive, self.count, self.nccl_type, self.nccl_op, t.stream.ptr)
        t.digest(seq, self.call.check)
        t.hand_back(self.description, seq, caller)
        t.notices.activity = (seq, self.call, False)
        return True


class KindAllReduce:
    """``HotAllReduce.quick`` on another library's arrays, through their pointers."""

    __slots__ = ("hot", "kind")

    def __init__(self, hot: HotAllReduce, kind: DevicePointers):
        self.hot, self.kind = hot, kind

    def issue(self, x: Any, out: Any, seq: int) -> Any:
        """None, as ``HotAllReduce.issue``."""
        return None

    def quick(self, x: Any, out: Any, seq: int) -> Any:
        hot, kind = self.hot, self.kind
        t = hot.t
        device = t.device
        if t.failed is not None or kind.device_index(x) != device or not kind.by_pointer(x):
            return None
        if out is None:
            out = kind.empty_like(x)
        elif kind.device_index(out) != device or not kind.by_pointer(out):
            return None
        with hot.cupy.cuda.Device(device):
            done = hot.enqueue(kind.pointer(x), kind.pointer(out), seq,
                               kind.stream_handle(device))
        return out if done else None
