"""Handles of the NCCL transport's asynchronous calls (``GpuWork``, ``Issued``) and the host
wait behind ``wait(timeout=...)`` and ``synchronize()``: the semantics are the communicator's
(``communicator``'s docstring).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from collectives.errors import CollectiveTimeoutError
from collectives.runtime.validate import check_timeout
from collectives.runtime.work import Work

if TYPE_CHECKING:
    from .communicator import NcclCommunicator

SPIN_SECONDS = 100e-6  # a wait queries the event this long before it sleeps
POLL_SECONDS = 20e-6  # its first nap; each next one doubles, up to MAX_NAP
MAX_NAP = 1e-3


def host_wait(transport: Any, event: Any, limit: float, description: str) -> None:
    """Until ``event`` is done: spinning briefly, then napping, up to ``limit`` seconds; past
    it the watchdog fails the transport with ``CollectiveTimeoutError``, which this raises."""
    t = transport
    start = time.monotonic()
    deadline, nap = start + limit, 0.0
    while not event.done:
        if t.failed is not None:
            raise t.failed
        now = time.monotonic()
        if now >= deadline:
            error = CollectiveTimeoutError(description, [], limit, t.rank,
                                           detail="its work on the GPU did not finish")
            t.watchdog.fail(error, None)
            raise error
        if now - start > SPIN_SECONDS:  # long: check the watchdog's findings, and nap
            t.watchdog.check()
            nap = min(max(nap * 2, POLL_SECONDS), MAX_NAP)
            time.sleep(nap)
    if t.failed is not None:
        raise t.failed


class GpuWork:
    """The handle of an asynchronous call on the NCCL transport (see the module's docstring).

    ``work``: the core's handle (or a finished one, for a hot call); ``done``: the event after
    the call's work on the transport's stream, where it was recorded at issue (else it is
    recorded as ``work`` finishes, having enqueued everything: its done-callback, for one
    call's handle; a batch's at ``wait()``); ``keep``:
    the call's arrays, held until that event is done."""

    __slots__ = ("_comm", "_done", "_keep", "_work")

    def __init__(self, comm: NcclCommunicator, work: Any, done: Any = None,
                 keep: list | None = None):
        self._comm, self._work, self._done = comm, work, done
        self._keep = keep if keep is not None else []
        if done is None and type(work) is Work:  # (recorded at wait(), the event would
            work.add_done_callback(self._enqueued)  # follow every call enqueued since. One
            # call's handle only: a batch's assembles its result at wait(), on the caller's
            # thread (its packs' buckets are unpacked there, beside the caller's next batch);
            # another library's handle over this transport's own, ``HandedBack``, waits on
            # that one)

    def _enqueued(self, work: Any) -> None:
        """The core's handle has finished: the call's work is enqueued, and nothing after it
        yet (calls enqueue in order), so the event after it is recorded now, and the result
        kept until it is done. Not through ``work.wait()``, which reports the call waited
        for: at issue, that made the issuing stream wait for the call (no overlap); nor by
        keeping ``work``, which kept a dropped handle counted until the GPU had finished."""
        if work.exception() is None:
            self._ended(work.finished_result())

    def wait(self, timeout: float | None = None) -> Any:
        """The result, ordered before later work on the current stream of its library (in
        the calling thread, on the communicator's GPU), without waiting on the host; with a
        ``timeout``, once the GPU has finished the call (or its error)."""
        timeout = check_timeout(timeout)  # (first, as every wait's: a finished call's too)
        t = self._comm.transport
        result = self._work.wait(timeout)
        if t.failed is not None:
            raise t.failed
        done = self._ended(result)
        if timeout is None:
            t.lead_library(done, result)
        elif not done.done:
            host_wait(t, done, float(timeout), self.description)
        return result

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait on the host until the GPU has finished the call (``timeout``: seconds, None:
        the communicator's)."""
        self.wait(self._comm.timeout if timeout is None else timeout)

    def _ended(self, result: Any = None) -> Any:
        """The event after the call's work, recorded now where it was not yet (the core's
        handle has enqueued everything once it has finished); ``result`` is kept until
        then."""
        if self._done is None:
            t = self._comm.transport
            self._keep.append(result)
            self._done = t.record()
            t.keep_until_done(self.description, self._done, self._keep)
        return self._done

    def is_completed(self) -> bool:
        """Whether the GPU has finished the call; never waits."""
        if not self._work.is_completed():
            return False
        if self._done is None:
            return self._comm.transport.record().done  # (everything so far, this call's too)
        return bool(self._done.done)

    def exception(self) -> BaseException | None:
        return self._work.exception() or self._comm.transport.failed

    def reported_elsewhere(self) -> None:
        """Its outcome is a batch's ``wait()`` to report (``Work.reported_elsewhere``): a
        failure it comes to later, of the cause that batch raised, does not surface again at
        the next call (it did, where the refusal of a list's last buckets came after the
        batch's wait had raised the first's)."""
        reported = getattr(self._work, "reported_elsewhere", None)
        if reported is not None:  # (a hot call's finished handle has none)
            reported()

    @property
    def description(self) -> str:
        return self._work.description

    def __repr__(self) -> str:
        return f"<GpuWork {self._work.description}>"


class Issued:
    """The core's side of an asynchronous all-reduce the hot path ran: enqueued at issue.
    Its description is made only when asked for (an error, a repr): formatting a dtype costs
    several µs, a large part of an issue's cost."""

    __slots__ = ("op", "result", "x")

    def __init__(self, result: Any, x: Any, op: Any):
        self.result, self.x, self.op = result, x, op

    @property
    def description(self) -> str:
        return f"all_reduce({getattr(self.x, 'dtype', '?')}{tuple(self.x.shape)}, op={self.op})"

    def wait(self, timeout: float | None = None) -> Any:
        timeout = check_timeout(timeout)
        return self.result

    def is_completed(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None
