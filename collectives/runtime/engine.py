"""The engine under a Communicator: call numbering, agreement, progress, waiting, failure.

One ``Engine`` per communicator. It numbers calls (every rank numbers them alike), keeps
the signatures already agreed (the same on every rank, since every rank sees the same calls),
drives operations in flight (``collectives.runtime.work``), waits with deadlines, and turns every
failure into an error on every rank:

* a timeout raises ``CollectiveTimeoutError`` naming the missing ranks and what each rank
  says it is doing, marks the communicator broken, and tells the peers;
* a peer's failure notice fails every operation in flight with ``PeerFailedError`` naming
  that rank and its error (``CollectiveMismatchError`` where the peer found a mismatch);
* after either, every call raises ``CommunicatorBrokenError`` at once.

Which signatures are agreed, and what a new call's first stage is, is
``agreed_signatures.py``'s; how a failure spreads (breaking, peers' notices, late
agreements) is ``failures.py``'s.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from ..errors import CommunicatorBrokenError, ConcurrentCallError
from . import hang_guard, progress_thread
from .agreed_signatures import AgreedSignatures
from .call_order import CallOrder
from .departures import Ledger
from .failures import MESSAGES, Failures
from .in_flight import InFlight
from .operation import Operation, detached
from .transport import Failure, Transport
from .work import Work, in_done_callback

CALLS = logging.getLogger("collectives.calls")

SLOW_WAIT = progress_thread.SLOW_WAIT  # after this long a wait also hears peers' notices
DISPUTE_CHECK = 0.2  # how often a slow wait asks the ranks it waits for what they do
TELL_WAITING = 0.1  # how often a slow wait publishes whom it waits for


class Engine(CallOrder, AgreedSignatures, InFlight, Failures):
    """Call numbering, agreement, progress and waiting for one communicator. Its counters
    change only through its methods (call numbers and native turns: ``CallOrder``'s)."""

    def __init__(self, transport: Transport, *, timeout: float, check: bool, detail: bool):
        CallOrder.__init__(self)  # (seq, the native turns, claim_timeout)
        AgreedSignatures.__init__(self)  # (agreed, forgotten, ahead)
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.timeout, self.check, self.detail = timeout, check, detail
        self.inflight: list[Operation] = []  # in call order
        self.calls_apart = transport.calls_apart  # (``make_room``)
        # the operation being advanced now, whose work a transport is given (NCCL's watchdog
        # watches it with that call's own timeout; None between advances)
        self.advancing: Operation | None = None
        # handles of asynchronous collectives issued and not yet waited on (nor dropped):
        # counted in program order, so every rank refuses the same call at the limit
        self.outstanding = 0
        self.unreported: list[tuple[weakref.ref, Operation]] = []
        self.broken: str | None = None
        # point-to-point messages still run while every cause of ``broken`` is a peer that
        # left, to and from the ranks still there, and from it as far as it sent them
        self.only_exits = False
        self.exits: list[Failure] = []  # the notices of peers that left (``exit_loses``)
        self.suspect: tuple[int, int] | None = None  # (disputes.py: a peer done, unagreed)
        # the latest peers' refusals, by call: what a call that cannot finish names as its
        # cause (disputes.py), not the rank that finished it first
        self.refusals: dict[int, Failure] = {}
        self.messages = Ledger()  # (departures.py: the messages posted, by peer and tag)
        self.freed = False  # Communicator.free() was called: no call may run
        self.last_entered = time.monotonic()  # (failures.back_after_quiet)
        self.busy = threading.Lock()  # held by the thread inside a call
        self.state = threading.RLock()  # held while operations advance
        self.progress_thread: threading.Thread | None = None  # (progress_thread.py)
        # when a slow wait last asked peers what they do, and last published whom it waits for
        self._asked = self._told = 0.0
        # what the hang guard looks at (collectives.runtime.hang_guard): each thread's wait as
        # (deadline, timeout, operation), how many calls entered, and ``claim_timeout``
        self.waits: dict[int, tuple[float, float, Operation]] = {}
        self.entered, self.beat = 0, 0.0  # (beat: when the progress thread began a round)
        self.guarded = hang_guard.watch(self)
        transport.engine = weakref.ref(self)  # (a leaving rank asks it what it finished)

    # --- entering a call ----------------------------------------------------------------

    def enter(self, what: str, timeout: Any = None) -> None:
        """Claim the communicator for this thread's call (given ``timeout``), or raise why it
        cannot be had."""
        self.claim(what)
        self.entered += 1
        self.claim_timeout = timeout
        try:
            if what not in MESSAGES:  # (messages posted before it go out first: the
                self.transport.issue_messages()  # transport may hold them, ``Transport``)
            self.back_after_quiet(what)
            if self.broken is not None or self.unreported:
                self._raise_if_unusable(what)
        except BaseException:
            self.busy.release()
            raise

    def claim(self, what: str) -> None:
        """Hold the communicator for this thread (``leave`` lets go), or raise
        ``ConcurrentCallError`` where another thread is inside a call on it."""
        if in_done_callback():
            raise ConcurrentCallError(
                f"rank {self.rank}: {what} was called from a done-callback "
                "(Work.add_done_callback), which runs on whatever thread finishes a call, "
                "beside the program's own calls; hand the result on from the callback (e.g. "
                "to a future or a queue) and make the call from the program's thread")
        if not self.busy.acquire(blocking=False):
            raise ConcurrentCallError(
                f"rank {self.rank}: {what} was called while another thread is inside a call on "
                "this communicator; calls on one communicator must come from one thread at a "
                "time, in the same order on every rank (give each thread its own: comm.dup())")

    def leave(self) -> None:
        self.busy.release()

    def _raise_if_unusable(self, what: str) -> None:
        if self.freed:
            raise CommunicatorBrokenError(
                f"rank {self.rank}: {what} cannot run: this communicator was freed (free(), or "
                "the end of its with block); use a communicator that is still alive")
        if self.unreported:
            self._say_dropped_failures()
        if self.broken is not None and (not self.only_exits or (
                what not in MESSAGES and self.exit_loses(self.seq + 1))):
            raise self.broken_error(what)  # (peers that left joined the calls before theirs)

    def _say_dropped_failures(self) -> None:
        """Log the failures of calls whose handles were dropped without ``wait()`` (logger
        ``collectives.calls``, as asyncio logs a task's exception never retrieved), and stop
        keeping them. Never raised: raised, this call would not be issued on this rank alone
        (each rank learns of its own failure at its own time), and this rank's later calls
        would meet its peers' calls of other numbers: wrong sums where their shapes agreed.
        Nor a warning: where warnings are errors, it would be raised all the same."""
        with self.state:  # (the progress thread adds to it under this lock)
            dropped = [op for ref, op in self.unreported
                       if ref() is None and not (op.waited_by or op.claimed)]
            self.unreported = [(r, o) for r, o in self.unreported
                               if r() is not None and not (o.waited_by or o.claimed)]
        for op in dropped:
            CALLS.warning("rank %d: call %d failed, and its handle was dropped without wait(): "
                          "%s: %s", self.rank, op.seq, type(op.error).__name__, op.error)

    def reported(self, op: Operation) -> None:
        """``op``'s outcome reached its handle's ``wait()``: no later call reports it again,
        and nothing here holds it (or its buffers) any more."""
        self.settle(op)
        with self.state:  # (the progress thread may be adding it right now)
            if self.unreported:
                self.unreported = [(r, o) for r, o in self.unreported if o is not op]
            # peers that wait for this rank read "last finished call N": only where every
            # call up to the latest has (a wait from another thread, or out of order, must
            # not hide a call in flight)
            if op.seq == self.seq == self.finished_through():
                self.transport.publish_activity((op.seq, op.subject, False))

    def driven_by(self, thread: threading.Thread | None) -> None:
        """``thread`` now drives the calls in flight (``progress_thread``; None: it ended)."""
        self.progress_thread, self.beat = thread, time.monotonic()

    def heartbeat(self) -> None:
        """The progress thread begins a round (``beat``: the hang guard watches it)."""
        self.beat = time.monotonic()

    # --- running ------------------------------------------------------------------------

    def run(self, op: Operation, async_op: bool, timeout: float | None) -> Any:
        """Advance a new operation; block for it, or hand back its handle."""
        if self.inflight and self.calls_apart is not None:
            try:
                self.make_room(op)
            except BaseException as exc:  # (Ctrl-C: this call's number is taken and never
                self.broken_by(exc, op.seq)  # issued; the ranks are out of step)
                raise
        with self.state:
            # broken since ``enter`` (the progress thread saw a failure): the call must not
            # start, as it would wait for peers that will not. A message is posted already:
            # one its peer took before it left is not refused (as in ``peer_failed``)
            done = self.broken is not None and not op.breaking and op.advance()
            refusal = self.refusal(op) if self.broken is not None and not done else None
            if refusal is not None:
                op.fail(refusal)
                done = True
            elif not done:
                done = op.advance()
            if not done:
                self.inflight.append(op)
            # a peer's notice about this call came between its agreement's skipping and now
            early = not done and op.skipped_agreement and op.seq in self.ahead
            if early:
                self.ahead.discard(op.seq)
        if early:
            self.join_late(op)
        if op.error is not None:
            self.failed(op)
        if async_op:
            work: Work[Any] = Work(op)
            if op.breaking:  # a collective's handle (a message's is counted by inflight)
                self.handed_out(op, work)
            else:
                op.handle = weakref.ref(work)
            if not done:
                progress_thread.start(self)
            elif op.error is not None:
                detached(op.error)
                self.unreported.append((weakref.ref(work), op))
            return work
        if not done:
            self.wait(op, timeout)
        return op.outcome()

    def progress(self, through: Operation | None = None) -> None:
        """Advance every operation in flight, in call order; with ``through``, only those up
        to it (a wait needs no later call to move: ``through`` depends on the calls before it
        alone, and the progress thread moves the rest; sweeping all of them on every poll made
        waiting on each of N calls in flight cost N advances: N squared over N waits)."""
        with self.state:
            if not self.inflight:
                return
            for op in self._through(through):
                if op.advance():
                    if op in self.inflight:  # (one that broke the communicator cleared it)
                        self.inflight.remove(op)
                    if op.error is not None:
                        self.failed(op)
                        if op.handle is not None and not (op.waited_by or op.claimed):
                            detached(op.error)
                            self.unreported.append((op.handle, op))

    def _through(self, op: Operation | None) -> list[Operation]:
        """The operations in flight up to ``op`` (all of them: None, or ``op`` not in flight);
        a copy, so that they may leave the list meanwhile. Found near the front when calls are
        waited on in the order they were issued."""
        if op is not None and op in self.inflight:
            return self.inflight[:self.inflight.index(op) + 1]
        return list(self.inflight)

    def wait(self, op: Operation, timeout: float | None) -> None:
        """Drive progress until ``op`` finishes; raise on timeout or a peer's failure."""
        timeout = self.timeout if timeout is None else float(timeout)
        transport = self.transport
        transport.issue_messages()  # (held messages go out before anything waits on them)
        start = time.monotonic()
        deadline = start + timeout
        watched = hang_guard.waiting(self, deadline, timeout, op) if self.guarded else None
        try:
            while not op.finished:
                self.progress(op)
                if op.finished:
                    break
                now = time.monotonic()
                waited = now - start
                if waited > SLOW_WAIT:
                    self._look_around(op)
                    if op.finished:
                        break
                if now >= deadline:
                    self.time_out(op, timeout)
                    break
                transport.idle(waited)
        finally:
            if watched is not None:
                hang_guard.done_waiting(self, watched)
        if op in self.inflight:
            with self.state:
                if op in self.inflight:
                    self.inflight.remove(op)

    def _look_around(self, op: Operation) -> None:
        """A slow wait also hears peers' failure notices and late agreements, and now and
        then asks the ranks it waits for what they do (``check_dispute``)."""
        failure = self.transport.poll_failure()
        if failure is not None:
            self.peer_failed(failure)
            return
        for other in self._through(op):  # (a later call's late agreement: at its own wait)
            if (other.skipped_agreement and not other.finished
                    and self.transport.agreement_waiting(other.seq)):
                self.join_late(other)
        now = time.monotonic()
        if now - self._told > TELL_WAITING and op.seq == self.seq and not op.finished:
            # (only for the latest call: an older one would tell peers this rank is behind)
            self._told = now
            self.transport.publish_activity((op.seq, op.subject, op.phase,
                                             tuple(op.pending_peers())))
        if now - self._asked > DISPUTE_CHECK and not op.finished:
            self._asked = now
            # (the earliest collective still in flight up to ``op``: where ranks differ, that
            # is where they part, and the calls after it, waiting for its verdict or its data,
            # show nothing wrong of their own; a message has no agreement, and its number is
            # the latest collective's, which a peer may have finished long before)
            first = next((o for o in self._through(op) if not o.finished and o.breaking), None)
            if first is not None:
                self.check_dispute(first)
