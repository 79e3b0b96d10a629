"""The communicator's own ``send``/``recv`` over MPI: messages that say what they hold, taken
strictly in order.

A message of up to ``typed.SMALL`` bytes travels as one MPI message, its header
(``typed.py``) and data together; a larger one as its header, then its data (as it is, no
copy). A receive posts no MPI receive until its turn: the oldest receive waiting on a (source,
tag) posts the receive of the next message's header (only the oldest: no other receive can
take it), reads the header, and then takes exactly the data the header announces, with
matched probes (``Improbe``): into its own array when the header matches, else into
scratch, raising
``CollectiveMismatchError`` naming both dtypes and lengths. So a mismatch
or a withdrawn receive never pairs a later message with the wrong receive: a receive
withdrawn (its timeout) before its header came took nothing, and the next receive gets that
message; one whose header came as it was withdrawn (the rank was not running when the message
arrived) hands the header to the next receive of that source and tag, so nothing is lost; one
withdrawn while taking its data takes the rest into scratch, ahead of the next receive.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.errors import CollectiveMismatchError

from . import tuning, typed
from .channel import MPIChannel, _Send


class MessageChannel(MPIChannel):
    """The ``p2p`` channel: typed messages, each taken whole by the receive it pairs with."""

    def __init__(self, comm: Any, tags: Any):
        super().__init__(comm, tags, "p2p", probe=False)
        self.queues: dict[tuple[int, int], deque] = {}  # receives waiting, by (source, tag)
        # headers that came as their receives were withdrawn, for the next receives, in order
        self.held: dict[tuple[int, int], deque] = {}
        # MPI messages sent to and received from each peer: what a free drains (draining:
        # a user's message no receive took must not reach the next communicator)
        size = comm.Get_size()
        self.sent, self.received = [0] * size, [0] * size

    def send(self, data: np.ndarray, dst: int, tag: tuple) -> _Send:
        seq = tag[0]
        t = self.tags.tag(seq, 0)
        raw = data.view(np.uint8)
        first = typed.first_piece(data, raw)
        comm = self.comm
        reqs = [comm.Isend([first, MPI.BYTE], dst, t)]
        if typed.follows(len(raw)):
            reqs += [comm.Isend([raw[a:b], MPI.BYTE], dst, t)
                     for a, b in tuning.chunks(len(raw), tuning.MAX_COUNT)]
        self.sent[dst] += len(reqs)
        return _Send(self, reqs, (raw, first), dst, seq)

    def recv(self, into: np.ndarray, src: int, tag: tuple, *, in_place: bool) -> _Take:
        key = (src, self.tags.tag(tag[0], 0))
        take = _Take(self, into, src, tag[0], key)
        self.queues.setdefault(key, deque()).append(take)
        return take

    def release(self, request: Any) -> None:
        """Nothing to give back: receives land in place."""

    def cancel(self, requests: list) -> None:
        for request in requests:
            if isinstance(request, _Take):
                request.withdraw()

    def turn(self, take: _Take) -> bool:
        """Whether ``take`` is the oldest receive of its (source, tag); withdrawn receives
        ahead of it first take the rest of their messages."""
        queue = self.queues[take.key]
        while queue[0] is not take:
            if not queue[0].withdrawn or not queue[0].step():
                return False
        return True

    def finished(self, take: _Take) -> None:
        queue = self.queues[take.key]
        queue.remove(take)
        if not queue:
            del self.queues[take.key]


class _Take:
    """One receive: the header of the next message from ``src`` with its tag (a receive
    posted once this one is the oldest), then the data it announces (matched probes)."""

    __slots__ = ("channel", "data", "discard", "done_", "error", "head", "head_req", "key",
                 "keep", "pieces", "req", "seq", "src", "status", "withdrawn")

    def __init__(self, channel: MessageChannel, data: np.ndarray, src: int, seq: int,
                 key: tuple[int, int]):
        self.channel, self.data, self.src, self.seq, self.key = channel, data, src, seq, key
        self.head: np.ndarray | None = None  # where the header (and small data) lands
        self.head_req: Any = None  # its receive, posted when this receive's turn comes
        self.pieces: list | None = None  # the data's byte ranges still to take, once known
        self.req: Any = None  # the piece being received
        self.keep: Any = None  # where it lands, alive until it has
        self.discard = False  # what is left of its message goes to scratch
        self.withdrawn = False  # its owner gave up: later receives take the rest for it
        self.error: Exception | None = None  # raised once the whole message is taken
        self.done_ = False
        self.status = MPI.Status()

    def done(self) -> bool:
        if self.done_:
            return True
        return self.channel.turn(self) and self.step()

    def step(self) -> bool:
        """Take what has come; True once the whole message is taken."""
        try:
            return self._step()
        except MPI.Exception as exc:
            self._finish()  # (a truncated message was taken whole: nothing of it follows)
            head = self.head
            if exc.Get_error_class() == MPI.ERR_TRUNCATE and head is not None:
                problem = typed.difference(head, self.data)  # MPI kept what fits: the header
                if problem is not None:
                    raise self._disagree(problem) from exc
            raise self.channel.failed("receiving from", self.src, self.seq, exc) from exc

    def _step(self) -> bool:
        if self.pieces is None and not self._header():
            return False
        status = self.status
        while self.pieces:
            if self.req is not None:
                if not self.req.Test():
                    return False
                self.req = self.keep = None
                self.pieces.pop(0)
                continue
            message = self.channel.comm.Improbe(self.src, self.key[1], status)
            if message is None:
                return False
            self.channel.received[self.src] += 1
            a, b = self.pieces[0]
            got = status.Get_count(MPI.BYTE)
            mine = not self.discard and got == b - a
            self.keep = self.data.view(np.uint8)[a:b] if mine else np.empty(got, np.uint8)
            self.req = message.Irecv([self.keep, MPI.BYTE])
        self._finish()
        if self.error is not None and not self.withdrawn:
            raise self.error
        return True

    def _header(self) -> bool:
        """Take the next message's header (one a withdrawn receive handed on, else one that
        came); False while none has."""
        held = self.channel.held.get(self.key) if self.head_req is None else None
        if held:
            self.head = held.popleft()
            if not held:
                del self.channel.held[self.key]
            self._read_header(len(self.head))
            return True
        if self.head_req is None:  # up to SMALL bytes of data may ride with the header
            nbytes = self.data.nbytes if not self.withdrawn else 0
            self.head = np.empty(typed.HEADER + min(nbytes, typed.SMALL), np.uint8)
            self.head_req = self.channel.comm.Irecv([self.head, MPI.BYTE], self.src, self.key[1])
        try:
            came = self.head_req.Test(self.status)
        except MPI.Exception:
            self.channel.received[self.src] += 1  # (truncated, but taken: step says so)
            raise
        if not came:
            return False
        self.channel.received[self.src] += 1
        self._read_header(self.status.Get_count(MPI.BYTE))
        return True

    def _read_header(self, got: int) -> None:
        """What the header says: the data that follows it, and whether it is this receive's."""
        assert self.head is not None  # its receive has completed
        head, self.head = self.head[:got], None
        problem = typed.difference(head, self.data)
        nbytes = self.data.nbytes if problem is None else typed.announced(head)
        self.pieces = (list(tuning.chunks(nbytes, tuning.MAX_COUNT))
                       if nbytes is not None and typed.follows(nbytes) else [])
        if problem is not None:  # take the whole message all the same (the sender's completes)
            self.discard = True
            self.error = self._disagree(problem)
        elif not self.pieces and not self.discard:
            self.data.view(np.uint8)[:] = head[typed.HEADER:]

    def _disagree(self, problem: str) -> CollectiveMismatchError:
        return CollectiveMismatchError(f"rank {self.channel.rank}: {self.channel.what} "
                                       f"{self.seq}: rank {self.src} disagrees: {problem}")

    def _finish(self) -> None:
        if not self.done_:
            self.done_ = True
            self.channel.finished(self)

    def withdraw(self) -> None:
        """This receive gives up (its timeout): before its header came it takes nothing and
        leaves the queue; if the header came as it gave up, the next receive of its source
        and tag gets it (and the data behind it); once it was taking the data, the rest of
        its message still goes, to scratch."""
        if self.done_:
            return
        if self.pieces is None and self.head_req is not None:
            try:
                self.head_req.Cancel()
                self.head_req.Wait(self.status)  # at once: cancelled, or the header came
                taken = not self.status.Is_cancelled()
                self.channel.received[self.src] += taken
            except MPI.Exception:
                taken = False  # a truncated header: taken whole, nothing follows
                self.channel.received[self.src] += 1
            self.head_req = None
            if taken and self.head is not None:
                head = self.head[:self.status.Get_count(MPI.BYTE)]
                self.channel.held.setdefault(self.key, deque()).append(head)
                self.head = None
                self._finish()
                return
        if self.pieces is None or (not self.pieces and self.req is None):
            self._finish()  # nothing of a message is left to take
            return
        self.withdrawn = self.discard = True
        self.channel.withdrew = True  # MPI may still write what it takes
