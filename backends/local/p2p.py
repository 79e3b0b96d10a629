"""Users' point-to-point messages between thread ranks (``comm.send``/``recv``), matched as
MPI matches them.

Between two ranks, messages with one tag pair with receives in order: the k-th send with the
k-th receive still posted. A send posts a view of the sender's buffer; the receive that pairs
with it copies it into place, and the sender's request completes then. A receive that is
withdrawn (its wait timed out) leaves the queue unpaired, so the next receive gets the message
it would have had; a send withdrawn before any receive paired with it is never delivered.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from collectives.arrays import NUMPY
from collectives.errors import CollectiveMismatchError

WAIT_SLICE = 0.05  # how often a withdrawing sender re-checks a receiver still copying


class Postings:
    """Every rank's unpaired sends and receives of one world, by ``(src, dst, tag)``."""

    def __init__(self) -> None:
        self.sends: dict[tuple, deque] = {}
        self.recvs: dict[tuple, deque] = {}


class _Send:
    __slots__ = ("data", "done_reading", "key", "taken")

    def __init__(self, data: Any, key: tuple):
        self.data, self.key = data, key
        self.taken = False  # a receive paired with it (and reads it now, or has)
        self.done_reading = False

    def done(self) -> bool:
        return self.done_reading


class _Recv:
    __slots__ = ("channel", "data", "into", "key", "src", "finished")

    def __init__(self, channel: ThreadMessages, key: tuple, into: Any, src: int):
        self.channel, self.key, self.into, self.src = channel, key, into, src
        self.data = None
        self.finished = False

    def done(self) -> bool:
        if not self.finished:
            self.finished = self.channel._pair(self)
        return self.finished


class ThreadMessages:
    """The ``p2p`` channel of one thread rank (tags: ``(user tag, ...)``; the rest unused)."""

    arrays = NUMPY

    def __init__(self, world: Any, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        self.postings: Postings = world.postings

    def send(self, data, dst: int, tag: tuple) -> _Send:
        request = _Send(data, (self.rank, dst, tag[0]))
        world = self.world
        with world.lock:
            self.postings.sends.setdefault(request.key, deque()).append(request)
            world.wake(dst)
        return request

    def recv(self, into, src: int, tag: tuple, *, in_place: bool = True) -> _Recv:
        key = (src, self.rank, tag[0])
        request = _Recv(self, key, into, src)
        with self.world.lock:
            self.postings.recvs.setdefault(key, deque()).append(request)
        return request

    def _pair(self, request: _Recv) -> bool:
        """Take the oldest message for ``request`` if it is the oldest receive posted, and
        copy it in. (This rank's engine never runs this and ``cancel`` at once.)"""
        world, postings, key = self.world, self.postings, request.key
        with world.lock:
            recvs, sends = postings.recvs.get(key), postings.sends.get(key)
            if not sends or not recvs or recvs[0] is not request:
                return False
            message = sends.popleft()
            recvs.popleft()
            message.taken = True
            _drop_empty(postings, key)
        data, into = message.data, request.into
        try:
            if data.shape != into.shape or data.dtype != into.dtype:
                raise CollectiveMismatchError(
                    f"rank {self.rank}: message tag {key[2]}: rank {request.src} disagrees: it "
                    f"sent {data.size} elements of {data.dtype} where {into.size} of "
                    f"{into.dtype} were expected (ranks passed different shapes or dtypes)")
            NUMPY.copy(into, data)
        finally:
            with world.lock:
                message.done_reading = True
                world.wake(request.src)
        request.data = into
        return True

    def release(self, request: Any) -> None:
        """Nothing to give back: a receive copies its message in as it pairs."""


    def cancel(self, requests: list) -> None:
        """Withdraw requests that no peer has paired with; a send a receiver is reading from
        right now is waited for (its buffer must not change under the copy)."""
        world, postings = self.world, self.postings
        with world.lock:
            for request in requests:
                table = postings.recvs if isinstance(request, _Recv) else postings.sends
                queue = table.get(request.key)
                if queue is not None and request in queue:
                    queue.remove(request)
                    _drop_empty(postings, request.key)
                while isinstance(request, _Send) and request.taken and not request.done_reading:
                    world.conds[self.rank].wait(WAIT_SLICE)


def _drop_empty(postings: Postings, key: tuple) -> None:
    for table in (postings.sends, postings.recvs):
        if key in table and not table[key]:
            del table[key]
