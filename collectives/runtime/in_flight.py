"""What a communicator has in flight: the limit on handles not yet waited on, and what a rank
that leaves tells its peers (a mixin of ``Engine``, over its ``outstanding``, ``inflight``,
``state`` and ``seq``).

At most ``MAX_IN_FLIGHT`` asynchronous collectives may be issued and not yet waited on (or
dropped): counted in program order, so every rank refuses the same call, before anything is
issued. A rank that leaves with calls in flight tells its peers after which call it left
(``finished_through``): the calls it still had in flight are lost with it.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..errors import CollectiveError
from .work import Operation, Work

MAX_IN_FLIGHT = 1024  # collective handles not waited on (and messages in flight) at once


class InFlight:
    """The engine's accounting of calls in flight (see the module's docstring)."""

    rank: int
    seq: int
    outstanding: int
    inflight: list
    state: Any

    def crowded(self, collective: bool = True, count: int = 1) -> CollectiveError | None:
        """The error refusing ``count`` more asynchronous calls at the limit: ``MAX_IN_FLIGHT``
        collective handles not yet waited on (counted in program order: every rank refuses
        the same call, before anything is issued), or, for a message, operations running."""
        if (self.outstanding if collective else len(self.inflight)) + count <= MAX_IN_FLIGHT:
            return None
        what = "collective handles would be unwaited" if collective else "calls would be in flight"
        return CollectiveError(f"rank {self.rank}: more than {MAX_IN_FLIGHT} {what} on this "
                               "communicator; wait() for some first (this call was not issued)")

    def handed_out(self, op: Operation, work: Work) -> None:
        self.outstanding += 1  # (``work``, op's handle, counts until waited on or dropped)
        op.counted = True
        op.handle = weakref.ref(work, functools.partial(self.settle, op))

    def settle(self, op: Operation, _dropped: Any = None) -> None:
        """``op``'s handle no longer counts (waited on; or dropped: ``_dropped``, its ref)."""
        if op.counted:
            op.counted = False
            self.outstanding -= 1

    def finished_through(self) -> int:
        """The latest call before which every call here has finished: what a rank that leaves
        tells its peers (its calls in flight are lost with it: peers must not wait for them)."""
        with self.state:
            pending = [op.seq for op in self.inflight if op.breaking and not op.finished]
        return min(pending) - 1 if pending else self.seq
