"""The exceptions users of the library catch."""

from __future__ import annotations

import re
from collections.abc import Iterable


class CollectiveError(RuntimeError):
    """Base class of every error a collective raises after its arguments were accepted."""


class CollectiveMismatchError(CollectiveError, ValueError):
    """Participants called the same collective with arguments that disagree.

    Raised on every participant, before any data moves, with the disagreeing values by rank.
    """


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """Peers did not arrive at a collective within the timeout.

    ``missing`` lists the ranks that never arrived (or, where ``arrived``, the ranks it still
    waited for that said they were in the call too: it ran longer than its timeout);
    ``collective`` names the call they were expected in (``message``: a point-to-point
    message, which waits for its peer alone).
    """

    def __init__(self, collective: str, missing: Iterable[int], timeout: float, rank: int | None,
                 detail: str = "", call: int | None = None, message: bool = False,
                 arrived: bool = False):
        self.collective = collective
        self.missing = sorted(set(missing))
        self.arrived = arrived
        self.timeout: float | None = timeout  # None: a peer's, unknown (PeerTimeoutError)
        self.rank = rank
        self.call = call
        who = f"rank {rank}: " if rank is not None else ""
        number = f" (call {call})" if call is not None else ""
        doing = f". What they are doing: {detail}" if detail else ""
        # (three digits, whole seconds from 100 on: a wait given what was left of a deadline
        # waited 0.299999 s, and 1800 s is no 1.8e+03)
        seconds = f"{timeout:.3g}" if timeout < 100 else f"{timeout:.0f}"
        # (``arrived``: every rank named said it was in the call too, still running it)
        why = ("which never matched this message" if message else
               "which were in this collective too: it was still running (it needs more than "
               "its timeout)" if arrived else "which never arrived in this collective")
        super().__init__(
            f"{who}{collective}{number} timed out after {seconds} s waiting for rank(s) "
            f"{', '.join(map(str, self.missing))}, {why}{doing}"
        )


class PeerFailedError(CollectiveError):
    """Another participant failed (raised, died or left) while this one waited for it.

    ``seen_here`` is True where this rank's own transport saw the failure (MPI failed a
    transfer with the peer): the other ranks may not know yet, so the communicator tells
    them, as it does of its own errors. False where a peer's notice brought it.
    """

    seen_here: bool = False

    def __init__(self, message: str, *, seen_here: bool = False):
        super().__init__(message)
        self.seen_here = seen_here


class PeerTimeoutError(PeerFailedError, CollectiveTimeoutError):
    """A peer timed out in a call this rank is in, and told this rank before its own deadline
    came: the call cannot finish here either.

    Both a ``PeerFailedError`` and a ``CollectiveTimeoutError``, so ``except
    CollectiveTimeoutError`` catches a timeout whichever rank noticed it first; ``missing``
    and ``timeout`` are the peer's (the ranks it waited for, and its deadline).
    """

    def __init__(self, message: str, told: str = ""):
        CollectiveError.__init__(self, message)
        waited = re.search(r"waiting for rank\(s\) (\d+(?:, \d+)*)", told)
        after = re.search(r"timed out after (\S+) s", told)
        self.missing = [int(r) for r in waited.group(1).split(", ")] if waited else []
        self.timeout = float(after.group(1)) if after else None
        self.collective, self.rank, self.call = "", None, None


class CommunicatorBrokenError(CollectiveError):
    """The communicator cannot be used any more: an earlier collective timed out or failed,
    and its messages may still be in flight. Create a new communicator (or end the job)."""


class ConcurrentCallError(CollectiveError):
    """A collective was called on a communicator while another thread was inside a call on it.

    Calls on one communicator must be issued from one thread at a time, in the same order on
    every rank; give each thread its own communicator with ``comm.dup()``.
    """
