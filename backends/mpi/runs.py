"""A native collective in flight: its check, its MPI requests in order, then its finish.

A run issues its collectives through the lane (call order, on every rank), tests the check
first (a mismatch raises at once, without waiting for data that may never come), then the
data requests in the order they were issued, repairs NaN where the check says some rank had
one, and finishes (copies results out of the transport's buffers). A run whose check rides
in its data (``rider.py``) verifies once the data has landed instead.

A run that waits long asks its peers which calls they are running (``stall``): ranks that
called different collectives may never complete their MPI calls at all (MPI pairs them by
order and kind), and this turns such a hang into a ``CollectiveMismatchError``.

MPI cannot cancel a collective: a run that fails leaves its requests to MPI and its buffers
to the transport's keeping (MPI may still write into them); the engine marks the
communicator broken.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.errors import CollectiveMismatchError, PeerFailedError
from collectives.runtime.calls import Call

from . import tuning
from .checks import Repair, verify

# Polls between two looks at the clock while a run waits. Few: a wait older than 2 ms sleeps
# up to 1 ms between polls, so at 64 a stalled call was told to its peers after about 0.1 s
# (and seconds on a loaded machine) rather than after STALL_SECONDS.
STALL_POLLS = 4


def mpi_error(rank: int, seq: int, call: Call, exc: Any) -> Exception:
    """The library's error for an MPI error in a native collective."""
    if exc.Get_error_class() == MPI.ERR_TRUNCATE:
        return CollectiveMismatchError(
            f"rank {rank}: call {seq}: {call.describe()}: a peer sent more data than this rank "
            "expects: ranks passed different shapes or dtypes, or called different collectives")
    return PeerFailedError(f"rank {rank}: call {seq}: {call.describe()}: MPI failed: "
                           f"{exc.Get_error_string()}", seen_here=True)


class NativeRun:
    """Base of the two kinds of runs: what each data step issues is the subclass's business.

    Steps are ``(kind, issue)``: kind "check" (the check all-reduce; it waits for its slot),
    "piece" (a piece of a large payload; one at a time), "entry" (a persistent request; it
    waits until an earlier call has finished with it) or "call" (anything else); ``issue()``
    returns the data request it issued, or None.
    """

    __slots__ = ("call", "check_out", "check_req", "finished", "keep", "mine", "natives",
                 "polls", "repair", "requests", "seq", "since", "slot", "steps", "verified")
    holds_turn = False  # one collective per run: the next native may start once it is issued

    def __init__(self, natives: Any, call: Call, seq: int, mine: np.ndarray | None, *,
                 slot: bool = True):
        self.natives, self.call, self.seq, self.mine = natives, call, seq, mine
        self.steps: deque = deque([("check", self._check)] if slot else ())
        self.requests: deque = deque()  # (request, is a piece), in issue order
        self.slot: Any = None
        self.check_req: Any = None
        self.check_out: np.ndarray | None = None
        self.verified = not slot
        self.finished = False
        self.repair: Repair | None = None
        self.keep: list = []  # buffers MPI reads or writes until the requests complete
        self.polls = 0
        self.since = 0.0
        natives.inflight[seq] = call

    # --- the lane's side ----------------------------------------------------------------

    def issue(self) -> bool:
        """Issue the steps that may go now; True once every step is issued."""
        steps = self.steps
        while steps:
            kind, fn = steps[0]
            if kind == "check":
                if self.natives.checks.free_slot() is None:
                    return False
            elif kind == "piece":
                if sum(p for _, p in self.requests) >= tuning.PIECES_IN_FLIGHT:
                    return False
            elif kind == "entry" and not self.ready():
                return False
            steps.popleft()
            request = fn()
            if request is not None:
                self.requests.append((request, kind == "piece"))
        return True

    def ready(self) -> bool:
        """Whether an "entry" step may go."""
        return True

    def _check(self) -> None:
        self.slot = self.natives.checks.start(self, self.call.check, self.mine is not None)
        self.check_req, self.check_out = self.slot.request, self.slot.out

    # --- progress -----------------------------------------------------------------------

    def advance(self) -> bool:
        if self.finished:
            return True
        try:
            if self._advance():
                self.natives.inflight.pop(self.seq, None)
                return True
        except BaseException:
            self.abandon()
            raise
        self.polls += 1
        if self.polls % STALL_POLLS == 0:
            self._stalled()
        return False

    def _advance(self) -> bool:
        natives = self.natives
        lane = natives.lane
        if lane.runs:
            lane.pump()
        if not self.verified:
            if self.check_req is None or not self._test(self.check_req):
                return False
            self.verified = True
            assert self.check_out is not None  # set with check_req, which has completed
            try:
                nan = verify(self.check_out, self.call, natives.rank, self.seq)
            finally:  # the check completed: the slot is free for the next call, whatever it says
                self.slot.owner = self.slot = None
            if nan:
                self._repair()
        requests = self.requests
        freed = False
        while requests:
            request, piece = requests[0]
            if not self._test(request):
                break
            requests.popleft()
            freed = freed or piece
        if freed and lane.runs:
            lane.pump()
        if requests or self.steps:
            return False
        if self.repair is None and self.landed():
            self._repair()
        if self.repair is not None and not self.repair.advance():
            return False
        self.finish()
        self.finished = True
        self.keep = []
        return True

    def _repair(self) -> None:
        natives = self.natives
        self.repair = Repair(natives.control, natives.size, natives.rank, self.call.count,
                             self.mine, self.seq)

    def _test(self, request: Any) -> bool:
        try:
            return request.Test()
        except MPI.Exception as exc:
            raise mpi_error(self.natives.rank, self.seq, self.call, exc) from exc

    def _stalled(self) -> None:
        note_stall(self)

    def abandon(self) -> None:
        """The run failed (raising here, or from outside: its call's timeout, a peer's
        failure, ``NativeStage.abort``): nothing more is issued; what MPI still holds stays
        alive (a late peer's data would land in a buffer handed out again)."""
        if self.finished:
            return
        self.finished = True
        self.natives.inflight.pop(self.seq, None)
        self.natives.lane.leave(self)
        if self.requests or self.slot is not None:
            self.natives.abandoned.append(self)
        if self.repair is not None:
            self.repair.abort()

    def landed(self) -> bool:
        """The data has arrived: verify what rode with it (raise on a mismatch); return
        whether NaN needs repairing. Runs checked by a slot have nothing to do here."""
        return False

    def finish(self) -> None:
        """Results into place (and NaN repaired): the subclass's business."""

    def pending_peers(self) -> list[int]:
        """MPI does not say which peers a collective waits for: every other rank."""
        return [r for r in range(self.natives.size) if r != self.natives.rank]


def note_stall(run: Any) -> None:
    """A native run found still going: the first time, note when; past ``STALL_SECONDS``,
    tell the natives (they ask the peers which calls they run)."""
    now = time.perf_counter()
    if not run.since:
        run.since = now
    elif now - run.since > tuning.STALL_SECONDS:
        run.natives.stalled(run.seq, run.call)
