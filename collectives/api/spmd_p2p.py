"""Point-to-point messages between two ranks (mixed into ``Communicator``).

Messages travel on a channel of their own, so they never disturb collectives; between two
ranks, messages with the same tag arrive in the order they were sent (MPI's rule). A send may
wait until the matching receive is posted, as MPI's may: post receives first, or use
``isend``/``irecv``, whose handles are the same ``Work`` as asynchronous
collectives' (``irecv(...).wait()`` returns the filled array).

A receive that times out is withdrawn and raises ``CollectiveTimeoutError``; unlike a
collective's, it leaves the communicator usable. So does a peer that leaves (its program ended,
or its thread rank's code raised): its messages still arrive, and a message nothing will match
raises ``PeerFailedError`` at once (``runtime/departures.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array_kinds import viewed_in_place
from ..hints import Array, ArrayT
from ..runtime.departures import Ledger
from ..runtime.operation import Operation
from ..runtime.validate import check_communicable, check_out, check_timeout
from ..runtime.work import Work
from ..timeline import record_messages, recorder
from .comm_parts import CommParts

MAX_TAG = 32767  # the largest tag the MPI standard promises everywhere


class _Message:
    """A posted send or receive as an operation's stage (what ``runtime.departures`` reads
    of it: ``peer``, ``tag``, ``receiving``, and ``taken``: a receive whose message came)."""

    __slots__ = ("channel", "ledger", "peer", "receiving", "request", "result", "tag", "taken")

    def __init__(self, channel: Any, request: Any, peer: int, tag: int, result: Any,
                 ledger: Ledger | None):
        """``ledger``: a receive's (None: a send), which counts it once its message came."""
        self.channel, self.request, self.peer, self.tag = channel, request, peer, tag
        self.result, self.ledger = result, ledger
        self.receiving, self.taken = ledger is not None, False

    def advance(self) -> bool:
        if not self.request.done():
            return False
        if self.ledger is not None and not self.taken:
            self.taken = True
            self.ledger.received[self.peer, self.tag] += 1
        return True

    def pending_peers(self) -> list[int]:
        return [self.peer]

    def abort(self) -> None:  # a timed-out receive is withdrawn: its message goes to the
        self.channel.cancel([self.request])  # next receive (a piece MPI is already writing
        # still lands in this one's buffer: docs/reliability.md)


class PointToPointOps(CommParts):
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

    def _message(self, direction: str, peer: int, tag: int, array: Any, given: Any,
                 blocking: bool, t0: int) -> Work:
        """Post the message (``given``: the array as the caller passed it, for the timeline)."""
        engine = self.calls.engine
        channel = self.transport.p2p  # (it pairs messages of one tag in order, as MPI does)
        flat = array.reshape(-1)
        if direction == "send":
            request = channel.send(flat, peer, (tag, 0, 0, 0))
            engine.messages.sent[peer, tag] += 1
            stage = _Message(channel, request, peer, tag, None, None)
        else:
            request = channel.recv(flat, peer, (tag, 0, 0, 0), in_place=True)
            stage = _Message(channel, request, peer, tag, given, engine.messages)
        subject = f"{direction} {'to' if direction == 'send' else 'from'} rank {peer} (tag {tag})"
        op = Operation(engine, engine.seq, subject, [stage], lambda: stage.result,
                       breaking=False)
        if recorder.ON:  # (blocking ones on the communicator's track, others on a lane)
            record_messages.issued(self, op, direction, peer, tag, given, not blocking, t0)
        return engine.run(op, True, None)

    def send(self, x: Array, dst: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``x`` to rank ``dst``; returns once ``x`` may be changed again.

        Parameters
        ----------
        x
            The array to send.
        dst
            The receiving rank.
        tag
            Messages of one ``(source, tag)`` are received in the order they were sent.
        timeout
            Seconds to wait for the receiver (None: the communicator's timeout).

        Raises
        ------
        ValueError
            ``dst`` is no rank or ``tag`` is negative; TypeError for a bad ``x``.
        CollectiveTimeoutError
            The message was not taken within ``timeout``.
        """
        timeout = check_timeout(timeout)  # before anything is posted
        self._post("send", x, dst, tag, blocking=True).wait(timeout)

    def recv(self, out: ArrayT, src: int, tag: int = 0, *, timeout: float | None = None) -> ArrayT:
        """Receive from rank ``src`` into ``out``.

        Parameters
        ----------
        out
            Where the message goes; its dtype and size must match what was sent (the
            shape is the receiver's own: a (2, 2) message fills a (4,) out).
        src
            The sending rank.
        tag
            The tag the message was sent with.
        timeout
            Seconds to wait for the message (None: the communicator's timeout).

        Returns
        -------
        ArrayT
            ``out``, filled.

        Raises
        ------
        ValueError
            ``src`` is no rank, ``tag`` is negative, or the message does not fit ``out``.
        CollectiveTimeoutError
            No message came within ``timeout``.
        """
        timeout = check_timeout(timeout)  # before anything is posted
        return self._post("recv", out, src, tag, blocking=True).wait(timeout)

    def isend(self, x: Array, dst: int, tag: int = 0) -> Work[None]:
        """Post a send; ``x`` must not change before the handle's ``wait()`` returns.

        Parameters
        ----------
        x
            The array to send.
        dst
            The receiving rank.
        tag
            Messages of one ``(source, tag)`` are received in the order they were sent.

        Returns
        -------
        Work
            A handle whose ``wait()`` returns None once the message is sent.

        Raises
        ------
        ValueError
            ``dst`` is no rank or ``tag`` is negative; TypeError for a bad ``x``.
        """
        return self._post("send", x, dst, tag)

    def irecv(self, out: ArrayT, src: int, tag: int = 0) -> Work[ArrayT]:
        """Post a receive into ``out``.

        Parameters
        ----------
        out
            Where the message goes; its dtype and size must match what was sent (the
            shape is the receiver's own: a (2, 2) message fills a (4,) out).
        src
            The sending rank.
        tag
            The tag the message was sent with.

        Returns
        -------
        Work
            A handle whose ``wait()`` returns the filled ``out``.

        Raises
        ------
        ValueError
            ``src`` is no rank or ``tag`` is negative.
        """
        return self._post("recv", out, src, tag)

    def _post(self, direction: str, array: Any, peer: Any, tag: Any,
              blocking: bool = False) -> Work:
        t0 = recorder.now() if recorder.ON else 0  # (recording a timeline: the span's start)
        argument = "dst" if direction == "send" else "src"
        peer, tag = self._peer(peer, argument), self._tag(tag)
        given = array
        if direction == "send":
            given = array = self.adapt(viewed_in_place(array, "x"), "x")
            check_communicable(np.dtype(array.dtype), "x")
            if not self.arrays.contiguous(array):
                array = self.arrays.flat(array)
        else:  # (a PyTorch CPU tensor: its NumPy view is filled, the tensor handed back)
            array = viewed_in_place(array, "out")
            if not (hasattr(array, "shape") and hasattr(array, "dtype")):
                raise TypeError(f"out must be an array to receive into, not "
                                f"{type(array).__name__}")
            check_out(array, tuple(array.shape), array.dtype, "out", self.arrays)
            check_communicable(np.dtype(array.dtype), "out")
        engine = self.calls.engine
        engine.enter(direction)
        try:
            crowded = engine.crowded(collective=False)
            if crowded is not None:  # (a message is between two ranks: refused here alone)
                raise crowded
            if engine.broken is not None:  # (a peer left: not to it, nor from it past its last)
                refusal = engine.message_refusal(direction == "recv", peer, tag)
                if refusal is not None:
                    raise refusal
            return self._message(direction, peer, tag, array, given, blocking, t0)
        finally:
            engine.leave()
