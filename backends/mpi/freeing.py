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
* nothing is given up on a timeout: a rank that neither frees nor leaves is waited for (as
  ``Win_free`` waits), until it frees too, or leaves, or its program ends (its exit notice).
  A rank that gave up and kept while a slower peer's vote completed the agreement would
  leave that peer in ``Win_free`` for good: the one way the ranks could split. So ranks that
  free two such communicators in different orders wait for each other for good (each in the
  other's vote): the one wait of the library without a deadline, said by a warning.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.runtime.transport import engine_of

from . import leftovers, waiting

FREEING = logging.getLogger("collectives.failures")
DEFAULT_TIMEOUT = 300.0  # when a free's wait for its peers is worth a warning (init's default)
_POSTED: list = leftovers.keep([])  # agreements given up on: MPI may still write their buffers


def agree_to_free(transport: Any, would_keep: bool) -> bool:
    """Whether every rank of ``transport`` frees it (the decision is every rank's): False
    where one would keep, or one left."""
    _hear(transport)
    if transport.gone:  # (a rank that left joins no agreement: nothing to post)
        return False
    mine = np.array([1 if would_keep else 0], np.int64)
    keeps = np.zeros(1, np.int64)
    request = transport.notices.comm.Iallreduce(mine, keeps, op=MPI.MAX)
    start = time.monotonic()
    warned = False
    while not request.Test():
        _hear(transport)
        if transport.gone:  # (MPI may still write ``keeps``: it stays referenced, kept)
            _POSTED.append((request, mine, keeps))
            return False
        waited = time.monotonic() - start
        if not warned and waited > _timeout(transport):
            warned = True
            FREEING.warning("rank %d: free() has waited %.0f s for peers that neither free this "
                            "communicator nor leave it (freeing is collective: every rank must "
                            "free its communicators in the same order; a peer that frees another "
                            "one first waits there for this rank, and neither free ends)",
                            transport.rank, waited)
        waiting.idle(waited)
    return int(keeps[0]) == 0


def _hear(transport: Any) -> None:
    """Read every notice that came (a peer's exit lands in ``transport.gone``)."""
    while transport.poll_failure() is not None:
        pass


def _timeout(transport: Any) -> float:
    engine = engine_of(transport)
    return engine.timeout if engine is not None else DEFAULT_TIMEOUT
