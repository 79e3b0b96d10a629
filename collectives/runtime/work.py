"""The handles users hold for calls in flight: ``Work`` (one call's ``Operation``,
``operation.py``), ``Completed`` (a multi-device call already finished) and ``BatchWork``
(several calls, one result).

``wait()`` drives the communicator's progress until its call has finished (``Engine.wait``:
it spins for a few microseconds, then yields, then sleeps, so a wait never burns a core for
long); ``add_done_callback`` hears of the end on whichever thread finishes the call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..errors import CollectiveError
from .operation import Operation
from .validate import check_function, check_timeout

LAST_LOOK = 1e-9  # the seconds a batch's wait gives each call left once its deadline passed

T = TypeVar("T")
CALLBACKS = logging.getLogger("collectives.calls")


class _CallingBack(threading.local):
    """Per thread: how many done-callbacks it is running (a class default: a thread that
    never ran one reads 0 at once, where a missing attribute's lookup cost 0.4 us a call)."""

    depth = 0


CALLING_BACK = _CallingBack()  # (read by the hot path itself: a call less a call)


def call_back(callback: Callable[[Any], None], handle: Any) -> None:
    """Run a done-callback. One that raises is logged and the rest go on: it runs on whatever
    thread finishes the call (another call's wait, the progress thread, a failure being
    spread to every call in flight), where its error is no one's to raise. A collective it
    calls raises (``in_done_callback``)."""
    CALLING_BACK.depth += 1
    try:
        callback(handle)
    except Exception:  # noqa: BLE001 - logged, as concurrent.futures does
        CALLBACKS.exception("a done-callback of %r raised", handle)
    finally:
        CALLING_BACK.depth -= 1


def callable_callback(callback: Any) -> Any:
    """``callback``, a function of the handle (refused now, not logged when the call ends)."""
    return check_function(callback, "callback", "a function of the handle (called with it "
                          "once the call has finished)")


def in_done_callback() -> bool:
    """Whether this thread is running a done-callback: a collective called there would run
    on whatever thread finished the call (the progress thread, beside the program's own
    calls, paired with its peers' calls in another order: the wrong sums, quietly)."""
    return CALLING_BACK.depth > 0


class Work(Generic[T]):
    """The handle of an asynchronous collective (``async_op=True``); ``Work[T]`` is one whose
    ``wait()`` returns a ``T``.

    As with MPI's non-blocking calls, the input must not change before ``wait()`` returns.
    """

    __slots__ = ("_op", "__weakref__")

    def __init__(self, op: Operation):
        self._op = op

    def wait(self, timeout: float | None = None) -> T:
        """The collective's result, once it has finished.

        Parameters
        ----------
        timeout
            Seconds to wait; None: the call's own ``timeout=`` (or, where it gave none, the
            communicator's).

        Returns
        -------
        T
            The result the blocking call would have returned (None on ranks that get none).

        Raises
        ------
        CollectiveTimeoutError
            The timeout expired; the communicator is broken, as after a blocking call's timeout.
        CollectiveError
            The call failed (the error it failed with).
        """
        timeout = check_timeout(timeout)  # (a bad one raises here, and breaks nothing)
        op = self._op
        op.waited_by = True
        if not op.finished:
            try:
                op.engine.wait(op, op.timeout if timeout is None else timeout)
            finally:
                if not op.finished:  # (an interruption, KeyboardInterrupt, or a fault of the
                    # wait's own: nobody waits for it now. Marked waited, the progress thread
                    # never timed it out, nor, it being the oldest, any later call)
                    op.waited_by = False
        op.engine.reported(op)
        return op.outcome()

    def reported_elsewhere(self) -> None:
        """Its outcome is another wait's to report (a batch's ``wait()``, which raised a
        sibling call's error first): its own failure is not logged as a dropped handle's."""
        self._op.claimed = True

    def add_done_callback(self, callback: Callable[[Work[T]], None]) -> None:
        """Call ``callback(handle)`` once the collective has finished (or failed), on the
        thread that finishes it: the communicator's progress thread, a ``wait()``, or this
        one at once where it has finished already. ``wait()`` in the callback returns at once.

        The callback must be quick and must not call a collective (it may run while the
        communicator drives other calls; one called there raises ``ConcurrentCallError``):
        hand the result on, e.g. to a future. A callback
        that raises is logged (logger ``collectives.calls``) and the others still run, as
        with ``concurrent.futures``.
        """
        callable_callback(callback)
        op = self._op
        with op.engine.state:  # (the progress thread finishes calls under this lock)
            if not op.finished:
                if op.callbacks is None:
                    op.callbacks = []
                op.callbacks.append(lambda: call_back(callback, self))
                return
        call_back(callback, self)

    def is_completed(self) -> bool:
        """Whether it has finished (successfully or not); never waits, never raises."""
        op = self._op
        if not op.finished:
            try:
                op.engine.progress()
            except CollectiveError:
                pass
        return op.finished

    def exception(self) -> BaseException | None:
        """The error it finished with, or None (also while still running)."""
        return self._op.error

    def finished_result(self) -> T:
        """The result of a call that has finished, as a done-callback sees it, without what
        ``wait()`` does besides: the handle still counts as not waited for (until it is, or
        is dropped), and the transport is not told the call ended on this thread (NCCL's
        would order the thread's current stream after it). Raises the call's error, or
        ``RuntimeError`` while it is still running."""
        op = self._op
        if not op.finished:
            raise RuntimeError(f"{op.description} is still running: finished_result() is for "
                               "a call that has finished (a done-callback's); wait() for it")
        return op.outcome()

    @property
    def description(self) -> str:
        """What the call is, e.g. ``all_reduce(float32[1000], op=sum)``."""
        return self._op.description

    def __repr__(self) -> str:
        state = "done" if self._op.finished else "in flight"
        return f"<Work {self._op.description} call {self._op.seq}: {state}>"


class Completed(Work[T]):
    """The handle of a call that finished before returning (a multi-device call on host
    backends, an asynchronous all-reduce its hot path finished at once): a ``Work`` whose
    ``wait()`` returns at once."""

    __slots__ = ("result", "seq", "what")

    def __init__(self, result: T, what: str = "a finished multi-device call",
                 seq: int | None = None):  # (no operation: nothing is in flight)
        self.result, self.what, self.seq = result, what, seq  # (seq: the call's number)

    def wait(self, timeout: float | None = None) -> T:
        """The result, at once (``timeout`` is not needed, but checked as every wait's is)."""
        timeout = check_timeout(timeout)
        return self.result

    def is_completed(self) -> bool:
        return True

    def add_done_callback(self, callback: Callable[[Work[T]], None]) -> None:
        call_back(callable_callback(callback), self)

    def exception(self) -> BaseException | None:
        return None

    def finished_result(self) -> T:
        return self.result

    def reported_elsewhere(self) -> None:
        """Nothing to report: it finished without an error."""

    @property
    def description(self) -> str:
        return self.what

    def __repr__(self) -> str:
        call = f" call {self.seq}" if self.seq is not None else ""
        return f"<Work {self.what}{call}: done>"


class BatchWork(Work[T]):
    """One handle for several calls in flight (a batch's packs): ``wait()`` waits for each, in
    the order they were issued, and assembles the result from theirs with ``finish``."""

    __slots__ = ("_finish", "_handles", "_outcome", "_text")

    def __init__(self, handles: Sequence[Any], finish: Callable[[list], T], description: str):
        self._handles, self._finish, self._text = list(handles), finish, description
        self._outcome: tuple | None = None  # (result,) once assembled

    def wait(self, timeout: float | None = None) -> T:
        """The assembled result, once every call has finished.

        Parameters
        ----------
        timeout
            Seconds to wait for all of them together; None: each call's own timeout.

        Raises
        ------
        CollectiveTimeoutError
            A call did not finish in time; CollectiveError: a call failed (its error).
        """
        timeout = check_timeout(timeout)
        if self._outcome is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            results = []
            try:
                for handle in self._handles:
                    if not hasattr(handle, "wait"):  # (finished when issued)
                        results.append(handle)
                        continue
                    # (past the deadline, a last look: a call finished by now returns)
                    left = None if deadline is None else max(deadline - time.monotonic(),
                                                              LAST_LOOK)
                    results.append(handle.wait(left))
            except Exception:
                # this error is the batch's: the later calls' failures (the same cause, as a
                # rest of the step refused) must not surface again at a later call (an
                # interruption, KeyboardInterrupt, claims none: its calls are still in flight)
                for handle in self._handles:
                    if hasattr(handle, "reported_elsewhere"):
                        handle.reported_elsewhere()
                raise
            self._outcome = (self._finish(results),)
        return self._outcome[0]

    def is_completed(self) -> bool:
        return all(not hasattr(h, "wait") or h.is_completed() for h in self._handles)

    def add_done_callback(self, callback: Callable[[Work[T]], None]) -> None:
        """Call ``callback(handle)`` once every call has finished (see `Work.add_done_callback`)."""
        callable_callback(callback)
        handles = [h for h in self._handles if hasattr(h, "add_done_callback")]
        left = [len(handles)]
        lock = threading.Lock()

        def one_done(_handle: Any) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                call_back(callback, self)

        if not handles:
            call_back(callback, self)
        for handle in handles:
            handle.add_done_callback(one_done)

    def exception(self) -> BaseException | None:
        for handle in self._handles:
            error = handle.exception() if hasattr(handle, "exception") else None
            if error is not None:
                return error
        return None

    @property
    def description(self) -> str:
        return self._text

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "in flight"
        return f"<Work {self._text}: {state}>"
