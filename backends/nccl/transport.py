"""``NcclTransport``: the core's ``Transport`` over NCCL (data) and MPI (everything else).

One process per GPU. Data moves with NCCL on one CUDA stream per communicator (``stream``:
by default a non-blocking stream of its own, made under its device, so NCCL's kernels never
serialize with the legacy stream's work); every array operation of a call, the core's copies
and divisions included, is enqueued on it, in call order. Each call hands over between the
caller's current stream and this one with events: the communicator's stream first waits for
the caller's (where the inputs were made), and a blocking call ends with the caller's stream
waiting for the communicator's, so the results are ready for the caller's next work. Every
handle and allocation names the transport's device, whatever device the calling thread (or
the progress thread of asynchronous calls) is on. Agreements, failure notices and activity go
over MPI (``.control``); the watchdog (``.watchdog``) turns stuck, failed or mismatched
calls into errors.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from collectives.backends.cupy import nccl_reductions
from collectives.backends.cupy.arrays import CupyArrays
from collectives.backends.cupy.probe import nccl_module, require_gpu

from collectives.algorithms.base import Layout
from collectives.algorithms.select import CostModel
from collectives.runtime.transport import Failure

from .bootstrap import Communicators, choose_device, device_identity, node_of_ranks
from .control import MpiChannel, Notices
from .native_collectives import NcclNative
from .p2p import NcclChannel
from .watchdog import Watchdog

# Schedules over NCCL send/recv cost a group launch per round (~20 us from Python); bytes
# move at NVLink/PCIe speed between GPUs.
COST_MODEL = CostModel(latency=30e-6, seconds_per_byte=1 / 50e9,
                       reduce_seconds_per_byte=1 / 500e9, message_overhead=10e-6)


class NcclTransport:
    """The ``Transport`` of one rank (one GPU) of an MPI launch."""

    name = "nccl"
    cost_model = COST_MODEL
    # the library's schedules (send/recv) and NCCL's collectives run one after another on the
    # one stream: their rounds take a native turn, so every rank issues them in one order
    schedules_in_native_order = True
    # its agreements, notices and activity go over MPI, whose calls may never return once a
    # peer died: the hang guard (collectives.runtime.hang_guard) ends such a rank
    calls_may_not_return = True
    # the other optional hooks (``collectives.runtime.transport``), as their defaults
    processes = True
    nodes = fabric = link = None

    def __init__(self, comm: Any, *, device: int | None = None, stream: Any = None,
                 timeout: float = 300.0):
        cupy = require_gpu()
        self.nccl = nccl_module()
        self.world = comm.Dup()
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        nodes = node_of_ranks(self.world)
        node = next(m for m in nodes if self.rank in m)
        self.local_rank, self.local_size = node.index(self.rank), len(node)
        self.device = choose_device(self.local_rank) if device is None else int(device)
        cupy.cuda.Device(self.device).use()
        with cupy.cuda.Device(self.device):
            self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        identities = self.world.allgather(device_identity(self.device))
        self.comms = Communicators(self.world, self.device, identities, nodes)
        # NCCL's own collectives and point-to-point need one GPU per rank
        self.world_possible = len(set(identities)) == len(identities)
        self.layout = Layout(tuple(tuple(m) for m in nodes)) if len(nodes) > 1 else None
        self.arrays = CupyArrays(stream=self.stream, device=self.device)
        self.byte_type = nccl_reductions.byte_type(self.nccl)
        self.timeout = float(timeout)
        self.control = MpiChannel(self.world.Dup())
        self.notices = Notices(self.world.Dup())
        self._digests = self.world.Dup()
        self._notice_lock = threading.Lock()
        self._deferred: deque = deque()  # notices the watchdog leaves to the engine
        self.data = NcclChannel(self)
        self.p2p = NcclChannel(self)  # users' send/recv: a channel (and group) of their own
        self.objects = self.world.Dup()  # pickled objects between ranks: host-side, over MPI
        self.native = NcclNative(self)
        self.failed: BaseException | None = None
        self.watchdog = Watchdog(self)
        self._pinned: list = []
        self._last_digest = 0
        self._followed: int | None = None  # the call whose input made this stream wait
        self._following = threading.local()  # each thread's event for follow_caller
        self.spare: deque = deque()  # events the watchdog saw complete, for record() again
        self._external: dict[int, Any] = {}  # other libraries' streams, by raw handle
        self.led: int | None = None  # the stream the last hot call's caller waits on

    # --- streams and the watchdog ------------------------------------------------------

    def on_stream(self):
        """Context for CuPy calls that enqueue on the current stream: this device, its
        stream."""
        import cupy

        return _Both(cupy.cuda.Device(self.device), self.stream)

    def record(self):
        """An event recorded on this stream now (see ``record_here``)."""
        import cupy

        with cupy.cuda.Device(self.device):
            return self.record_here()

    def record_here(self):
        """``record`` with this device already current: an event the watchdog saw complete
        (``spare``), else a new one (creating and destroying one per call costs
        microseconds)."""
        try:
            event = self.spare.pop()
        except IndexError:
            import cupy

            event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return event

    def caller_stream(self, handle: int | None = None) -> Any:
        """The stream the caller's work is ordered by, with this device current: CuPy's
        current stream, or another library's current stream given as its raw
        ``cudaStream_t`` (``handle``; PyTorch's, say), wrapped once per handle."""
        import cupy

        if handle is None:
            return cupy.cuda.get_current_stream()
        stream = self._external.get(handle)
        if stream is None:  # (0: the legacy default stream, CuPy's own null stream)
            stream = cupy.cuda.Stream.null if handle == 0 else cupy.cuda.ExternalStream(
                handle, self.device)
            self._external[handle] = stream
        return stream

    def follow_caller(self, seq: int | None = None) -> None:
        """This stream waits for the calling thread's current stream on this device (the
        producers of a call's inputs). ``seq``: the call the caller is in, as its input is
        adapted; a call's start then need not wait again."""
        import cupy

        with cupy.cuda.Device(self.device):
            self.follow(cupy.cuda.get_current_stream(), seq)

    def follow(self, caller: Any, seq: int | None = None) -> None:
        """``follow_caller`` for the stream ``caller``, with this device current."""
        self._followed = seq
        if caller.ptr != self.stream.ptr:
            # one event per thread, recorded again at every call: a wait takes the event's
            # state when it is enqueued, so a later record cannot change it
            event = getattr(self._following, "event", None)
            if event is None:
                import cupy

                event = self._following.event = cupy.cuda.Event(block=False,
                                                                disable_timing=True)
            event.record(caller)
            self.stream.wait_event(event)

    def lead_caller(self, event: Any = None) -> None:
        """The calling thread's current stream waits for this one (a blocking call's end),
        through ``event`` where one was just recorded on it."""
        import cupy

        self.led = None  # (the stream is the caller's current one, not a hot call's)
        with cupy.cuda.Device(self.device):  # (the legacy stream, handle 0, is the current
            caller = cupy.cuda.get_current_stream()  # device's: this one must be current)
            if caller.ptr != self.stream.ptr:
                caller.wait_event(event if event is not None else self.record_here())

    def hand_back(self, description: str, seq: int, caller: Any = None) -> None:
        """A blocking call's end in one event: the watchdog watches it (as ``watch``), and
        the caller's stream waits for it (as ``lead_caller``; ``caller``: that stream, with
        this device current, as the hot path gives it)."""
        if caller is None:
            event = self.record()
            self.lead_caller(event)  # (and led: None)
        else:
            event = self.record_here()
            if caller.ptr != self.stream.ptr:
                caller.wait_event(event)
            self.led = caller.ptr
        self.watchdog.watch(description, seq, event, self.timeout)

    def current_stream_handle(self) -> int:
        """The raw handle of CuPy's current stream on this device."""
        import cupy

        with cupy.cuda.Device(self.device):
            return cupy.cuda.get_current_stream().ptr

    def watch(self, description: str, seq: int | None = None) -> None:
        """Hand what was just enqueued to the watchdog."""
        self.watchdog.watch(description, seq if seq is not None else self._last_digest,
                            self.record(), self.timeout)

    def digest(self, seq: int, check: int) -> None:
        """Every call's check value goes into a non-blocking MPI all-reduce (see watchdog);
        a rank alone has no peer to disagree with."""
        if seq > self._last_digest:
            self._last_digest = seq
            if self.size > 1:
                self.watchdog.digest(seq, check, self._digests)

    def pinned(self, nbytes: int):
        """A pinned host buffer (uint8) of at least ``nbytes``, reused across calls; give it
        back with ``release_pinned``."""
        import cupy
        import numpy as np

        for i, buf in enumerate(self._pinned):
            if buf.nbytes >= nbytes:
                return self._pinned.pop(i)
        size = max(nbytes, 1)
        return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.uint8, size)

    def release_pinned(self, buf) -> None:
        self._pinned.append(buf)

    # --- Transport --------------------------------------------------------------------------

    def idle(self, waited: float) -> None:
        if waited > 1e-3:
            with self._notice_lock:
                self.notices.answer()
            time.sleep(min(1e-3, waited / 100))

    def notify_failure(self, failure: Failure) -> None:
        with self._notice_lock:
            self.notices.notify(failure)

    def poll_failure(self) -> Failure | None:
        with self._notice_lock:
            if self._deferred:
                return self._deferred.popleft()
        return self.notices_poll()

    def defer_notice(self, failure: Failure) -> None:
        """A notice the watchdog received but the engine handles (see ``poll_failure``)."""
        with self._notice_lock:
            self._deferred.append(failure)

    def notices_poll(self) -> Failure | None:
        with self._notice_lock:
            return self.notices.poll()

    def notices_ask(self, timeout: float) -> dict:
        with self._notice_lock:
            return self.notices.ask(timeout)

    def agreement_waiting(self, seq: int) -> bool:
        return self.control.waiting_from_call(seq)

    def publish_activity(self, activity: tuple) -> None:
        """``(seq, call, phase)`` at a call's start (phase true) and a blocking call's end
        (False), where the streams hand over; with a fourth item (the ranks a slow wait
        waits for), from the engine's waits."""
        self.notices.activity = activity
        seq, subject, phase = activity[:3]
        if len(activity) == 3:
            if phase:
                if self._followed != seq:  # (else done where the call adapted its input)
                    self.follow_caller()
            else:
                self.lead_caller()
        if phase:  # every call, in order on every rank: its digest (see the watchdog)
            self.digest(seq, int(getattr(subject, "check", 0) or 0))

    def peer_activity(self, timeout: float) -> dict[int, tuple[int | None, str]]:
        return self.notices_ask(timeout)

    def dup(self) -> NcclTransport:
        return NcclTransport(self.world, device=self.device, stream=self.stream,
                             timeout=self.timeout)

    def split(self, color: int | None, key: int) -> NcclTransport | None:
        from mpi4py import MPI

        sub = self.world.Split(MPI.UNDEFINED if color is None else color, key)
        if sub == MPI.COMM_NULL:
            return None
        return NcclTransport(sub, device=self.device, stream=self.stream, timeout=self.timeout)

    def free(self) -> None:
        self.comms.free()
        for comm in (self.control.comm, self.notices.comm, self._digests, self.objects,
                     self.world):
            comm.Free()


class _Both:
    def __init__(self, device, stream):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.device.__enter__()
        self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self.device.__exit__(*exc)
