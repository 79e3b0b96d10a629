"""The world thread ranks share, and the library's own messages between them.

A ``ThreadWorld`` holds what the ranks of one world share: a mailbox per message, a condition
per rank, failure notices, what each rank is doing, and the users' point-to-point postings. A
``ThreadChannel`` carries the schedules' messages through it: a send posts a view of the
sender's buffer; a receive reads straight out of it (zero copies) or copies it into place, and
the sender's request completes once the receiver is done with it. Every message carries its
call's check value and its length, so ranks that disagree about a call fail with
``CollectiveMismatchError`` instead of pairing up.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from collectives.arrays import NUMPY
from collectives.errors import CollectiveMismatchError
from collectives.runtime.calls import described_fully
from collectives.runtime.transport import Failure

from .p2p import Postings

_worlds = itertools.count()


class ThreadWorld:
    """State shared by the thread ranks of one world: mailboxes, notices and activity."""

    def __init__(self, size: int, timeout: float):
        self.size, self.timeout, self.id = size, timeout, next(_worlds)
        self.lock = threading.Lock()
        # One condition per rank over one lock: a message wakes only the rank it is for.
        self.conds = [threading.Condition(self.lock) for _ in range(size)]
        self.events = [0] * size
        self.mail: dict[tuple, _Message] = {}
        self.agreeing: dict[tuple[int, int], int] = {}
        self.notices: list[Failure] = []  # every rank's notices, in the order sent
        self.activity: list[Any] = [None] * size
        self.transports: list[Any] = [None] * size  # weak references to the ranks' transports
        self.children: dict[tuple, Any] = {}
        self.postings = Postings()  # users' point-to-point messages not yet paired

    def wake(self, rank: int) -> None:  # call with the lock held
        self.events[rank] += 1
        self.conds[rank].notify_all()

    def wake_all(self) -> None:
        for r in range(self.size):
            self.wake(r)


class _Message:
    __slots__ = ("check", "data", "done", "refused")

    def __init__(self, data, check: int):
        self.data, self.check, self.done = data, check, False
        self.refused: str | None = None  # why the receiver would not take it


class _Send:
    __slots__ = ("message",)
    data = None

    def __init__(self, message: _Message):
        self.message = message

    def done(self) -> bool:
        if self.message.refused is not None:  # the sender fails too, not only the receiver
            raise CollectiveMismatchError(self.message.refused)
        return self.message.done


class _Recv:
    __slots__ = ("channel", "check", "data", "in_place", "into", "key", "message", "src")

    def __init__(self, channel, key, into, src: int, check: int, in_place: bool):
        self.channel, self.key, self.into, self.src = channel, key, into, src
        self.check, self.in_place = check, in_place
        self.message: _Message | None = None
        self.data = None

    def done(self) -> bool:
        if self.message is not None:
            return True
        return self.channel._match(self)


class ThreadChannel:
    """One channel of the library's own messages ("data" or "control") of one thread rank."""

    arrays = NUMPY

    def __init__(self, world: ThreadWorld, rank: int, name: str):
        self.world, self.rank, self.size, self.name = world, rank, world.size, name

    def send(self, data, dst: int, tag: tuple) -> _Send:
        seq, check, index, pos = tag
        message = _Message(data, check)
        world = self.world
        with world.lock:
            world.mail[(self.name, self.rank, dst, seq, index, pos)] = message
            if self.name == "control":
                world.agreeing[dst, seq] = world.agreeing.get((dst, seq), 0) + 1
            world.wake(dst)
        return _Send(message)

    def recv(self, into, src: int, tag: tuple, *, in_place: bool) -> _Recv:
        seq, check, index, pos = tag
        return _Recv(self, (self.name, src, self.rank, seq, index, pos), into, src, check,
                     in_place)

    def _match(self, request: _Recv) -> bool:
        world = self.world
        with world.lock:
            message = world.mail.pop(request.key, None)
            if message is None:
                return False
            if self.name == "control":
                count = world.agreeing.pop((self.rank, request.key[3]), 1) - 1
                if count:
                    world.agreeing[self.rank, request.key[3]] = count
        data, into = message.data, request.into
        problem = None
        if message.check != request.check:
            problem = ("its message belongs to a call with other arguments (ranks called "
                       "different collectives, or the same one with different arguments)")
            calls = [_call_in_flight(world, r, request.key[3]) for r in (request.src, self.rank)]
            if None not in calls and calls[0] != calls[1]:
                problem = f"it runs {calls[0]} where this rank runs {calls[1]}: {problem}"
        elif data.shape != into.shape or data.dtype != into.dtype:
            problem = (f"it sent {data.size} elements of {data.dtype} where {into.size} of "
                       f"{into.dtype} were expected (ranks passed different shapes or dtypes)")
        if problem is not None:
            message.refused = (f"rank {request.src}: call {request.key[3]}: rank {self.rank} "
                               f"refused its message: {problem}")
            self._finish(request.src, message)
            raise CollectiveMismatchError(
                f"rank {self.rank}: call {request.key[3]}: rank {request.src} disagrees: {problem}")
        if request.in_place:
            NUMPY.copy(into, data)
            self._finish(request.src, message)
            data = into
        request.message, request.data = message, data
        return True

    def _finish(self, src: int, message: _Message) -> None:
        with self.world.lock:
            message.done = True
            # the sender's buffer is the sender's again: nothing of this rank refers to it (a
            # fused bucket is reused only where nothing else does, algorithms/reuse.py)
            message.data = None
            self.world.wake(src)

    def release(self, request: _Recv) -> None:
        assert request.message is not None  # released once it has matched its message
        request.data = None
        self._finish(request.src, request.message)

    def cancel(self, requests: list) -> None:
        for request in requests:  # receives matched but unread: let their senders go
            if isinstance(request, _Recv) and request.message is not None and (
                    not request.message.done):
                self.release(request)


def _call_in_flight(world: ThreadWorld, rank: int, seq: int) -> str | None:
    """How rank ``rank`` of ``world`` describes its call ``seq``, from the activity it
    published as it issued its latest call (None: that is another call)."""
    activity = world.activity[rank]
    if activity is None or activity[0] != seq:
        return None
    return described_fully(activity[1])
