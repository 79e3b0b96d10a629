"""How a rank waits: spin first, then yield the core, then sleep.

A wait that ends within microseconds (a peer slightly late, a small message in flight) is
fastest spinning on ``Test``; a ``sched_yield`` costs a few microseconds but lets another
rank on the same core run (4 ranks on 2 cores must let their peers progress); once a wait is
clearly long (a late peer, not a transfer), sleeping gives the core back entirely.

The engine calls :meth:`Idler.idle` between polls, with 0 for "not slow yet": the idler then
times the wait itself, taking a pause of more than ``GAP`` since the last call as the start
of a new wait. Each thread that waits (a blocking call, the engine's progress thread) has
its own timing: one thread's long wait says nothing about another's.
"""

from __future__ import annotations

import os
import threading
import time

SPIN_SECONDS = 50e-6  # spin this long on a fresh wait
YIELD_SECONDS = 5e-3  # then yield until the wait is this old
SLEEP_SECONDS = 1e-3  # then sleep this long between polls (at most: shorter early on)
GAP = 200e-6  # a pause this long between idle calls ends one wait and starts another


class Idler(threading.local):
    """The waiting policy of one transport: when this thread's current wait began."""

    def __init__(self) -> None:
        self.first = self.last = 0.0

    def waited(self, waited: float) -> float:
        """How long the current wait has lasted, by the engine's count or the idler's."""
        now = time.perf_counter()
        if now - self.last > GAP:
            self.first = now
        self.last = now
        return max(waited, now - self.first)

    def idle(self, waited: float) -> float:
        """Pause according to how long the wait has lasted; return that."""
        waited = self.waited(waited)
        if waited < SPIN_SECONDS:
            return waited
        if waited < YIELD_SECONDS:
            os.sched_yield()
        else:
            time.sleep(min(SLEEP_SECONDS, waited / 50))
        self.last = time.perf_counter()
        return waited
