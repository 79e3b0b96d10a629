"""The watchdog: stream-ordered calls that never finish, fail, or disagree become errors.

NCCL calls return as soon as they are enqueued, so the core's waiting loop never sees a
stuck one. Each call instead leaves an event on the transport's stream, and a background
thread (alive only while calls are outstanding) checks, every few milliseconds:

* NCCL's ``check_async_error()`` on every communicator: a failed peer or network turns into
  ``PeerFailedError``;
* the call digests (every call's check value, all-reduced MAX over MPI without waiting, as
  ``[check, -check, -agreeing]``): ranks that called different collectives turn
  into ``CollectiveMismatchError``, unless every rank agrees on the call (its agreement judges
  it then: a call refused there moved no data, and breaks nothing);
* the oldest event's deadline (the communicator's timeout): a call still unfinished then
  turns into ``CollectiveTimeoutError`` naming the ranks that do not say
  they are in it.

On any of them the NCCL communicators are aborted (their kernels exit, so nothing stays
stuck on the GPU), peers are told, and the transport is marked failed: the next call raises
``CommunicatorBrokenError`` with the cause, and so does ``Work.wait()``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from collectives.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
)
from collectives.runtime.transport import Failure, failure_kind

PERIOD = 2e-3  # seconds between checks while calls are outstanding
# the thread stays this long after the last outstanding call (starting one costs a call
# tens of microseconds: a loop of calls a few milliseconds apart keeps one thread)
LINGER = 1.0


def late_ranks(activity: dict, seq: int) -> tuple[list[int], str]:
    """From peers' answers (``describe_activity``'s ``(seq, text, phase, waiting_for, check)``, or
    ``(seq, text, SILENT)`` for a peer that did not answer): the ranks to blame for call
    ``seq`` not finishing (those not in it yet, else every peer), and what they say."""
    absent = [r for r, (s, *_) in sorted(activity.items()) if s is None or s < seq]
    missing = absent or sorted(activity)
    doing = "; ".join(f"rank {r}: {text}" for r, (_, text, *_) in sorted(activity.items())
                      if r in missing)
    return missing, doing


class Watchdog:
    def __init__(self, transport: Any):
        self.t = transport
        self.lock = threading.Lock()
        # (seq, description, event, deadline, keep): ``keep`` None for an event of the
        # transport's own (recycled once done), else a handle's event and the arrays of its
        # call, held until the event is done
        self.events: deque = deque()
        self.digests: deque = deque()  # (seq, buffer, request)
        # digests not yet out: the first waits for its call's verdicts (``held``); the calls
        # after it wait behind it, so that every rank all-reduces them in one order
        self.held: deque = deque()  # [seq, check, comm, agreeing or None]
        self._thread: threading.Thread | None = None

    def watch(self, description: str, seq: int, event: Any, timeout: float,
              keep: Any = None) -> None:
        """Watch call ``seq``'s ``event`` until it is done, for ``timeout`` seconds; ``keep``
        (a handle's event: not recycled) stays referenced until then."""
        with self.lock:
            self.events.append((seq, description, event, time.monotonic() + timeout, keep))
            self._start()

    def digest(self, seq: int, check: int, comm: Any, agreeing: bool | None = False) -> None:
        """Call ``seq``'s digest over ``comm``; ``agreeing`` None: held until ``decided``
        says whether the call agrees (it waits for verdicts: ``Transport.verdict_pending``)."""
        with self.lock:
            self.held.append([seq, check, comm, agreeing])
            self._issue_held()

    def decided(self, seq: int, agreeing: bool) -> None:
        """Held call ``seq`` agrees on its own (True) or moves its data (False): its digest,
        and those held behind it, go out. (Always after its ``digest``: the call's stages
        advance only once it is issued, its digest published; one told first would hold
        every later digest for good.)"""
        with self.lock:
            for entry in self.held:
                if entry[0] == seq:
                    entry[3] = agreeing
            self._issue_held()

    def _issue_held(self) -> None:
        """(Holding the lock.) The held digests up to the first still undecided go out."""
        from mpi4py import MPI

        while self.held and self.held[0][3] is not None:
            seq, check, comm, agreeing = self.held.popleft()
            # (MAX of -agreeing: -1 only where every rank agrees on the call)
            buf = np.array([check, -check, -1 if agreeing else 0], np.int64)
            self.digests.append((seq, buf, comm.Iallreduce(MPI.IN_PLACE, buf, MPI.MAX)))
            self._start()

    def _start(self) -> None:
        """(Holding the lock.) A thread, unless one runs: it decides to end under the lock
        too, so work added as it ends always has a thread to check it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"collectives-nccl-watchdog-{self.t.rank}")
            self._thread.start()

    def _run(self) -> None:
        idle_since = None
        try:
            while self.t.failed is None:
                with self.lock:
                    if self.events or self.digests:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > LINGER:
                        self._thread = None
                        return
                if idle_since is None:  # (idle, it only waits: notices are the engine's)
                    self.check()
                time.sleep(PERIOD)
        except Exception as exc:  # noqa: BLE001 - a failure of the checks is a failure
            self.fail(PeerFailedError(f"rank {self.t.rank}: the watchdog failed: "
                                      f"{type(exc).__name__}: {exc}"), None)
        with self.lock:
            self._thread = None

    def check(self) -> None:
        """One round of checks (also called by waits on the calling thread)."""
        t = self.t
        if t.failed is not None:
            return
        for comm in t.comms.all():
            try:
                comm.check_async_error()
            except Exception as exc:  # noqa: BLE001 - NCCL's error, by name, is the cause
                self.fail(PeerFailedError(
                    f"rank {t.rank}: NCCL reported {type(exc).__name__}: {exc} (a peer failed "
                    "or the network broke); run with NCCL_DEBUG=INFO for details"), None)
                return
        failure = t.notices_poll()
        if failure is not None and not self._fatal(failure):
            t.defer_notice(failure)  # the engine's to handle (its late agreement)
            failure = None
        if failure is not None:
            self.fail(failure.error(f"rank {t.rank}: rank {failure.rank} failed in call "
                                    f"{failure.seq}: {failure.message}"), failure.seq, tell=False)
            return
        with self.lock:
            while self.digests and self.digests[0][2].Test():
                seq, buf, _ = self.digests.popleft()
                # (where every rank agrees on the call, the agreement judges it: a call it
                # refuses moved no data on any rank, and leaves the communicator usable; where
                # one rank took it as agreed, that rank has enqueued NCCL work no peer will
                # match: a mismatch, as ever)
                if int(buf[0]) != -int(buf[1]) and int(buf[2]) != -1:
                    error = CollectiveMismatchError(
                        f"rank {t.rank}: call {seq}: ranks called different collectives, or the "
                        "same one with different arguments (their check values differ); every "
                        "rank must make the same calls in the same order")
                    break
            else:
                error = None
            while self.events and self.events[0][2].done:
                _, _, event, _, keep = self.events.popleft()
                if keep is None:  # (a handle's event stays the handle's)
                    t.spare.append(event)  # (recorded again by a later call)
            late = self.events[0] if self.events and time.monotonic() > self.events[0][3] \
                else None
        if error is not None:
            self.fail(error, None)
        elif late is not None:
            seq, description = late[:2]
            missing, doing = late_ranks(t.notices_ask(0.5), seq)
            self.fail(CollectiveTimeoutError(description, missing, t.timeout, t.rank,
                                             detail=doing, call=seq), seq)

    def _fatal(self, failure: Failure) -> bool:
        """Whether a peer's notice breaks this transport. "rejected" (the peer could not start
        call ``seq``: an argument error every rank sees in the agreement) and "disputed" (a
        peer agrees late on a call) are the engine's: they break nothing, unless this rank
        already enqueued NCCL work for the rejected call, which the peer will never match."""
        if failure.kind == "disputed":
            return False
        if failure.kind == "rejected":
            with self.lock:
                return any(seq == failure.seq for seq, *_ in self.events)
        return True

    def fail(self, error: BaseException, seq: int | None, tell: bool = True) -> None:
        """Abort NCCL, mark the transport failed with ``error``, and tell the peers."""
        t = self.t
        if t.failed is not None:
            return
        t.failed = error
        for comm in t.comms.all():
            try:
                comm.abort()
            except Exception:  # noqa: BLE001 - already aborted or destroyed
                pass
        with self.lock:
            self.events.clear()
            self.digests.clear()
            self.held.clear()
        if tell:
            t.notify_failure(Failure(t.rank, seq if seq is not None else -1, failure_kind(error),
                                     f"{type(error).__name__}: {error}"))

    def outstanding(self) -> bool:
        with self.lock:
            return bool(self.events)
