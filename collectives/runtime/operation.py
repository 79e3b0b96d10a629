"""A collective in flight: an ``Operation``, the small state machine behind every call.

An ``Operation`` is a list of *stages* (the argument agreement, then the data movement, each a
resumable ``advance() -> bool``) and a ``finish`` that turns the working buffer into the result.
A blocking call starts one and waits for it; ``async_op=True`` hands back its handle instead
(``work.Work``). Several may be in flight on one communicator: each completes as its data
arrives, whoever drives the progress (a ``wait()``, the next call, or the communicator's
progress thread).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import CollectiveError
from ..timeline import record_calls

PEERS_LOCK_SECONDS = 0.1  # how long pending_peers waits for the progress thread's lock


class Operation:
    """One collective in flight on one communicator."""

    __slots__ = ("breaking", "callbacks", "check", "claimed", "counted", "engine", "error",
                 "finish", "finished", "handle", "result", "timeout", "phase", "seq",
                 "signature", "skipped_agreement", "stage", "stages", "subject", "trace",
                 "waited_by")

    def __init__(self, engine: Any, seq: int, subject: Any, stages: Sequence[Any],
                 finish: Callable[[], Any], *, signature: tuple | None = None, check: int = 0,
                 skipped_agreement: bool = False, breaking: bool = True, phase: Any = True,
                 timeout: float | None = None):
        # ``subject``: what the call is, a Call (described only when an error needs it) or text
        self.engine, self.seq, self.subject = engine, seq, subject
        self.timeout = timeout  # the call's own (None: the communicator's): bounds its wait()
        self.callbacks: list[Callable[[], None]] | None = None  # Work.add_done_callback's
        self.stages, self.stage, self.finish = [s for s in stages if s is not None], 0, finish
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.waited_by = False  # a Work.wait() will report the error; no one else must
        # its outcome is another wait's to report (``Work.reported_elsewhere``): no warning
        # when its handle is dropped, though nobody waits for it (the progress thread still
        # ends it at its deadline)
        self.claimed = False
        self.handle: Any = None  # a weak reference to the Work handle of an asynchronous call
        self.counted = False  # its handle counts among the engine's outstanding ones
        # what the call's late agreement needs, should a peer start one
        self.signature, self.check = signature, check
        self.skipped_agreement = skipped_agreement
        # whether its failure (a timeout, an error) leaves the communicator broken: a
        # collective's does; a point-to-point message's does not (it is withdrawn)
        self.breaking = breaking
        self.phase = phase  # as published to peers when the call was issued
        self.trace: Any = None  # its spans on the timeline, while recording (tracing.issued)

    def advance(self) -> bool:
        """Move on as far as possible without waiting; True once finished (or failed)."""
        if self.finished:
            return True
        engine = self.engine
        engine.advancing = self  # (whose work the transport is given now: ``Engine.advancing``)
        try:
            return self._advance()
        finally:
            engine.advancing = None

    def _advance(self) -> bool:
        if self.trace is not None:
            return record_calls.advance(self)
        try:
            while self.stage < len(self.stages):
                if not self.stages[self.stage].advance():
                    return False
                self.stage += 1
            self.result = self.finish()
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits
            self.fail(exc)
        if not self.finished:
            self.finished = True
            self.ended()
        return True

    def ended(self) -> None:
        """Run the callbacks ``Work.add_done_callback`` registered (once, as it finishes)."""
        callbacks, self.callbacks = self.callbacks, None
        for callback in callbacks or ():
            callback()

    def fail(self, exc: BaseException) -> None:
        if not self.finished:
            self.error = exc
            self.finished = True
            if self.trace is not None:
                record_calls.failed(self, exc)
            for stage in self.stages[self.stage:]:
                abort = getattr(stage, "abort", None)
                if abort is not None:
                    abort()
            self.ended()

    def own_error(self) -> Exception | None:
        """The error this rank's current stage carries of its own: the argument it could not
        start the call with (a refusal's agreement, a bad ``out`` waiting for verdicts), or
        None. Where the call cannot finish, that error is this rank's to raise."""
        stage = self.stages[self.stage] if self.stage < len(self.stages) else None
        error = getattr(stage, "error", None)
        return error if isinstance(error, Exception) else None

    @property
    def description(self) -> str:
        subject = self.subject
        return subject if isinstance(subject, str) else subject.describe()

    def pending_peers(self) -> list[int]:
        """The peers this operation waits for (none known: []). Asked under the lock the
        progress thread advances under (asking tests the stage's requests, and a request two
        threads test at once may be freed by one of them); where that thread holds it for
        long (stuck in MPI with a dead peer), none are known."""
        state = self.engine.state
        if not state.acquire(timeout=PEERS_LOCK_SECONDS):
            return []
        try:
            if self.finished or self.stage >= len(self.stages):
                return []
            pending = getattr(self.stages[self.stage], "pending_peers", None)
            return pending() if pending is not None else []
        finally:
            state.release()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (collectives/)


def detached(exc: BaseException) -> None:
    """Strip ``exc`` of the frames it was raised through, and the errors it chains of theirs,
    for the engine to keep it for a handle that may be dropped. Its frames include the call's
    own, still running as it failed, which then took the call's handle: kept, the error kept
    the handle, and so its inputs, for good (and a dropped handle was never seen as dropped).
    Where it was raised outside the library (a user's ``accumulation_fn``), or is no error the
    library raises on purpose, a note says where."""
    seen = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        trace = error.__traceback__
        if trace is not None:
            frame = traceback.extract_tb(trace)[-1]
            said = isinstance(error, (CollectiveError, TypeError, ValueError))
            if not (said and frame.filename.startswith(_LIBRARY)):  # (the library's own
                # errors say what went wrong; another's, or a fault of the library's, needs where)
                error.add_note(f"(raised in {frame.name}, {frame.filename}:{frame.lineno})")
            error.__traceback__ = None
        error = error.__cause__ or error.__context__
