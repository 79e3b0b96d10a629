"""The ``Communicator`` of the NCCL transport: stream-ordered calls, handles that wait on an
event, and the watchdog's verdicts.

A blocking call returns once its work is enqueued on the transport's stream (as NCCL's own
calls do): the result is ready for later work on the caller's current stream.

``async_op=True`` returns a ``GpuWork`` and leaves the caller's stream free, as
torch.distributed's NCCL work does: at issue the transport's stream waits for the caller's
current stream (an event recorded there), the call runs on the transport's stream beside
whatever the caller enqueues next, and an event recorded after it is the handle's. ``wait()``
makes the current stream *of the result's library* wait for that event (PyTorch's current
stream for tensors, CuPy's for CuPy arrays; the stream current when ``wait()`` is called, not
the one current at issue) and returns without waiting on the host. ``wait(timeout=...)`` and
``synchronize()`` wait on the host until the GPU has finished the call (querying the event:
spinning briefly, then napping), raising ``CollectiveTimeoutError`` past the deadline. The
call's arrays stay referenced until its event is done (by the watchdog), so no allocator
reuses their memory while the transport's stream still uses it. A call that never finishes
is the watchdog's: past the communicator's timeout it fails the communicator, and the next
call raises. An asynchronous all-reduce whose signature is agreed takes the hot path (it only
enqueues), so issuing it costs what a blocking call costs. A call made after the watchdog
found a failure raises ``CommunicatorBrokenError`` naming it.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from collectives import Communicator
from collectives.errors import CollectiveTimeoutError

from .gpu_work import GpuWork, Issued, host_wait

# ``async_op`` as a union of its two values: a forwarded flag then matches the core's overloads
# (one per value) instead of none
Async = Literal[False, True]


class NcclCommunicator(Communicator):
    """A ``Communicator`` over ``NcclTransport``."""

    def adapt(self, x: Any, argument: str) -> Any:
        """CuPy arrays on this rank's GPU pass (and the communicator's stream waits for the
        caller's current one, where they were made); anything else raises, saying what to
        do."""
        if self.arrays.owns(x):
            device = self.transport.device
            if x.device.id != device:
                raise ValueError(f"{argument} is on GPU {x.device.id}, but this rank's "
                                 f"communicator works on GPU {device}; move it there "
                                 "(cupy.asarray under cupy.cuda.Device) or init(device=...)")
            self.transport.follow_caller(self.calls.engine.seq)  # (this call's number)
            return x
        if x is None:
            raise TypeError(f"{argument} is None; pass a CuPy array")
        raise TypeError(f"{argument} is a {type(x).__module__}.{type(x).__name__}; the nccl "
                        "backend works on CuPy arrays on this rank's GPU: pass "
                        "cupy.asarray(x), or use the mpi backend for host arrays")

    def adapt_batch(self, xs: Any, argument: str) -> list:
        """Every array of a batch checked as ``adapt`` checks one, and the communicator's
        stream made to wait for the caller's once (not once per tensor)."""
        arrays, device = self.arrays, self.transport.device
        kinds = set(map(type, xs))
        # (CuPy arrays all on this rank's GPU, by their pointers' device: no Device per array)
        if not (len(kinds) == 1 and arrays.owns(xs[0]) and all(
                x.data.device_id == device for x in xs)):
            for k, x in enumerate(xs):
                if not arrays.owns(x) or x.device.id != device:
                    self.adapt(x, f"{argument}[{k}]")  # (raises, saying why)
        self.transport.follow_caller(self.calls.engine.seq)
        return list(xs)

    def _guard(self, what: str) -> None:
        failed = self.transport.failed
        if failed is not None:
            self.calls.engine.break_for(f"the watchdog found {type(failed).__name__}: {failed}")

    def _wrap(self, result: Any, async_op: bool, *arrays: Any) -> Any:
        """An asynchronous call's handle over the core's (``arrays``: the call's inputs and
        ``out``, kept alive until its work is done)."""
        return GpuWork(self, result, keep=[*arrays]) if async_op else result

    def all_reduce(self, x, op="sum", algorithm="auto", *, async_op: Async = False, **kw):
        self._guard("all_reduce")
        if async_op and kw.keys() <= {"out"} and self.hot_ready(x, op, algorithm):
            # an agreed call only enqueues: the hot path's blocking call, issued as an
            # asynchronous one (the caller's stream is left free), is the call's issue
            t = self.transport
            keep = [x, kw.get("out")]
            t.issuing(keep)
            issued = Issued(None, x, op)
            try:
                issued.result = super().all_reduce(x, op, algorithm, **kw)
            finally:
                done = t.issued(lambda: issued.description)
            keep.append(issued.result)
            return GpuWork(self, issued, done, keep)
        return self._wrap(super().all_reduce(x, op, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def batch_all_reduce(self, xs, op="sum", algorithm="auto", *, async_op: Async = False,
                         **kw):
        self._guard("batch_all_reduce")
        return self._wrap(super().batch_all_reduce(xs, op, algorithm, async_op=async_op, **kw),
                          async_op, list(xs))

    def reduce(self, x, op="sum", root: int = 0, algorithm="auto", *, async_op: Async = False,
               **kw):
        self._guard("reduce")
        return self._wrap(super().reduce(x, op, root, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def broadcast(self, x=None, root: int = 0, algorithm="auto", *, async_op: Async = False,
                  **kw):
        self._guard("broadcast")
        return self._wrap(super().broadcast(x, root, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def all_gather(self, x, axis: int = 0, algorithm="auto", *, async_op: Async = False, **kw):
        self._guard("all_gather")
        return self._wrap(super().all_gather(x, axis, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def reduce_scatter(self, x, op="sum", algorithm="auto", *, async_op: Async = False, **kw):
        self._guard("reduce_scatter")
        return self._wrap(super().reduce_scatter(x, op, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def gather(self, x, root: int = 0, algorithm="auto", *, async_op: Async = False, **kw):
        self._guard("gather")
        return self._wrap(super().gather(x, root, algorithm, async_op=async_op, **kw),
                          async_op, x)

    def scatter(self, x=None, root: int = 0, algorithm="auto", *, async_op: Async = False,
                **kw):
        self._guard("scatter")
        return self._wrap(super().scatter(x, root, algorithm, async_op=async_op, **kw),
                          async_op, x, kw.get("out"))

    def all_to_all(self, x, splits=None, algorithm="auto", *, async_op: Async = False, **kw):
        self._guard("all_to_all")
        return self._wrap(super().all_to_all(x, splits, algorithm, async_op=async_op, **kw),
                          async_op, x)

    def all_gather_object(self, obj: Any, *, timeout: float | None = None) -> list:
        """Every rank's ``obj`` (anything picklable), in rank order: over MPI on the host (the
        core's version moves host arrays, which this communicator does not take)."""
        self._guard("all_gather_object")
        return self.transport.objects.allgather(obj)

    def broadcast_object(self, obj: Any = None, root: int = 0, *,
                         timeout: float | None = None) -> Any:
        """The root's ``obj`` (anything picklable) on every rank, over MPI on the host."""
        self._guard("broadcast_object")
        return self.transport.objects.bcast(obj, root=root)

    def choose_algorithm(self, call) -> str:
        """The core's choice, except that NCCL's world communicator must be possible for
        anything but the two-level path: ranks sharing a GPU get a clear error here, while
        the call is still being validated (so every rank raises it, and nothing moves)."""
        name = super().choose_algorithm(call)
        t = self.transport
        two_level = name == "native" and t.native.mode(call) == "two_level"
        if name != "one_device" and not two_level and not t.world_possible:
            t.comms.check_group(tuple(range(self.size)), call.describe())
        return name

    def barrier(self, timeout: float | None = None) -> None:
        """Every rank has arrived (an MPI barrier, polled with the deadline), and this rank's
        stream has finished its calls."""
        self._guard("barrier")
        self.calls.engine.enter("barrier")  # raises where the communicator is broken
        try:
            t = self.transport
            request = t.control.comm.Ibarrier()
            limit = self.timeout if timeout is None else float(timeout)
            deadline = time.monotonic() + limit
            while not request.Test():
                if time.monotonic() >= deadline:
                    activity = t.peer_activity(0.5)
                    error = CollectiveTimeoutError("barrier", sorted(activity), limit, self.rank)
                    t.watchdog.fail(error, None)
                    raise error
                t.idle(1.0)
        finally:
            self.calls.engine.leave()
        self.synchronize(timeout)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait on the host until this rank's stream has finished every call so far."""
        self._guard("synchronize")
        t = self.transport
        if t.failed is not None:
            raise t.failed
        t.issue_messages()  # (messages posted and held: "every call so far" holds them too)
        host_wait(t, t.record(), self.timeout if timeout is None else float(timeout),
                  "synchronize")
