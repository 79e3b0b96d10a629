"""How failures spread on a communicator: timeouts, peers' notices, late agreements, and the
broken state (a mixin of ``Engine``, over its ``transport``, ``state``, ``inflight``,
``ahead``, ``forgotten`` and ``broken``; ranks that disagree about a call taken as agreed:
``disputes``).

A failure that may have left messages in flight (a timeout, an error after data moved, a
peer's failure) breaks the communicator: every operation in flight fails, the peers are told
(``notify_failure``) unless the failure came from them, and every later call raises
``CommunicatorBrokenError``. A failure every rank raised together in an agreement breaks
nothing, unless its verdict did (a rank had moved the call's data). A peer that disputes a
call this rank took as agreed makes it join that call's agreement late (``LateAgreement``).
A peer that left (kind "exited") breaks the collectives alone while nothing else did:
point-to-point messages go on, and those to or from it end as ``departures`` says.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import (
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    PeerFailedError,
)
from .agreement import AGREED
from .departures import (
    Ledger,
    left,
    lost_message,
    lost_with,
    unmatched_receives,
    waiting_receives,
)
from .disputes import Disputes
from .missing import all_in_call, missing_ranks
from .operation import Operation
from .transport import Failure, Transport, failure_kind

FAILURES = logging.getLogger("collectives.failures")
QUIET = 0.05  # a call this long after the last one first reads the notices sent meanwhile
QUIET_POLLS, EMPTY_POLLS = 1024, 16  # at most so many polls then, ended by so many empty ones
MESSAGES = ("send", "recv")  # the calls (as they enter) a peer's exit alone does not refuse
REFUSALS_KEPT = 64  # peers' refusals remembered (``Engine.refusals``)


FREED = "it was freed"  # why a freed communicator refuses every later call


class Failures(Disputes):
    """The engine's failure handling (see the module's docstring)."""

    rank: int
    size: int
    transport: Transport
    state: Any
    inflight: list[Operation]
    refusals: dict[int, Failure]
    ahead: set[int]
    forgotten: int
    broken: str | None
    only_exits: bool  # every cause of ``broken`` is a peer that left
    exits: list[Failure]  # their notices: which calls each will not join (``lost_with``)
    messages: Ledger
    freed: bool
    last_entered: float  # when this rank's last call began (``back_after_quiet``)
    seq: int

    def back_after_quiet(self, what: str) -> None:
        """A call that comes ``QUIET`` s or more after this rank's last one first reads the
        notices its peers sent meanwhile (no progress thread reads them while nothing is in
        flight). A peer that timed out waiting for this rank, or failed, in the call it now
        makes may have sent that call's data before it gave up (MPI delivers small messages
        before they are received): taken as if nothing had happened, this rank would return
        a result where its peer raised. Raises that call's error (the notice's kind: a
        ``PeerTimeoutError`` after a peer's timeout); the call after it finds the
        communicator broken. (A notice still on its way is not waited for: a peer sends its
        timeout's notice after asking its peers what they do, a fraction of a second.) Any
        notice read here breaks the communicator as the progress thread's reading would: a
        peer that left after finishing this very call makes it raise
        ``CommunicatorBrokenError`` too, though its data came."""
        if what in MESSAGES:  # (messages are not calls: they neither end a quiet spell nor
            return            # are lost with a peer's failed call)
        now = time.monotonic()
        quiet, self.last_entered = now - self.last_entered >= QUIET, now
        if not quiet or self.broken is not None or self.size == 1:
            return
        empty = 0
        for _ in range(QUIET_POLLS):  # (MPICH moves about one message a poll: a peer's
            failure = self.transport.poll_failure()  # questions while it waited come first)
            if failure is None:
                empty += 1
                if empty == EMPTY_POLLS:
                    return
                continue
            empty = 0
            self.peer_failed(failure)
            if failure.kind not in ("rejected", "disputed") and lost_with(failure, self.seq + 1):
                raise failure.error(
                    f"rank {self.rank}: {what} (call {self.seq + 1}) cannot run because rank "
                    f"{failure.rank} {'left after' if failure.kind == 'exited' else 'failed in'}"
                    f" call {failure.seq}: {failure.message}")

    def time_out(self, op: Operation, timeout: float) -> None:
        activity = self.transport.peer_activity(0.5)
        waited = op.pending_peers()
        # (a message waits for its peer alone; ranks behind in the collectives are not its)
        missing = (missing_ranks(op.seq, waited, activity, self.rank, self.size)
                   if op.breaking or not waited else sorted(waited))
        doing = "; ".join(f"rank {r}: {entry[1]}" for r, entry in sorted(activity.items())
                          if r in missing or r in waited)
        arrived = op.breaking and all_in_call(op.seq, missing, activity)
        error = CollectiveTimeoutError(op.description, missing, timeout, self.rank,
                                       detail=doing, call=op.seq if op.breaking else None,
                                       message=not op.breaking, arrived=arrived)
        with self.state:
            if op.finished:  # it finished while the peers were asked: nothing timed out
                return
            op.fail(error)
        if op.breaking:
            self.broken_by(error, op.seq)

    def peer_failed(self, failure: Failure) -> None:
        """A peer failed in call ``failure.seq`` (every later call is lost, and that one too
        unless the peer merely left after finishing it: kind "exited"). Kind "rejected": the
        peer could not start call ``seq`` and runs its agreement; only a rank that skipped that
        agreement (it had agreed the call before) is affected, and its data may have moved."""
        if failure.kind in ("rejected", "disputed"):
            with self.state:  # (notices are read on the progress thread and the caller's)
                if failure.kind == "rejected":
                    self.refusals[failure.seq] = failure
                    while len(self.refusals) > REFUSALS_KEPT:
                        del self.refusals[min(self.refusals)]
                ops = [op for op in self.inflight if op.seq == failure.seq and
                       op.skipped_agreement and not op.finished]
                if not ops and not any(op.seq == failure.seq for op in self.inflight):
                    # not in flight here yet (or run in its agreement): the call, once issued,
                    # agrees (``agreement``) or joins late (``run``); hot paths look again
                    self.ahead.add(failure.seq)
                    self.forgotten += 1
            for op in ops:  # this rank took the call as agreed: it joins the agreement late
                self.join_late(op)
            return  # (a rank in the agreement already hears the verdict there)
        exited = failure.kind == "exited"
        where = "left after call" if exited else "failed in call"
        with self.state:
            kept: list[Any] = []  # the receives from a rank that left that it will match
            if exited:
                left(self.messages, failure, self.rank)
                messages = self._messages_in_flight()
                lost_receives = unmatched_receives(self.messages, failure.rank, messages)
                kept = [m for m in messages if m.receiving and m not in lost_receives]
            for op in list(self.inflight):
                if op.breaking:
                    doomed = lost_with(failure, op.seq)
                elif op.advance():  # a message that got through is not lost
                    doomed = False
                elif exited:  # a message to or from the rank that left, unless it sent it
                    doomed = failure.rank in op.pending_peers() and op.stages[0] not in kept
                else:  # messages stop with the communicator, and those to or from the failed
                    # rank, whatever call they follow
                    doomed = lost_with(failure, op.seq) or failure.rank in op.pending_peers()
                if not doomed:
                    continue
                own = op.own_error()
                if own is not None:  # a rank that could not start the call
                    op.fail(own)  # raises its own error
                elif exited and not op.breaking:
                    message = op.stages[0]
                    op.fail(lost_message(self.messages, self.rank, message.receiving,
                                         failure.rank, message.tag))
                else:
                    op.fail(failure.error(
                        f"rank {self.rank}: {op.description} cannot finish because rank "
                        f"{failure.rank} {where} {failure.seq}: {failure.message}"))
                self.inflight.remove(op)
        self.only_exits = exited and (self.broken is None or self.only_exits)
        if exited:
            self.exits.append(failure)
        self.broken = self.broken or f"rank {failure.rank} {where} {failure.seq} ({failure.message})"

    def _messages_in_flight(self) -> list[Any]:
        """The stages of the point-to-point messages in flight, in the order posted."""
        return [op.stages[0] for op in self.inflight if not op.breaking and not op.finished]

    def exit_loses(self, call: int) -> bool:
        """Whether a peer that left will not join ``call`` (its notice says: ``lost_with``)."""
        return any(lost_with(notice, call) for notice in self.exits)

    def refusal(self, op: Operation) -> BaseException | None:
        """Why a broken communicator refuses ``op`` now (None: it may run): every call, but a
        message while every cause is a peer that left (``message_refusal``)."""
        if not self.only_exits or (op.breaking and self.exit_loses(op.seq)):
            return self.broken_error(op.description)
        if op.breaking:  # a call the peers that left joined before they left
            return None
        message = op.stages[0]
        return self.message_refusal(message.receiving, message.peer, message.tag)

    def message_refusal(self, receiving: bool, peer: int, tag: int) -> BaseException | None:
        """Why a message to or from ``peer`` cannot be posted now, while every cause of
        ``broken`` is a peer that left: to a rank that left, or from one that will send no
        more with this tag (None: it may be posted)."""
        ledger = self.messages
        if not ledger.has_left(peer):
            return None
        if receiving:
            with self.state:  # (a receive in flight may complete meanwhile: counted once)
                before = waiting_receives(self._messages_in_flight(), peer, tag)
                if not ledger.unmatched(peer, tag, before):
                    return None
        return lost_message(ledger, self.rank, receiving, peer, tag)

    def broken_error(self, what: str) -> CommunicatorBrokenError:
        return CommunicatorBrokenError(
            f"rank {self.rank}: {what} cannot run: this communicator is broken since "
            f"{self.broken}; messages of the failed call may still be in flight. Create a "
            "new communicator (or end the job)")

    def broken_by(self, error: BaseException, seq: int, notify: bool | None = None) -> None:
        """A failure that may have left messages in flight: broken here, and peers told
        (``notify`` None: unless the failure came from a peer, who knows already; a peer's
        failure this rank's transport saw is told, since the others may not have seen it)."""
        if not isinstance(error, PeerFailedError):  # (a failure of its own: messages stop too)
            self.only_exits = False
        if self.broken is not None:
            return
        self.broken = f"call {seq} failed ({type(error).__name__}: {error})"
        FAILURES.warning("rank %d: communicator broken: %s", self.rank, self.broken)
        kind = failure_kind(error)
        with self.state:  # every collective in flight here is abandoned, earlier ones too
            # (point-to-point messages carry the call count at their post, not a call's
            # number: they say nothing of which calls are lost)
            first = min([seq] + [o.seq for o in self.inflight if o.breaking and not o.finished])
        if notify or (notify is None and (not isinstance(error, PeerFailedError)
                                          or error.seen_here)):
            # (peers lose every call from the first this rank abandons: one that waits for
            # this rank in an earlier call than the failed one would otherwise wait its
            # whole timeout)
            self.transport.notify_failure(Failure(self.rank, first, kind,
                                                  f"{type(error).__name__}: {error}"))
        with self.state:
            for other in list(self.inflight):
                if not other.finished:
                    other.fail(CommunicatorBrokenError(
                        f"rank {self.rank}: {other.description} was abandoned: {self.broken}"))
            self.inflight.clear()

    def failed(self, op: Operation) -> None:
        """``op`` failed. A failure that may have left messages in flight breaks the
        communicator; an agreed one (every rank raised it together) does not, unless its
        verdict broke it (ranks had moved its data: ``Agreement``): then no call after it can
        finish, and they fail now, after it (so that the first error reported is the cause)."""
        error = op.error
        assert error is not None
        if not op.breaking:  # (a message's failure is its own: it breaks nothing)
            return
        if not getattr(error, AGREED, False):
            self.broken_by(error, op.seq)
            return
        if self.broken is None:
            return
        with self.state:
            for other in list(self.inflight):
                # (messages go on while only departures broke it: ``departures``)
                if other.seq > op.seq and not other.finished and (
                        other.breaking or not self.only_exits):
                    other.fail(CommunicatorBrokenError(
                        f"rank {self.rank}: {other.description} was abandoned: this "
                        f"communicator is broken since {self.broken}"))
                    self.inflight.remove(other)

    def close(self) -> None:  # the communicator was freed: every later call raises at once
        self.freed, self.broken, self.only_exits = True, self.broken or FREED, False

    def broken_by_failure(self) -> bool:
        """Whether a failure broke the communicator (not only its ``free``): messages of the
        failed call may still be in flight."""
        return self.broken is not None and self.broken != FREED

    def break_for(self, reason: str) -> None:  # (no one to tell: every rank breaks alike)
        self.broken, self.only_exits = self.broken or reason, False

    def reject(self, error: BaseException, seq: int) -> None:
        """This rank could not start call ``seq`` and will agree on it; peers that took the
        call as agreed (and skipped the agreement) must hear it."""
        self.transport.notify_failure(Failure(self.rank, seq, "rejected",
                                              f"{type(error).__name__}: {error}"))

    def fail_locally(self, error: BaseException, seq: int) -> None:
        """A rank-local error in a call that skipped the agreement: peers must hear of it (the
        communicator breaks: they would wait for this rank's part). A rank alone only raises:
        nothing was issued, and no peer waits."""
        if self.size > 1:
            self.broken_by(error, seq)
