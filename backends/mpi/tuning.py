"""What this transport runs and when: names, crossovers, piece sizes and the cost model.

Every number here was measured on the 2-vCPU development machine with MPICH 5.0.2
(``benchmarks/mpi_compare.py``; ``docs/mpi.md`` has the tables). Change them on another
machine; every rank must hold the same values, since they decide what runs.
"""

from __future__ import annotations

from functools import lru_cache

from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.algorithms.select import CostModel

NATIVE_NAMES = ("native", "mpi")  # MPI's own collectives
# what ``auto`` runs where input and result lie in shared arrays (Communicator.shared_empty):
# the shared-memory all-reduce, under a name of its own so that a rank whose arrays are not
# shared is told the ranks disagree
SHARED_AUTO = "auto (shared arrays)"
SHM_NAMES = ("shm", "shared_memory", SHARED_AUTO)  # the one-pass all-reduce through a shared window
NAMES = NATIVE_NAMES + SHM_NAMES

# MPI counts are C ints before MPI-4; every MPI call of this transport moves at most this many
# elements (bytes for point-to-point and broadcasts). Tests lower it to run the split paths.
MAX_COUNT = 2**31 - 1

# All-reduces from this many bytes up run a schedule under "auto" (the ring's reused buffers
# beat MPICH's per-call scratch); keyed by rank count, the last entry serving larger counts.
# MPICH's non-blocking Iallreduce (what a native call above PERSISTENT_BYTES runs) took, against
# the best schedule (benchmarks/mpi_compare.py): two ranks 1.2-2.4x at 256 KiB, 1.5-1.6x
# rechd's time at 1 MiB; three ranks 1.0-1.2x at 256 KiB, 1.4-1.8x at 1 MiB, 1.5x at 4 MiB
# (three runs); four ranks 1.06x at 256 KiB, 1.27x at 1 MiB, 1.2x at 4 MiB (one run).
RING_FROM_BYTES: dict[int, int] = {2: 256 << 10, 3: 256 << 10, 4: 1 << 20}

# All-reduces from this many bytes up run through shared memory under "auto" when every rank
# shares one node and the communicator's constants never timed it (a calibrated job prices it
# from its own times); keyed by rank count, the last entry serving larger counts; None: only
# on request (algorithm="shm"). Measured with benchmarks/mpi_compare.py on the 2-vCPU machine
# (docs/performance.md): three and four ranks ran it faster than every other method from
# 256 KiB to 16 MiB (0.6-0.8x the best schedule's time at 1 to 16 MiB, three ranks); two ranks
# ran the schedules as fast or faster (ring and rechd 0.7-0.9x its time from 4 MiB up).
SHM_FROM_BYTES: dict[int, int | None] = {2: None, 3: 256 << 10}

# All-reduces whose input and result lie in shared arrays run through them under "auto" from
# this many bytes up, at any rank count on one node: at two ranks 190 against MPI's 190 and the
# schedules' 258 µs at 256 KiB, 243 against 528 µs at 1 MiB; at three 585 against 618 µs and
# 708 against 1325 µs (benchmarks/mpi_compare.py, docs/performance.md).
SHM_SHARED_FROM_BYTES = 256 << 10

# The shared-memory all-reduce moves its payload in rounds of at most this many bytes: its
# window (two round buffers per rank) then stays in the last-level cache.
SHM_ROUND_BYTES = 16 << 20

# From this many bytes up the shared-memory all-reduce reads peers' inputs and results where
# they lie (``process_vm_readv``, where the kernel allows it): no copy through the window.
SHM_DIRECT_BYTES: int | None = 16 << 20

# A wait between two rounds of the shared-memory all-reduce spins this long before it lets the
# transport's waiting policy yield the core (never on an oversubscribed node).
SHM_SPIN_SECONDS = 5e-3

# The shared-memory all-reduce reduces its slice this many bytes at a time, so that what it
# publishes for the other ranks is copied out of the cache.
SHM_BLOCK_BYTES = 256 << 10

# Native reductions of large payloads run in pieces of this many bytes, one piece in flight:
# MPICH mallocs a scratch buffer of half the message per call, and from 16 MiB up glibc serves
# it by mmap and page-faults it in every time; pieces stay on the heap and are reused.
NATIVE_PIECE_BYTES = 8 << 20
PIECES_IN_FLIGHT = 1

# Natives up to this many bytes run as MPI-4 persistent collectives over buffers of the
# transport's own (copied in and out): a persistent start skips MPICH's per-call schedule
# building, the bulk of a small collective's cost. The first PERSISTENT_CALLS distinct small
# calls (in call order, the same on every rank) get one; later ones run non-blocking.
PERSISTENT_BYTES = 64 << 10
PERSISTENT_CALLS = 64

# Native calls in flight at once (each holds one of this many check all-reduces); a further
# call waits for the oldest.
CHECKS_IN_FLIGHT = 16

# A native call still waiting after this many seconds asks its peers which calls they run:
# ranks that called different collectives may otherwise wait for each other until timeout.
STALL_SECONDS = 0.02

# Point-to-point schedules cost about this much per round here (Python + MPICH shared memory).
COST_MODEL = CostModel(latency=15e-6, seconds_per_byte=1 / 4e9, reduce_seconds_per_byte=1 / 8e9,
                       message_overhead=5e-6)


def canonical(algorithm: str) -> str:
    """``"native"`` (MPI's own), ``"shm"`` (shared memory) or the core's canonical name."""
    if isinstance(algorithm, str):
        text = algorithm.strip().lower()
        if text in NATIVE_NAMES:
            return "native"
        if text in SHM_NAMES:
            return "shm"
    return algorithms.canonical(algorithm)


def ring_from(size: int) -> int:
    return RING_FROM_BYTES.get(size, RING_FROM_BYTES[max(RING_FROM_BYTES)])


def prefer_native(collective: Collective, size: int, nbytes: int, single_node: bool = True) -> bool:
    """What ``auto`` runs natively: on one node, MPI's all-reduce below the ring's crossover,
    and every other collective (MPI's own beat the schedules at every size measured); across
    hosts, everything: MPI's all-reduce, in pieces, sent the minimum over each host's link
    and beat every flat and two-level schedule at 1, 16 and 64 MiB (docs/multi-host.md)."""
    if collective is Collective.ALL_REDUCE and single_node:
        return nbytes < ring_from(size)
    return True


def shm_from(size: int) -> int | None:
    """Where ``auto`` starts running the shared-memory all-reduce at ``size`` ranks (None:
    never)."""
    return SHM_FROM_BYTES.get(size, SHM_FROM_BYTES[max(SHM_FROM_BYTES)])


def use_shm(algorithm: str, collective: Collective, nbytes: int, single_node: bool,
            size: int | None = None) -> bool:
    """Whether a native all-reduce goes through the shared window rather than MPI: on
    request, or under ``auto`` where ``shm_from(size)`` says (``size``: the rank count; None
    runs it on request only)."""
    if collective is not Collective.ALL_REDUCE or not single_node:
        return False
    if algorithm in SHM_NAMES:
        return True
    least = shm_from(size) if size is not None and size > 1 else None
    return algorithm == "auto" and least is not None and nbytes >= least


def persistent(collective: Collective, nbytes: int) -> bool:
    """Whether a native call belongs to the persistent class (a function of the call alone,
    so that every rank runs it the same way: MPICH matches persistent collectives only with
    persistent ones, request by request)."""
    return nbytes <= PERSISTENT_BYTES


@lru_cache(maxsize=64)
def chunks(count: int, limit: int) -> tuple[tuple[int, int], ...]:
    """``[0, count)`` as consecutive ``(lo, hi)`` pieces of at most ``limit`` items (one empty
    piece for ``count == 0``: the call still runs, so every rank issues the same calls)."""
    if limit < 1:
        raise ValueError(f"limit={limit} must be at least 1")
    if count < 0:
        raise ValueError(f"count={count} must be non-negative")
    if count <= limit:
        return ((0, count),)
    return tuple((lo, min(lo + limit, count)) for lo in range(0, count, limit))
