"""Timing one call: warm up, adapt the iteration count, take the median of repeats.

Under SPMD every rank must time the same number of calls, and a repeat lasts as long as its
slowest rank: ``measure`` takes a barrier (``sync``) and a maximum over ranks (``agree``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

TARGET_SECONDS = 0.02  # each timed repeat lasts at least this long when iters adapt
MAX_ITERS = 1000


@dataclass
class Measurement:
    seconds: float  # median over repeats of seconds per call
    iters: int
    repeats: list[float]


def same(values: list[float]) -> list[float]:
    """The ranks' agreement where there is one rank: its own values."""
    return values


def measure(call: Callable[[], object], *, warmup: int = 2, iters: int | None = None,
            repeats: int = 5, sync: Callable[[], None] | None = None,
            agree: Callable[[list[float]], list[float]] = same,
            target: float = TARGET_SECONDS,
            fence: Callable[[], None] | None = None) -> Measurement:
    """Median over ``repeats`` of the time per call of ``iters`` back-to-back calls.

    ``iters=None`` adapts: enough calls that a repeat lasts ``target`` seconds, at most
    MAX_ITERS. Under SPMD, ``sync`` is a barrier and ``agree`` takes the maximum over ranks,
    so every rank uses the same iteration count and a repeat lasts as long as its slowest rank.
    ``fence`` runs before the clock stops (a GPU backend waits for its devices there: its
    calls return once enqueued).
    """
    sync = sync or (lambda: None)
    fence = fence or (lambda: None)
    for _ in range(warmup):
        call()
    if iters is None:
        probe = 1
        for _ in range(2):
            sync()
            start = time.perf_counter()
            for _ in range(probe):
                call()
            fence()
            per_call = agree([(time.perf_counter() - start) / probe])[0]
            if per_call * probe >= target / 4 or probe >= MAX_ITERS:
                break
            probe = min(MAX_ITERS, math.ceil(target / 4 / max(per_call, 1e-9)))
        iters = max(1, min(MAX_ITERS, math.ceil(target / max(per_call, 1e-9))))
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        fence()
        times.append((time.perf_counter() - start) / iters)
    times = agree(times)
    return Measurement(statistics.median(times), iters, list(times))
