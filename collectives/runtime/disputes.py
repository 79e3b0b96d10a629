"""Ranks that disagree about a call each took as agreed (a mixin of ``Engine``).

Once a signature is agreed, a call of it moves its data at once, with its check value riding
along. Where no data meets to carry it (asynchronous calls issued together; paths that never
exchange a message, as a shared window beside messages; a native collective beside a
schedule), a slow wait asks the peers it waits for what they do (``check_dispute``), and a
peer that agrees on the call, or moves it under another check, disputes it: this rank joins
the call's agreement late (``join_late``, a ``LateAgreement`` stage), and so do the others,
to learn how they differ.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import CollectiveMismatchError, PeerFailedError
from .agreement import LateAgreement
from .departures import Ledger
from .operation import Operation
from .pending_verdict import PendingVerdict
from .transport import Failure, Transport

DISPUTE_ANSWER = 0.05  # how long a slow wait waits for its peers' answers (``check_dispute``)
# how long after a rank left an agreement still waits for its part before it counts as never
# coming (the part it posted before it left, if it ran this agreement, is here well before)
LEFT_GRACE = 1.0


class Disputes:
    """The engine's disputes (see the module's docstring)."""

    rank: int
    transport: Transport
    state: Any
    messages: Ledger
    suspect: tuple[int, int] | None  # (call, peer): seen finished while this rank waits for it
    refusals: dict[int, Failure]  # peers' refusals heard, by call

    def broken_by(self, error: BaseException, seq: int, notify: bool | None = None) -> None: ...

    def check_dispute(self, op: Operation) -> None:
        """A waited peer agreeing on a call this rank took as agreed, or moving the data of
        one it agrees on, or of a later call while this one's agreement waits for it, or
        moving it under another check value, disputes it."""
        if not op.pending_peers():
            return
        if self._agreed_by_none_that_left(op):
            return
        mine = "moving" if op.skipped_agreement else "agreeing"
        answers = self.transport.peer_activity(DISPUTE_ANSWER)
        waited = set(op.pending_peers())  # (after the answers: the wait may have moved on)
        agreeing = _agreeing(op)
        for rank, entry in answers.items():
            if rank not in waited:
                continue
            phase = entry[2] if len(entry) > 2 else None
            disputed = entry[0] == op.seq and phase in ("agreeing", "moving") and phase != mine
            # A peer that this call's agreement still waits for, moving the data of a later
            # call (it shows only its latest), most likely took this one as agreed too:
            # asynchronous calls issued together hide the dispute from the check above. (A
            # peer agreeing on its later calls is only late with its part of this one, in a
            # healthy stream of new signatures: not told. One whose part is late while a
            # later call moves is told needlessly: the notice changes nothing there.)
            passed = (agreeing and isinstance(entry[0], int) and entry[0] > op.seq
                      and phase == "moving")
            # Both took the call as agreed, each a signature of its own (agreed in earlier
            # calls), and no data carries a check between them (a shared window's path beside
            # messages): their checks tell.
            check = entry[4] if len(entry) > 4 else None
            unlike = (entry[0] == op.seq and phase == "moving" == mine and bool(op.check)
                      and isinstance(check, int) and check != op.check)
            # A peer past this call, with this call still in flight under another check (it
            # took another signature agreed before, and their data never meets): the same.
            theirs = entry[5].get(op.seq) if len(entry) > 5 and entry[0] != op.seq else None
            unlike = unlike or (mine == "moving" and bool(op.check) and isinstance(theirs, int)
                                and theirs != op.check)
            # A peer that finished this call (idle since, or its calls in flight without it)
            # while this rank still agrees on it, or moves it and waits for the peer's part,
            # took it as agreed with another signature (an agreement finishes on no rank
            # before every part is in; a finished rank has posted every part of its plan):
            # a mismatch, and what this rank waits for will not come.
            # (idle says only that its latest call ended: an earlier asynchronous one may be
            # in flight still, which its calls in flight show)
            in_flight = entry[5] if len(entry) > 5 else {}
            finished = isinstance(entry[0], int) and op.seq not in in_flight and (
                entry[0] >= op.seq and phase is False
                or entry[0] > op.seq and bool(in_flight))
            if finished and (agreeing or op.skipped_agreement and _knows_peers(op)):
                # (seen twice, DISPUTE_CHECK apart: a verdict or a part may be on its way)
                if self.suspect == (op.seq, rank):
                    how = f"rank {rank} finished it without " + (
                        "agreeing on it" if agreeing else "sending this rank its part")
                    # (a late agreement's rank took the call as agreed too, maybe the same:
                    # the peer that disputed it differs; what every rank runs tells)
                    if entry[0] != op.seq:  # (its latest call is a later one)
                        how += ", taking it as agreed"
                    elif check == op.check:
                        how += ", taking it as agreed with this rank's signature"
                    else:
                        how += ", so with a signature agreed before, not this rank's"
                    self._fail_unagreed(op, how + _calls(op, self.rank, answers),
                                        agreeing=agreeing)
                else:
                    self.suspect = (op.seq, rank)
                return
            if disputed or passed or unlike:
                if op.skipped_agreement:
                    self.join_late(op)
                else:  # tell the ranks that skipped it: they join this agreement
                    self.transport.notify_failure(Failure(self.rank, op.seq, "disputed", ""))
                return

    def join_late(self, op: Operation) -> None:
        """A peer runs the agreement of a call this rank took as agreed: they disagree. Tell
        every rank (those that also took it as agreed join too), then run it as the call's
        next stage, to learn how. A stage, not a wait here: the calls after it (their late
        agreements too) keep moving, so that ranks joining several late agreements in other
        orders never wait on each other; the call's wait bounds it."""
        op.skipped_agreement = False
        self.transport.notify_failure(Failure(self.rank, op.seq, "disputed", ""))
        with self.state:
            if op.finished:
                return
            stage = op.stages[op.stage] if op.stage < len(op.stages) else None
            if isinstance(stage, PendingVerdict) and stage.agree_now():
                return  # (still before its verdict: nothing moved, it agrees as a first call)
            op.stages.insert(op.stage, LateAgreement(self, op))

    def _agreed_by_none_that_left(self, op: Operation) -> bool:
        """Whether ``op``'s agreement waits for a rank that left a while ago: it left after
        this call (else the call was refused), so it made it without this agreement (a
        signature agreed before: another than this rank's), and its part never comes. The
        call fails then, a mismatch, instead of waiting out its timeout."""
        if not _agreeing(op):
            return False
        ledger, now = self.messages, time.monotonic()
        gone = [p for p in op.pending_peers()
                if ledger.has_left(p) and now - ledger.left_at[p] > LEFT_GRACE]
        if not gone:
            return False
        self._fail_unagreed(op, f"rank {gone[0]} left ({ledger.why[gone[0]]}) having made it "
                                "without agreeing on it, so with a signature agreed before, "
                                "not this rank's")
        return True

    def _fail_unagreed(self, op: Operation, how: str, agreeing: bool = True) -> None:
        """Fail ``op``, whose agreement (``agreeing``; else data) a peer will never send
        (``how``: what that peer did instead, and with which signature where it said).
        Where a rank refused the call (this rank's own error, or a peer's refusal heard), the
        peer finished it before the refusal came (a reduce's or gather's leaf returns once
        its data is out): the refusal is the cause, and the error says so."""
        own = op.own_error()
        refusal = self.refusals.get(op.seq)
        error: BaseException
        if own is not None:
            error = own
        elif refusal is not None:
            error = PeerFailedError(
                f"rank {self.rank}: {op.description} (call {op.seq}) cannot finish because "
                f"rank {refusal.rank} failed to start it: {refusal.message} ({how}, before "
                "the refusal came)")
        else:
            error = CollectiveMismatchError(
                f"rank {self.rank}: {op.description} (call {op.seq}) cannot "
                f"{'be agreed' if agreeing else 'finish'}: {how}: the ranks disagree about "
                f"call {op.seq}; every rank must make the same calls in the same order")
        with self.state:
            if op.advance() or (agreeing and not _agreeing(op)):
                return  # (its part came after all)
            op.fail(error)
        self.broken_by(error, op.seq, notify=True)  # (a refusal's rank waits for this one)


def _calls(op: Operation, rank: int, answers: dict) -> str:
    """What each rank that answered runs as call ``op.seq``, as they said (`` (rank 0:
    gather(float32[4], root=0), ...)``), or nothing where no peer said."""
    said = {r: entry[6] for r, entry in answers.items()
            if len(entry) > 6 and entry[0] == op.seq and entry[6]}
    if not said:
        return ""
    said[rank] = op.description
    return f" ({', '.join(f'rank {r}: {said[r]}' for r in sorted(said))})"


def _agreeing(op: Operation) -> bool:
    """Whether ``op`` is in its agreement (its own, or a late one a dispute made it join)."""
    return op.stage < len(op.stages) and getattr(op.stages[op.stage], "agreeing", False)


def _knows_peers(op: Operation) -> bool:
    """Whether ``op``'s stage names the very peers it waits for: a plan's run does (its
    round's messages); a native collective does not (MPI completes a collective on each rank
    by itself: a peer may be through while this rank still receives from a third)."""
    return op.stage < len(op.stages) and getattr(op.stages[op.stage], "knows_peers", False)
