"""``NcclTransport``: the core's ``Transport`` over NCCL (data) and MPI (everything else).

One process per GPU. Data moves with NCCL on one CUDA stream per communicator (``stream``:
by default a non-blocking stream of its own, made under its device, so NCCL's kernels never
serialize with the legacy stream's work); every array operation of a call, the core's copies
and divisions included, is enqueued on it, in call order. Each call hands over between the
caller's current stream and this one with events: the communicator's stream first waits for
the caller's (where the inputs were made), and a blocking call ends with the caller's stream
waiting for the communicator's, so the results are ready for the caller's next work; an
asynchronous call leaves the caller's stream free until its handle's ``wait()`` (``.streams``). Every
handle and allocation names the transport's device, whatever device the calling thread (or
the progress thread of asynchronous calls) is on. Agreements, failure notices and activity go
over MPI (``.control``); the watchdog (``.watchdog``) turns stuck, failed or mismatched
calls into errors.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from collectives.backends.cupy import nccl_reductions
from collectives.backends.cupy.arrays import CupyArrays
from collectives.backends.cupy.probe import nccl_module, require_gpu
from collectives.backends.mpi import draining

from collectives.algorithms.base import Layout
from collectives.algorithms.select import CostModel
from collectives.runtime.transport import Failure, ignore_verdict

from .bootstrap import Communicators, choose_device, device_identity, node_of_ranks
from .control import MpiChannel, Notices
from .native_collectives import NcclNative
from .p2p import HeldMessages, NcclChannel
from .streams import StreamOrder
from .watchdog import Watchdog

_KEPT: list = []  # MPI communicators of failed transports, never freed (``free``)
# Schedules over NCCL send/recv cost a group launch per round (~20 us from Python); bytes
# move at NVLink/PCIe speed between GPUs.
COST_MODEL = CostModel(latency=30e-6, seconds_per_byte=1 / 50e9,
                       reduce_seconds_per_byte=1 / 500e9, message_overhead=10e-6)


class NcclTransport(StreamOrder):
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
    nodes = fabric = link = shared_memory = calls_apart = None
    engine: Any = None  # (a weak reference to the engine, set by it: ``call_limit``)

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
        self.p2p = HeldMessages(self)  # users' send/recv: held, issued as one group
        self.objects = self.world.Dup()  # pickled objects between ranks: host-side, over MPI
        self.native = NcclNative(self)
        self.failed: BaseException | None = None
        self.watchdog = Watchdog(self)
        self._pinned: list = []
        self._last_digest = 0
        self._undecided = 0  # the call whose digest waits for its verdicts (verdict_pending)
        self.init_streams()

    # --- the watchdog ----------------------------------------------------------------------

    def keep_until_done(self, description: str, event: Any, keep: list) -> None:
        """The watchdog watches ``event`` (a handle's: never recycled) and holds ``keep`` (a
        call's arrays) until it is done, so no allocator reuses their memory while this
        stream still reads or writes it."""
        self.watchdog.watch(description, self._last_digest, event, self.timeout, keep)

    def watch(self, description: str, seq: int | None = None) -> None:
        """Hand what was just enqueued to the watchdog."""
        self.watchdog.watch(description, seq if seq is not None else self._last_digest,
                            self.record(), self.call_limit())

    def digest(self, seq: int, check: int, agreeing: bool = False) -> None:
        """Every call's check value goes into a non-blocking MPI all-reduce (see watchdog);
        a rank alone has no peer to disagree with. ``agreeing``: the call runs its agreement
        on this rank, which judges it (the digests then decide nothing); a call that waits
        for verdicts is held until it knows (``verdict_pending``)."""
        if seq > self._last_digest:
            self._last_digest = seq
            if self.size > 1:
                held = seq == self._undecided
                self.watchdog.digest(seq, check, self._digests, None if held else agreeing)

    def verdict_pending(self, seq: int) -> Callable[[bool], None]:
        """Call ``seq``'s digest (published next) waits until the call agrees or moves: said
        at issue, "moving", it differed from a peer that refused the call (and agreed on
        it), and the watchdog broke a communicator the refusal leaves usable."""
        if self.size == 1:
            return ignore_verdict
        self._undecided = seq
        return functools.partial(self.watchdog.decided, seq)

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
                if self.followed != seq:  # (else done where the call adapted its input)
                    self.follow_caller()
            else:
                self.lead_caller()
        if phase:  # every call, in order on every rank: its digest (see the watchdog)
            self.digest(seq, int(getattr(subject, "check", 0) or 0), phase == "agreeing")

    def issue_messages(self) -> None:
        """Users' messages held since the last wait or call go out now, as one NCCL group
        (``p2p.HeldMessages``)."""
        self.p2p.issue()

    def reading_inputs(self, seq: int) -> None:
        """A prepared call's start copies its input in on this transport's stream: that
        stream waits for the caller's first (its producers), once for the call."""
        self.follow_caller(seq)

    def peer_activity(self, timeout: float) -> dict[int, tuple[int | None, str]]:
        return self.notices_ask(timeout)

    def dup(self) -> NcclTransport:
        """A transport over the same ranks with a stream of its own: NCCL runs what one
        stream holds in order, so two threads' communicators on one stream, whose calls the
        ranks enqueue in different orders, would wait for each other's calls on the GPU."""
        return NcclTransport(self.world, device=self.device, timeout=self.timeout)

    def split(self, color: int | None, key: int) -> NcclTransport | None:
        from mpi4py import MPI

        sub = self.world.Split(MPI.UNDEFINED if color is None else color, key)
        if sub == MPI.COMM_NULL:
            return None
        return NcclTransport(sub, device=self.device, timeout=self.timeout)  # (as dup's)

    def free(self) -> None:
        """NCCL's communicators go at once; the MPI ones once the notices nobody read are
        received (``collectives.backends.mpi.draining``: MPI could give a freed context, with
        those notices, to a new communicator). After a failure they are kept instead:
        messages of the failed call may still arrive."""
        self.comms.free()
        comms = (self.control.comm, self.notices.comm, self._digests, self.objects, self.world)
        with self._notice_lock:
            sent, received, sends = self.notices.free()
        if self.failed is not None:
            _KEPT.append(comms)
            return
        draining.free_when_drained([(self.notices.comm, sent, received)], comms, sends)
