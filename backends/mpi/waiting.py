"""How a rank waits between polls: yield the core while a wait is young, then sleep.

The engine calls ``idle`` between polls with how long the wait has lasted (its progress
thread with its own age, at least the engine's "slow" mark). A ``sched_yield`` costs a
microsecond or so and lets another rank on the same core run (4 ranks on 2 cores must let
their peers progress); once a wait has lasted 2 ms, sleeping gives the core back entirely. A
yield still counts as running: a rank that yields through a long wait takes its share of a
busy machine's cores from the processes that have work (this package's test suite on 2 cores
took 1,163 s of CPU time yielding until 20 ms, 1,029 s sleeping from 2 ms). Each sleep is at
most a fiftieth of how long the wait has lasted (and at most 1 ms), so it ends at most about
2 % after its message came, plus the kernel's timer slack (about 50 µs).

The only spin is the hot path's own (``hot_path``: 20 µs, then yields until 1 ms, then the
engine's wait). On an oversubscribed node (more ranks than the cores they may run on,
``node_oversubscribed``) a spin only delays the peer that shares this rank's core, the one
whose message the spin waits for: there the transport makes the hot path spin 0 s, so every
wait yields from its first poll, as Open MPI's ``mpi_yield_when_idle`` does on such a node.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from collectives.runtime.progress_thread import SLOW_WAIT

YIELD_SECONDS = SLOW_WAIT  # yield until the wait is this old: the engine's slow mark
SLEEP_SECONDS = 1e-3  # then sleep this long between polls (at most: shorter early on)
SLEEP_SHARE = 1 / 50  # a sleep is at most this share of how long the wait has lasted


def usable_cores() -> set[int]:
    """The cores this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no affinity where the platform has none)
        return set(range(os.cpu_count() or 1))


def cpu_quota() -> float | None:
    """The cores' worth of time this process's control group may use (cgroup v2's
    ``cpu.max``, a container's ``--cpus``), or None where it sets no limit."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def node_oversubscribed(node: Any) -> bool:
    """Whether this rank shares its cores with more ranks than there are cores among them
    (collective over ``node``, an mpi4py communicator of the ranks on this node): the ranks
    whose CPU affinity overlaps this rank's, against the cores they may run on together (at
    most the control group's CPU quota). Ranks bound to a core each are not oversubscribed,
    however few cores each sees; two ranks bound to one core are, whatever the others do."""
    mine = usable_cores()
    sharing = [set(cores) for cores in node.allgather(sorted(mine)) if mine & set(cores)]
    cores = float(len(set().union(*sharing)))
    quota = cpu_quota()
    if quota is not None:
        cores = min(cores, max(1.0, math.ceil(quota)))
    return len(sharing) > cores


def idle(waited: float) -> None:
    """Pause between two polls of a wait that has lasted ``waited`` seconds."""
    if waited < YIELD_SECONDS:
        os.sched_yield()
    else:
        time.sleep(min(SLEEP_SECONDS, waited * SLEEP_SHARE))
