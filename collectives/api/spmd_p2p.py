"""Point-to-point messages between two ranks (mixed into :class:`~collectives.Communicator`).

Messages travel on a channel of their own, so they never disturb collectives; between two
ranks, messages with the same tag arrive in the order they were sent (MPI's rule). A send may
wait until the matching receive is posted, as MPI's may: post receives first, or use
``isend``/``irecv``, whose handles are the same :class:`~collectives.Work` as asynchronous
collectives' (``irecv(...).wait()`` returns the filled array).

A receive that times out is withdrawn and raises ``CollectiveTimeoutError``; unlike a
collective's, it leaves the communicator usable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.validate import check_out, check_timeout
from ..runtime.work import Operation, Work

MAX_TAG = 32767  # the largest tag the MPI standard promises everywhere


class _Message:
    """A posted send or receive as an operation's stage."""

    __slots__ = ("channel", "peer", "request", "result")

    def __init__(self, channel: Any, request: Any, peer: int, result: Any):
        self.channel, self.request, self.peer, self.result = channel, request, peer, result

    def advance(self) -> bool:
        return self.request.done()

    def pending_peers(self) -> list[int]:
        return [self.peer]

    def abort(self) -> None:  # a timed-out receive is withdrawn, so nothing lands later
        self.channel.cancel([self.request])


class PointToPointOps:
    """send, recv, isend, irecv."""

    def _peer(self, peer: Any, argument: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
            raise TypeError(f"{argument} must be an integer rank, not {type(peer).__name__}")
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"{argument}={peer} must be another rank of this communicator "
                             f"(0..{self.size - 1}, not {self.rank} itself)")
        return int(peer)

    def _tag(self, tag: Any) -> int:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not (
                0 <= tag <= MAX_TAG):
            raise ValueError(f"tag={tag!r} must be an integer from 0 to {MAX_TAG}")
        return int(tag)

    def _message(self, what: str, direction: str, peer: int, tag: int, array: Any,
                 timeout: float | None) -> Work:
        engine = self._engine
        channel = self.transport.p2p  # (it pairs messages of one tag in order, as MPI does)
        flat = array.reshape(-1)
        if direction == "send":
            request = channel.send(flat, peer, (tag, 0, 0, 0))
        else:
            request = channel.recv(flat, peer, (tag, 0, 0, 0), in_place=True)
        stage = _Message(channel, request, peer, array if direction == "recv" else None)
        subject = f"{what} {'to' if direction == 'send' else 'from'} rank {peer} (tag {tag})"
        op = Operation(engine, engine.seq, subject, [stage], lambda: stage.result,
                       breaking=False)
        return engine.run(op, True, None)

    def send(self, x: Any, dst: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``x`` to rank ``dst``; returns once ``x`` may be changed again."""
        check_timeout(timeout)  # before anything is posted
        self._post("send", x, dst, tag).wait(timeout)

    def recv(self, out: Any, src: int, tag: int = 0, *, timeout: float | None = None) -> Any:
        """Receive from rank ``src`` into ``out`` (its shape and dtype must match what was
        sent); returns ``out``."""
        check_timeout(timeout)  # before anything is posted
        return self._post("recv", out, src, tag).wait(timeout)

    def isend(self, x: Any, dst: int, tag: int = 0) -> Work:
        """Post a send; ``x`` must not change before the handle's ``wait()`` returns."""
        return self._post("send", x, dst, tag)

    def irecv(self, out: Any, src: int, tag: int = 0) -> Work:
        """Post a receive into ``out``; the handle's ``wait()`` returns the filled ``out``."""
        return self._post("recv", out, src, tag)

    def _post(self, direction: str, array: Any, peer: Any, tag: Any) -> Work:
        argument = "dst" if direction == "send" else "src"
        peer, tag = self._peer(peer, argument), self._tag(tag)
        if direction == "send":
            array = self.adapt(array, "x")
            if not self.arrays.contiguous(array):
                array = self.arrays.flat(array)
        else:
            check_out(array, tuple(array.shape), array.dtype, "out", self.arrays)
        engine = self._engine
        engine.enter(direction)
        try:
            crowded = engine.crowded()
            if crowded is not None:  # (a message is between two ranks: refused here alone)
                raise crowded
            return self._message(direction, direction, peer, tag, array, None)
        finally:
            engine.leave()
