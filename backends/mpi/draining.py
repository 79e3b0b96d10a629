"""Freeing a transport's communicators once no message sent on them can still arrive.

MPI frees a communicator's context at once, and MPICH hands it to the next communicator made
over those ranks. A message sent on the old one and never received then arrives on the new
one, where a receive of the same tag takes it: a status question a peer never served (it
finished its call without waiting), an answer that came after its asker stopped waiting, a
failure notice a peer never polled for. In a new transport's agreement it read as a call's
digest of the wrong size ("rank 0 sent 17 bytes where 168 were expected"); among its notices
it would read as another communicator's answers.

So the communicators that carry such messages (the notices', and the users' point-to-point
one: a message a user sent and no receive took) are drained before a free: each rank counts
the messages it sent each peer there and those it received; at ``free`` it posts its counts
in a non-blocking all-to-all, and once its peers' counts have come it receives (and drops)
what it has not received of theirs. Only then are the transport's communicators
freed. Nothing waits: a free that cannot finish yet (a peer not freeing yet, a message still
on its way) stays pending, and moves on at the next free or new transport; until it finishes,
its communicators are not freed, so no new one can take their context. A peer that never
frees (its program ends without it), or that keeps its transport after a failure it saw (it
posts no counts: it may not reach every peer), leaves the free pending for good: the
communicators are kept, as after a failure.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import leftovers

# (held past the interpreter's teardown: MPI_Finalize may still write their counts' buffers)
_PENDING: list[Drain] = leftovers.keep([])  # frees waiting for their peers' counts or messages
_GIVEN_UP: list[Drain] = leftovers.keep([])  # frees MPI failed: kept (MPI may still write)
_LOCK = threading.Lock()


Counted = tuple[Any, Sequence[int], Sequence[int]]  # (communicator, sent to, received from)


class Drain:
    """One transport's free: its peers' counts, what is left to receive, then ``Free``."""

    def __init__(self, counted: Sequence[Counted], comms: Sequence[Any],
                 sends: Sequence[tuple[Any, Any]]):
        self.counted = [comm for comm, _, _ in counted]
        self.received = [list(received) for _, _, received in counted]
        self.comms = list(comms)
        self.sends = list(sends)  # (request, buffer): this rank's sends, held until complete
        # row p: what this rank sent peer p on each counted communicator (one all-to-all)
        self.mine = np.ascontiguousarray(np.array([sent for _, sent, _ in counted], np.int64).T)
        self.theirs = np.zeros_like(self.mine)
        self.request = self.counted[0].Ialltoall(self.mine, self.theirs)
        self.waits_for = "its peers' counts"  # what it waited for when last moved on

    def finished(self) -> bool:
        """Whether every message sent to this rank has come, and the communicators are freed."""
        if not self.request.Test():
            return False
        status = MPI.Status()
        for c, (comm, received) in enumerate(zip(self.counted, self.received)):
            for peer, expected in enumerate(self.theirs[:, c].tolist()):
                while received[peer] < expected:
                    message = comm.Improbe(peer, MPI.ANY_TAG, status)
                    if message is None:  # (on its way)
                        self.waits_for = (f"{expected - received[peer]} message(s) of rank "
                                          f"{peer} on counted communicator {c}")
                        return False
                    message.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE])
                    received[peer] += 1
        self.sends = [(r, b) for r, b in self.sends if not r.Test()]
        if self.sends:
            self.waits_for = f"{len(self.sends)} send(s) of its own"
            return False
        for comm in self.comms:
            comm.Free()
        return True


def free_when_drained(counted: Sequence[Counted], comms: Sequence[Any],
                      sends: Sequence[tuple[Any, Any]] = ()) -> None:
    """Free ``comms`` once every message sent on the ``counted`` ones has been received: each
    ``(comm, sent, received)``, where ``sent[p]`` and ``received[p]`` count this rank's
    messages to and from rank ``p`` there; ``sends`` are this rank's sends still in flight.
    Collective: every rank frees."""
    with _LOCK:
        _PENDING.append(Drain(counted, comms, sends))
    progress()


def progress() -> None:
    """Move every pending free on: those whose messages have all come are freed."""
    with _LOCK:
        still = []
        for drain in _PENDING:
            try:
                if not drain.finished():
                    still.append(drain)
            except MPI.Exception:  # (a peer MPI lost: what it holds is kept)
                _GIVEN_UP.append(drain)
        _PENDING[:] = still


def pending() -> list[str]:
    """What each free still pending waits for (a test's question)."""
    with _LOCK:
        return [drain.waits_for for drain in _PENDING]
