"""Send/recv over NCCL: the library's schedules (one NCCL group per round) and users'
messages (held, then issued together), stream-ordered.

The core's SPMD executor posts every receive and send of a round, then asks whether they are
done. Here the first post of a round opens a NCCL group (``groupStart``) and the first
question closes it (``groupEnd``), so a round's sends and receives are issued together, as
NCCL requires (a ring of blocking sends would deadlock otherwise). Everything goes on the
transport's stream, in order: a request is "done" once it is enqueued, and the combine that
reads a received range is enqueued after it on the same stream. Nothing waits on the host;
the watchdog watches the stream.

NCCL pairs messages by order between two ranks, not by tag: the core's schedules post them
in the same order on both sides.

Users' messages (``isend``, ``irecv``, ``send``, ``recv``: ``HeldMessages``) are posted one
call at a time, so a group per post would put each alone on the stream: a ring of
``irecv(left)`` then ``send(right)``, MPI's classic, would then deadlock (each rank's
receive waits on the stream for a send queued behind its peer's receive). They are held
instead, and issued together as one group at the next wait or call (``issue``, the
transport's ``issue_messages``), which NCCL runs as one: every receive of the group can meet
its send.
"""

from __future__ import annotations

import threading
from typing import Any


def enqueue(t: Any, comm: Any, sending: bool, array: Any, peer: int) -> None:
    """NCCL's send (or receive) of ``array``'s bytes to (from) ``peer`` on transport ``t``'s
    stream, inside a group the caller opened."""
    move = comm.send if sending else comm.recv
    move(array.data.ptr, array.nbytes, t.byte_type, peer, t.stream.ptr)


class _Request:
    __slots__ = ("channel", "data")

    def __init__(self, channel: NcclChannel, data: Any = None):
        self.channel, self.data = channel, data

    def done(self) -> bool:
        self.channel.flush()
        return True


class NcclChannel:
    """``PointToPoint`` over a NCCL communicator (made on first use)."""

    def __init__(self, transport: Any):
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.arrays = transport.arrays
        self._open = False

    def _begin(self):
        comm = self.transport.comms.get("world", "a schedule over NCCL send/recv")
        if not self._open:
            self.transport.nccl.groupStart()
            self._open = True
        return comm

    def flush(self) -> None:
        """End the round's NCCL group (its calls are issued now)."""
        if self._open:
            self._open = False
            self.transport.nccl.groupEnd()
            self.transport.watch("point-to-point round")

    def send(self, data, dst: int, tag: tuple) -> _Request:
        enqueue(self.transport, self._begin(), True, data, dst)
        return _Request(self)

    def recv(self, into, src: int, tag: tuple, *, in_place: bool) -> _Request:
        target = into if in_place else self.arrays.empty(into.shape, into.dtype, like=into)
        enqueue(self.transport, self._begin(), False, target, src)
        return _Request(self, target)

    def release(self, request: _Request) -> None:
        request.data = None  # scratch goes back to CuPy's pool, in stream order

    def cancel(self, requests: list) -> None:
        # NCCL cannot withdraw a posted receive: close the group; the watchdog aborts the
        # communicator if the peer never sends.
        self.flush()


class _Held:
    """A user's message, held until its group is issued (``done`` once it is)."""

    __slots__ = ("data", "issued")

    def __init__(self, data: Any):
        self.data, self.issued = data, False

    def done(self) -> bool:
        return self.issued


class HeldMessages:
    """``PointToPoint`` for users' messages over NCCL: held, then issued as one group (see the
    module's docstring)."""

    def __init__(self, transport: Any):
        self.transport = transport
        self.arrays = transport.arrays
        self._held: list[tuple[bool, Any, int, _Held]] = []  # (sending, array, peer, request)
        self._lock = threading.Lock()  # (a wait on another thread may issue while one posts)

    def send(self, data, dst: int, tag: tuple) -> _Held:
        request = _Held(data)  # (it keeps the array alive until NCCL has read it)
        with self._lock:
            self._held.append((True, data, dst, request))
        return request

    def recv(self, into, src: int, tag: tuple, *, in_place: bool) -> _Held:
        target = into if in_place else self.arrays.empty(into.shape, into.dtype, like=into)
        request = _Held(target)
        with self._lock:
            self._held.append((False, target, src, request))
        return request

    def issue(self) -> None:
        """Issue every held message now, as one NCCL group, after the caller's stream (the
        producers of what is sent, and of the memory received into)."""
        if not self._held:
            return
        with self._lock:
            held, self._held = self._held, []
        t = self.transport
        comm = t.comms.get("world", "point-to-point messages")
        t.follow_caller()
        t.nccl.groupStart()
        try:
            for sending, array, peer, _ in held:
                enqueue(t, comm, sending, array, peer)
        finally:
            t.nccl.groupEnd()
        t.watch("point-to-point messages")
        for *_, request in held:
            request.issued = True

    def release(self, request: _Held) -> None:
        request.data = None  # (issued: NCCL's use of it is in stream order)

    def cancel(self, requests: list) -> None:
        # NCCL cannot withdraw a message, and pairs them by order: a held one is issued all
        # the same (a later message must not take its peer's); the watchdog aborts the
        # communicator if the peer never sends.
        self.issue()
