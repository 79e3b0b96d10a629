"""The library's schedules over NCCL send/recv: one NCCL group per round, stream-ordered.

The core's SPMD executor posts every receive and send of a round, then asks whether they are
done. Here the first post of a round opens a NCCL group (``groupStart``) and the first
question closes it (``groupEnd``), so a round's sends and receives are issued together, as
NCCL requires (a ring of blocking sends would deadlock otherwise). Everything goes on the
transport's stream, in order: a request is "done" once it is enqueued, and the combine that
reads a received range is enqueued after it on the same stream. Nothing waits on the host;
the watchdog watches the stream.

NCCL pairs messages by order between two ranks, not by tag: the core's schedules post them
in the same order on both sides.
"""

from __future__ import annotations

from typing import Any


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
        comm = self._begin()
        t = self.transport
        comm.send(data.data.ptr, data.nbytes, t.byte_type, dst, t.stream.ptr)
        return _Request(self)

    def recv(self, into, src: int, tag: tuple, *, in_place: bool) -> _Request:
        target = into if in_place else self.arrays.empty(into.shape, into.dtype, like=into)
        comm = self._begin()
        t = self.transport
        comm.recv(target.data.ptr, target.nbytes, t.byte_type, src, t.stream.ptr)
        return _Request(self, target)

    def release(self, request: _Request) -> None:
        request.data = None  # scratch goes back to CuPy's pool, in stream order


    def cancel(self, requests: list) -> None:
        # NCCL cannot withdraw a posted receive: close the group; the watchdog aborts the
        # communicator if the peer never sends.
        self.flush()
