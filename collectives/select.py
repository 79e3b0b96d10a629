"""``algorithm="auto"``: pick the schedule with the lowest estimated time.

Every candidate schedule is costed by the alpha-beta-gamma model of ``Schedule.cost``
(per round a latency, per byte received a transfer time, per byte reduced a compute time)
with the transport's own constants, so the choice follows from the schedules themselves.
A transport may also offer a native collective (MPI, NCCL) with its own estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from . import algorithms
from .schedule import Collective

CANDIDATES = ("tree", "rechd", "ring", "shuffle", "one_device")


@dataclass(frozen=True)
class CostModel:
    """Seconds per round, per byte moved, per byte reduced, per message. ``shared_memory``
    backends run every schedule tile by tile at the same memory traffic, so there the cost is
    the per-step and per-message bookkeeping: fewer steps and messages win."""

    latency: float = 5e-6
    seconds_per_byte: float = 1 / 5e9
    reduce_seconds_per_byte: float = 1 / 10e9
    message_overhead: float = 10e-6
    shared_memory: bool = False


def _bucket(nbytes: int) -> int:
    return max(nbytes, 1).bit_length()  # one decision per power of two


@lru_cache(maxsize=4096)
def _choose(collective: Collective, size: int, bucket: int, model: CostModel) -> str:
    if size == 1:
        return "one_device"
    nbytes = 1 << (bucket - 1)
    best, best_cost = None, float("inf")
    for name in CANDIDATES:
        if not algorithms.supports(collective, name):
            continue
        schedule = algorithms.build(collective, name, size)
        if model.shared_memory:
            cost = sum(1 + len(s.srcs) for s in schedule.steps) * model.latency
        else:
            cost = schedule.cost(nbytes, model.latency, model.seconds_per_byte,
                                 model.reduce_seconds_per_byte, model.message_overhead)
        if cost < best_cost:
            best, best_cost = name, cost
    return best


def choose(collective: Collective, size: int, nbytes: int, model: CostModel) -> str:
    """The canonical name of the cheapest algorithm for this call."""
    return _choose(collective, size, _bucket(nbytes), model)
