"""What a communicator has in flight: the limit on handles not yet waited on, what a rank
that leaves tells its peers, and what becomes of calls in flight when it is freed (a mixin
of ``Engine``, over its ``outstanding``, ``inflight``, ``state``, ``seq`` and ``wait``).

At most ``MAX_IN_FLIGHT`` asynchronous collectives may be issued and not yet waited on (or
dropped) on one rank; a call past it is refused before any data moves, through its agreement
as a bad argument is (``CallRunner.start``): a peer that waited for its handles has room, and
hears of the refusal. A rank that leaves with calls in flight tells its peers which ones
(``calls_pending``, after ``finished_through``): they are lost with it.

Freed with calls in flight (``drain``), a communicator first lets its collectives finish,
each within its deadline, as MPI lets pending operations complete, and withdraws its
messages; an error that leaves a ``with`` block instead abandons them (``abandon``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..errors import CollectiveError, CommunicatorBrokenError
from .calls import described_fully
from .departures import exit_notice
from .operation import Operation
from .work import Work

MAX_IN_FLIGHT = 1024  # collective handles not waited on (and messages in flight) at once


class InFlight:
    """The engine's accounting of calls in flight (see the module's docstring)."""

    rank: int
    size: int
    seq: int
    outstanding: int
    inflight: list
    state: Any
    transport: Any
    broken: str | None
    only_exits: bool
    calls_apart: int | None  # (the transport's)
    wait: Any  # (Engine.wait)

    def crowded(self, collective: bool = True, count: int = 1) -> CollectiveError | None:
        """The error refusing ``count`` more asynchronous calls at the limit: ``MAX_IN_FLIGHT``
        collective handles not yet waited on on this rank (a collective carries the refusal
        into its agreement, so that its peers hear of it), or, for a message, operations
        running (refused on this rank alone: a message is between two ranks)."""
        if (self.outstanding if collective else len(self.inflight)) + count <= MAX_IN_FLIGHT:
            return None
        what = "collective handles would be unwaited" if collective else "calls would be in flight"
        return CollectiveError(f"rank {self.rank}: more than {MAX_IN_FLIGHT} {what} on this "
                               "communicator; wait() for some first (this call was not issued)")

    def make_room(self, op: Operation) -> None:
        """Before ``op`` is issued: wait for each collective still in flight ``calls_apart``
        or more call numbers before it (the transport's messages carry only the low bits of
        a call's number: theirs would pair with ``op``'s). Handles dropped unwaited leave
        their calls in flight, so the limit on handles does not bound this. A call waited
        for here still reports its outcome at its own ``wait()`` (or, dropped, logs it)."""
        apart = self.calls_apart
        assert apart is not None  # (the engine asks only where the transport has a limit)
        while True:
            with self.state:  # (calls leave the list on the progress thread meanwhile)
                if not self.inflight or op.seq - self.inflight[0].seq < apart:
                    return  # (the list is in call order: its first is the oldest)
                oldest = next((o for o in self.inflight if o.breaking and not o.finished),
                              None)
            if oldest is None or op.seq - oldest.seq < apart:
                return
            try:
                self.wait(oldest, oldest.timeout)
            except CollectiveError:  # (its own handle reports it; a broken communicator
                if not oldest.finished:  # refuses ``op`` next)
                    return

    def handed_out(self, op: Operation, work: Work) -> None:
        self.outstanding += 1  # (``work``, op's handle, counts until waited on or dropped)
        op.counted = True
        op.handle = weakref.ref(work, functools.partial(self.settle, op))

    def settle(self, op: Operation, _dropped: Any = None) -> None:
        """``op``'s handle no longer counts (waited on; or dropped: ``_dropped``, its ref)."""
        if op.counted:
            op.counted = False
            self.outstanding -= 1

    def checks_in_flight(self) -> dict[int, int]:
        """The check values of this rank's collectives in flight, by call number: what a peer
        whose call of that number waits in vain compares with its own (``check_dispute``)."""
        return {op.seq: op.check for op in self._checked_in_flight()}

    def call_in_flight(self, seq: int) -> tuple[int, str] | None:
        """``(check, description)`` of this rank's collective ``seq`` while in flight (None:
        it is not): for a peer whose own call of that number stalled."""
        op = next((op for op in self._checked_in_flight() if op.seq == seq), None)
        return None if op is None else (op.check, described_fully(op.subject))

    def _checked_in_flight(self) -> list[Operation]:
        return [op for op in list(self.inflight)  # (a copy: other threads change the list)
                if op.breaking and not op.finished and op.check]

    def finished_through(self) -> int:
        """The latest call before which every call here has finished: what a rank that leaves
        tells its peers (its calls in flight are lost with it: peers must not wait for them)."""
        pending = self.calls_pending()
        return min(pending) - 1 if pending else self.seq

    def calls_pending(self) -> frozenset[int]:
        """The collectives in flight here: those a rank that leaves loses with it."""
        with self.state:
            return frozenset(op.seq for op in self.inflight if op.breaking and not op.finished)

    def drain(self) -> None:
        """Before the communicator is freed: every collective in flight runs to its end, each
        within its own deadline (a failure breaks the communicator as ever, and the call's
        handle reports it at its ``wait()``); every message in flight is withdrawn (its
        ``wait()`` raises ``CommunicatorBrokenError``: it may never come). Freeing under
        calls in flight left MPI's to fail on a freed communicator (a raw MPI error)."""
        with self.state:
            ops = [op for op in self.inflight if not op.finished]
        for op in ops:
            if op.breaking:
                try:
                    self.wait(op, op.timeout)
                except CollectiveError:
                    pass  # (the call's own wait() reports it)
                continue
            with self.state:
                op.fail(CommunicatorBrokenError(
                    f"rank {self.rank}: {op.description} was withdrawn: its communicator was "
                    "freed first"))
                if op in self.inflight:
                    self.inflight.remove(op)

    def abandon(self, error: BaseException) -> None:
        """This rank stops using the communicator without freeing it (``error`` left its
        ``with`` block: freeing is collective, and its peers may wait in a call it will not
        make): its peers hear that it left, with the messages it sent (``departures``), and
        its calls in flight fail."""
        if self.size > 1:  # (whatever broke it: a peer freeing it must hear this one left)
            self.transport.notify_failure(exit_notice(
                self.transport, self.finished_through(), f"{type(error).__name__}: {error}"))
        with self.state:  # (its sends stay posted: the notice counts them, a peer takes them)
            for op in self.inflight:
                if op.breaking or op.stages[0].receiving:
                    op.fail(CommunicatorBrokenError(
                        f"rank {self.rank}: {op.description} was abandoned: "
                        f"{type(error).__name__} left its communicator's with block"))
            self.inflight[:] = [op for op in self.inflight if not op.finished]
