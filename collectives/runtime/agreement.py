"""Agreeing on a call before any data moves: the first time a signature is seen, or on demand.

Ranks that disagree about a call (shape, dtype, op, root, algorithm, ...) or where one rank
could not even validate its arguments must all raise, before any data moves. The agreement
runs over the control channel with the library's own schedules:

1. a digest exchange: an all-reduce (MAX) of ``[failed, check, -check]``; when no rank failed
   and ``max(check) == -max(-check)``, every rank has the same check value: done;
2. otherwise the details: every rank's signature, or its error, all-gathered, so that every
   rank raises the same diagnosis: the failing rank its own error, every other rank a
   ``PeerFailedError`` naming it; or, on disagreement, a
   ``CollectiveMismatchError`` naming the field and every rank's value.

Errors the agreement raises leave the communicator usable: every rank saw the same outcome and
no data moved. (A rank that had already moved data, because it took the call for agreed and
joined the agreement late, reports so, and on an error everyone then marks the communicator
broken; where the ranks agree after all, the call goes on, its moved data its own.)
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

import numpy as np

from .. import algorithms
from ..algorithms.schedule import Collective
from ..errors import CollectiveMismatchError, PeerFailedError
from ..ops import ReduceOp
from .execute.spmd import SpmdRun

AGREED = "__collectives_agreed__"  # set on errors that every rank raised together
PAYLOAD_BYTES = 252  # what a broadcast's root tells every rank (its shape and dtype)
_WORDS = PAYLOAD_BYTES // 7  # packed 7 bytes to an int64, so every word stays non-negative
# A refusing rank's ``issued`` where it cannot know how many calls its peers issue together at
# this point (its bad list has no buckets); its verdict then tells it, set on its error under
# PEERS_ISSUED (``collectives.runtime.refusals``)
ISSUED_UNKNOWN = 0
PEERS_ISSUED = "__collectives_peers_issued__"
# ``BatchTag.issued`` of calls issued together in a number their rank cannot tell when it
# issues the first (a DDP step's buckets: DDP makes them, and rebuilds them after a step)
ISSUED_SEVERAL = -1


def issued_alone(batch: Any) -> int:
    """How many calls a call of ``batch`` (a ``BatchTag``, or None) that fails on this rank
    alone, before it is issued, says it comes with. A DDP step's bucket says several: the
    step goes on to make every bucket's call, each failing alike, so the ranks' counts match
    and the communicator stays usable. Any other says 1: its batch makes no more calls, and
    where its peers issued the rest, the communicator breaks at once, saying so."""
    return ISSUED_SEVERAL if getattr(batch, "issued", 1) == ISSUED_SEVERAL else 1


class Details(NamedTuple):
    """What one rank tells the others once the digests disagree."""

    signature: Any  # the call's signature tuple, or None where this rank could not build it
    error: str | None  # why this rank could not start the call ("Type: message"), or None
    late: bool  # this rank had taken the call as agreed (it may have moved its data)
    check: int  # its check value (0: it could not build the call)
    issued: int  # how many calls it issued together with this one (``calls.calls_issued``)


def agreed(exc: BaseException) -> BaseException:
    """Mark an error as one every rank raised in agreement (it does not break anything)."""
    setattr(exc, AGREED, True)
    return exc


class Agreement:
    """An agreement stage: ``advance()`` until True, raising the agreed error if any."""

    __slots__ = ("comm", "error", "issued", "late", "run", "seq", "signature", "state", "check",
                 "payload", "outcome", "_buf", "_lengths", "_blob", "_width")

    agreeing = True  # a stage in which its call agrees (``disputes``)

    def __init__(self, engine, seq: int, signature: tuple | None, check: int,
                 error: BaseException | None, late: bool = False, *,
                 known: int | None = None, payload: bytes = b"", issued: int = 1):
        """``engine``: the communicator's collectives.runtime.engine.Engine. ``issued``: how
        many calls this rank issues together with this one where it has no signature (a
        refusal of a batch's buckets: ``CallRunner.refuse``); else its signature says.

        Broadcast extras: ``known``, a digest only some ranks have (the shape a non-root
        passed; None: this rank does not know), must agree among the ranks that have it;
        ``payload`` (the root's, at most ``PAYLOAD_BYTES``) reaches every rank in
        ``self.payload``. Every agreement exchanges the same fixed-size digest, so that a
        broadcast and another collective at the same point disagree in words, not in size."""
        self.comm, self.seq, self.signature, self.check = engine, seq, signature, check
        self.error, self.late = error, late
        from .calls import calls_issued

        self.issued = calls_issued(signature) if signature is not None else issued
        failed = 1 if error is not None else 0
        unknown = np.iinfo(np.int64).min
        pair = (known, -known) if known is not None else (unknown, unknown)
        if len(payload) > PAYLOAD_BYTES:
            raise ValueError(f"an agreement carries at most {PAYLOAD_BYTES} bytes")
        raw = np.zeros(_WORDS * 8, np.uint8).reshape(_WORDS, 8)
        raw[:, :7] = np.frombuffer(payload.ljust(_WORDS * 7, b"\0"), np.uint8).reshape(_WORDS, 7)
        extra = raw.reshape(-1).view("<i8").astype(np.int64)
        self._buf = np.concatenate([np.array([failed + (2 if late else 0), check, -check, *pair],
                                             np.int64), extra])
        self.payload = b""
        self.outcome: bool | None = None  # True: agreed; False: refused (or abandoned)
        self.run = self._all_reduce(self._buf, 0)
        self.state = "digest"
        if not late:  # (a late one joins a call issued before: calls since did not wait)
            engine.issued_agreement(self)

    def _all_reduce(self, buf: np.ndarray, part: int) -> SpmdRun:
        comm = self.comm
        plan = algorithms.rank_plan(Collective.ALL_REDUCE, "rechd", comm.size, comm.rank)
        return SpmdRun(plan, buf, ReduceOp.MAX, comm.transport.control,
                       seq=self.seq, check=part)

    def fail_with(self, error: BaseException) -> None:
        """This rank cannot run the call after all (found before anything was posted)."""
        if self.error is None:
            self.error = error
            self._buf[0] += 1

    def advance(self) -> bool:
        """Move on; True once every rank agrees, raising the verdict's error if any (the
        ``outcome`` calls waiting for this verdict read: ``pending_verdict``)."""
        try:
            done = self._advance()
        except BaseException:
            self.outcome = False
            raise
        if done:
            self.outcome = True
        return done

    def _advance(self) -> bool:
        if not self.run.advance():
            return False
        if self.state == "digest":
            status, high, low, known, known_neg = (int(v) for v in self._buf[:5])
            words = self._buf[5:].astype("<i8").view(np.uint8).reshape(_WORDS, 8)
            self.payload = words[:, :7].tobytes()
            unknown = np.iinfo(np.int64).min
            shapes_agree = known == known_neg == unknown or known == -known_neg
            if status == 0 and high == -low == self.check and shapes_agree:
                return True
            # disagreement, or a rank failed: everyone exchanges the details
            self._blob = pickle.dumps(self._details(), protocol=pickle.HIGHEST_PROTOCOL)
            self._lengths = np.array([len(self._blob)], np.int64)
            self.run = self._all_reduce(self._lengths, 1)
            self.state = "lengths"
            return self._advance()
        if self.state == "lengths":
            width = int(self._lengths[0])
            comm = self.comm
            gathered = np.zeros(width * comm.size, np.uint8)
            mine = np.frombuffer(self._blob, np.uint8)
            gathered[comm.rank * width:comm.rank * width + len(mine)] = mine
            plan = algorithms.rank_plan(Collective.ALL_GATHER, "rechd", comm.size, comm.rank)
            self._buf, self._width = gathered, width
            self.run = SpmdRun(plan, gathered, ReduceOp.SUM, comm.transport.control,
                               granule=width, seq=self.seq, check=2)
            self.state = "details"
            return self._advance()
        details = [pickle.loads(self._buf[r * self._width:(r + 1) * self._width].tobytes())
                   for r in range(self.comm.size)]
        verdict = self._verdict(details)
        if verdict is None:  # a late agreement that every rank agrees on: the call goes on
            return True
        raise verdict

    def _details(self) -> Details:
        error = None
        if self.error is not None:
            error = f"{type(self.error).__name__}: {self.error}"
        return Details(self.signature, error, self.late, self.check, self.issued)

    def _verdict(self, details: list[Details]) -> BaseException | None:
        """The error every rank raises (None: none). A refusal makes every rank forget every
        signature agreed before this call (``AgreedSignatures.refused``): a rank that failed
        has no check value, the others' signatures may differ, and what each rank takes as
        agreed must stay alike."""
        late = any(d.late for d in details)
        verdict = self._diagnosis(details, late)
        if verdict is None:
            return None
        self.comm.refused(self.seq)
        issued = self._issued(details)
        if late:  # (every later call says why it cannot run)
            self.comm.break_for(f"ranks disagreed about call {self.seq} after some had already "
                                f"moved its data ({type(verdict).__name__}: {verdict})")
        elif len(set(issued.values())) > 1 or (
                ISSUED_SEVERAL in issued.values() and len(issued) < len(details)):
            # (one rank's batch issued more buckets than a peer's calls, or may have: a DDP
            # step's, beside a plain call or a refusing rank's: their later calls cannot pair)
            counts = ", ".join(f"rank {r}: {'several' if n == ISSUED_SEVERAL else n}"
                               for r, n in issued.items())
            self.comm.break_for(f"ranks disagreed about call {self.seq}, which they issued with "
                                f"different numbers of calls ({counts}: a batch's buckets or a "
                                f"DDP step's, issued before any is waited on), so no later call "
                                f"pairs ({type(verdict).__name__}: {verdict})")
        elif self.issued == ISSUED_UNKNOWN and verdict is self.error:
            # (this rank refuses as many calls as its peers issued here: ``refusals``)
            setattr(verdict, PEERS_ISSUED, max(issued.values(), default=1))  # (none SEVERAL)
        return verdict

    @staticmethod
    def _issued(details: list[Details]) -> dict[int, int]:
        """How many calls each rank issued together with this one, where it knows
        (``ISSUED_UNKNOWN``: a refusing rank without its peers' buckets)."""
        return {rank: d.issued for rank, d in enumerate(details) if d.issued != ISSUED_UNKNOWN}

    def _diagnosis(self, details: list[Details], late: bool) -> BaseException | None:
        """``late``: a rank had taken the call as agreed and a peer disputed it. Where every
        rank's signature is the same after all (their memories of agreed signatures differed
        for a moment: a failed agreement's forgetting reaches ranks at different points), the
        call is right on every rank, and its data, moved or not, is the call's: None."""
        comm = self.comm
        failed = [(r, d.error) for r, d in enumerate(details) if d.error is not None]
        if failed:
            if self.error is not None:
                return agreed(self.error)
            who, what = failed[0]
            others = f" (and rank(s) {', '.join(str(r) for r, _ in failed[1:])})" if len(
                failed) > 1 else ""
            return agreed(PeerFailedError(
                f"rank {comm.rank}: call {self.seq} cannot run because rank {who}{others} "
                f"failed to start it: {what}"))
        from .calls import differences

        signatures = [d.signature for d in details]
        if any(s is None for s in signatures):  # a rank failed after the digest: say who
            silent = [r for r, s in enumerate(signatures) if s is None]
            return agreed(PeerFailedError(f"rank {comm.rank}: call {self.seq}: rank(s) {silent} "
                                          "could not describe their call"))
        name = next((s[0] for s in signatures if s is not None), "a collective")
        kinds = {s[0] for s in signatures if s is not None}
        if len(kinds) > 1:  # (with what each call is part of: a hook's bucket, a split's sizes)
            from .calls import FIELDS

            part = FIELDS.index("batch")
            by_rank = ", ".join(f"rank {r}: {s[0]}" + (f" ({s[part]})" if len(s) > part and s[part]
                                                       else "") for r, s in enumerate(signatures))
            text = (f"ranks called different collectives at the same point ({by_rank}); every "
                    "rank must call the same collectives in the same order")
        else:
            found = differences(signatures, name)
            if found is None and late:
                return None
            text = found or "ranks called collectives with different arguments"
        return agreed(CollectiveMismatchError(f"rank {comm.rank}: {text}"))

    def pending_peers(self) -> list[int]:
        return self.run.pending_peers()

    def abort(self) -> None:
        if self.outcome is None:
            self.outcome = False
        self.run.abort()


class LateAgreement:
    """The agreement of a call this rank took as agreed and a peer disputes, run as the call's
    next stage (the data stage it interrupts resumes after it). An error verdict fails the
    call and breaks the communicator: this rank may have moved the call's data already. Where
    every rank's signature is the same after all, the call goes on."""

    __slots__ = ("agreement", "engine", "op")

    agreeing = True

    def __init__(self, engine, op) -> None:
        self.engine, self.op = engine, op
        self.agreement = Agreement(engine, op.seq, op.signature, op.check, None, late=True)

    def advance(self) -> bool:
        try:
            return self.agreement.advance()
        except BaseException as exc:
            self.op.fail(exc)  # (the verdict is this call's error)
            self.engine.broken_by(exc, self.op.seq)  # (where the verdict did not break it)
            raise

    def pending_peers(self) -> list[int]:
        return self.agreement.pending_peers()
