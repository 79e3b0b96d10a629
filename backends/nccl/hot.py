"""The hot path of a repeated all-reduce over NCCL: one enqueue, nothing else per call.

A training loop makes the same all-reduce every step. Once its signature is agreed, the
core's hot path (``collectives.runtime.fastpath.FastAllReduce``) calls ``HotAllReduce.quick``
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
"""

from __future__ import annotations

from typing import Any

from collectives.backends.cupy import nccl_types

from collectives.runtime.calls import Call


class HotAllReduce:
    """NCCL's all-reduce of one agreed call, bound once (see the module's docstring)."""

    __slots__ = ("call", "count", "description", "nccl_op", "nccl_type", "t")

    def __init__(self, transport: Any, call: Call, plan: nccl_types.Reduction):
        self.t, self.call = transport, call
        self.count = call.count * plan.scale
        self.nccl_type, self.nccl_op = plan.nccl_type, plan.nccl_op
        self.description = call.describe()

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
        send, receive = x.data.ptr, out.data.ptr
        if send != receive and send < receive + out.nbytes and receive < send + x.nbytes:
            return None  # partly overlapping: the engine's way goes through a buffer
        comm = t.comms.get("world", self.description)
        t.notices.activity = (seq, self.call, "moving")
        t.follow_caller(seq)
        comm.allReduce(send, receive, self.count, self.nccl_type, self.nccl_op, t.stream.ptr)
        t.digest(seq, self.call.check)
        t.hand_back(self.description, seq)
        t.notices.activity = (seq, self.call, False)
        return out
