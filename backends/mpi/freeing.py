"""Whether an MPI transport's ranks free it together, or keep what it holds.

A transport keeps its communicators and windows after a failure (messages of the failed call,
or a notice nobody read, may still arrive, and MPI could deliver them to a new communicator
that reused a freed one's context). Where each rank decides alone, the rest of a free is
local in MPI and any mix of decisions is safe. A shared window's free (``Win_free``) is not:
it waits for every rank, so a rank that frees there while a peer keeps waits forever. There
the ranks agree (``agree_to_free``):

* every rank that frees contributes whether it would keep (a failure it saw or told of, a
  message it withdrew) to a non-blocking all-reduce (MAX) on the notices communicator, and
  all keep where any would: the decision is the same on every rank;
* a rank that left instead (an error took it out of a ``with`` block: ``InFlight.abandon``)
  joins no agreement and said so in its exit notice: its peers, hearing it (or having heard
  it on any thread: ``MPITransport.gone``), keep too;
* a rank that neither frees nor leaves within the communicator's timeout is given up on:
  this rank keeps, warns, and tells its peers that it left, so that one freeing later keeps
  too rather than wait in the window's free for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.runtime.departures import exit_notice

from . import waiting

FREEING = logging.getLogger("collectives.failures")
DEFAULT_TIMEOUT = 300.0  # the wait for peers where no engine says (init's default timeout)


def agree_to_free(transport: Any, would_keep: bool) -> bool:
    """Whether every rank of ``transport`` frees it (the decision is every rank's): False
    where one would keep, left, or did not come within the timeout."""
    engine = transport.engine() if transport.engine is not None else None
    timeout = engine.timeout if engine is not None else DEFAULT_TIMEOUT
    mine = np.array([1 if would_keep else 0], np.int64)
    keeps = np.zeros(1, np.int64)
    request = transport.notices.comm.Iallreduce(mine, keeps, op=MPI.MAX)
    start = time.monotonic()
    while True:
        while transport.poll_failure() is not None:  # (a peer's exit lands in ``gone``)
            pass
        if transport.gone:  # (a rank that left joins no agreement)
            return False
        if request.Test():
            return int(keeps[0]) == 0
        waited = time.monotonic() - start
        if waited > timeout:
            FREEING.warning("rank %d: free() waited %.0f s for peers that neither freed this "
                            "communicator nor left it; its memory is kept", transport.rank,
                            waited)
            transport.notify_failure(exit_notice(transport, transport.native.latest_seq(), (
                f"it stopped waiting, after {waited:.0f} s, for its peers to free the "
                "communicator")))
            return False
        waiting.idle(waited)
