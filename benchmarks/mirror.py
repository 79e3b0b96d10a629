"""A transport whose every peer is this rank's mirror image, and already there.

Every receive is complete the moment it is posted and holds this rank's own data (a copy
receive copies it onto itself, as a real one copies); every send completes at once. A
:class:`~collectives.Communicator` over it runs rank ``rank`` of ``size`` with nothing to wait
for, so timing its calls times the core alone (``overhead.py``). The argument agreement
passes: every rank's digest is this rank's.
"""

from __future__ import annotations

from collectives.algorithms.select import CostModel
from collectives.arrays import NUMPY
from collectives.runtime.transport import ignore_verdict


class _Done:
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def done(self) -> bool:
        return True


class _MirrorChannel:
    arrays = NUMPY

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def send(self, data, dst, tag):
        return _Done(None)

    def recv(self, into, src, tag, *, in_place):
        if in_place:
            NUMPY.copy(into, into)  # the copy a real receive makes
        return _Done(into)

    def release(self, request) -> None:
        pass


    def cancel(self, requests) -> None:
        pass


class MirrorTransport:
    """Every peer is this rank's mirror image, and already there."""

    name, native, layout, local_rank, arrays = "mirror", None, None, 0, NUMPY
    processes, nodes, fabric, link, shared_memory = True, None, None, None, None
    schedules_in_native_order = calls_may_not_return = False
    calls_apart = None
    cost_model = CostModel(latency=30e-6, seconds_per_byte=1 / 8e9, message_overhead=20e-6)

    def __init__(self, rank: int, size: int):
        self.rank, self.size, self.local_size = rank, size, size
        self.data, self.control = _MirrorChannel(rank, size), _MirrorChannel(rank, size)

    def idle(self, waited): pass
    def notify_failure(self, failure): pass
    def poll_failure(self): return None
    def agreement_waiting(self, seq): return False
    def publish_activity(self, activity): pass
    def verdict_pending(self, seq): return ignore_verdict
    def issue_messages(self): pass
    def reading_inputs(self, seq): pass
    def peer_activity(self, timeout): return {}
    def free(self): pass
