"""The correctness matrix (``body.py``) over real MPI ranks, natives and shared memory
included; then split paths (counts beyond one MPI call, large payloads in pieces) with the
limits lowered, and the scratch arena's reuse.

Run by ``tests/test_mpi.py`` on 1 to 4 ranks and on 2 simulated nodes of 2
(``COLLECTIVES_RANKS_PER_NODE=2``).
"""

from __future__ import annotations

import numpy as np
from _common import WORLD, Report
from body import FIVE, Matrix, identical
from collectives.backends import mpi
from collectives.backends.mpi import tuning

from collectives.algorithms.schedule import Collective
from collectives.ops import BFLOAT16, ReduceOp

comm = mpi.init(timeout=60)
report = Report("matrix")
layout = comm.transport.layout
groups = layout.groups if layout is not None else None


def split_paths(matrix: Matrix) -> None:
    """Every MPI call moves at most MAX_COUNT items and large reductions go in pieces: lowered
    here so that small arrays take the paths of arrays beyond 2**31 elements."""
    saved = tuning.MAX_COUNT, tuning.NATIVE_PIECE_BYTES, tuning.PERSISTENT_BYTES
    tuning.MAX_COUNT, tuning.NATIVE_PIECE_BYTES, tuning.PERSISTENT_BYTES = 300, 1024, 0
    try:
        for collective in FIVE:
            op = ReduceOp.SUM
            for algorithm in ("native", "ring", "auto"):
                for count in (1000, 4099):
                    matrix.case(collective, algorithm, np.float32, op, count, root=comm.size - 1)
            if BFLOAT16 is not None and collective is not Collective.BROADCAST:
                matrix.case(collective, "native", BFLOAT16, op, 1000)
            matrix.case(collective, "native", np.float64, ReduceOp.MAX, 1000)
    finally:
        tuning.MAX_COUNT, tuning.NATIVE_PIECE_BYTES, tuning.PERSISTENT_BYTES = saved


def arena_is_reused() -> None:
    """Receive buffers come from one arena that stops growing once it fits the largest call."""
    if comm.size == 1:
        return
    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x, algorithm="ring")
    size = len(comm.transport.data.arena.buf)
    for _ in range(3):
        comm.all_reduce(x, algorithm="ring")
    grown = len(comm.transport.data.arena.buf)
    report.check(size > 0 and grown == size, f"arena grew from {size} to {grown} bytes")


def sub_communicators_keep_the_nodes() -> None:
    """A split's node groups are its parent's nodes among its ranks, simulated ones too
    (``COLLECTIVES_RANKS_PER_NODE`` counted the new communicator's own ranks: world ranks
    of two simulated nodes shared one)."""
    node_of = {r: i for i, group in enumerate(comm.transport.nodes) for r in group}
    everyone = list(range(comm.size))
    mine = [r for r in everyone if r % 2 == comm.rank % 2]
    for sub, world in ((comm.split(comm.rank % 2), mine),  # (each new rank's world rank,
                       (comm.split(0, key=-comm.rank), everyone[::-1]),  # as MPI orders
                       (comm.dup(), everyone)):  # them: by key, then by old rank)
        got = [[world[r] for r in group] for group in sub.transport.nodes]
        report.check(all(len({node_of[w] for w in g}) == 1 for g in got)
                     and len({node_of[g[0]] for g in got}) == len(got),
                     f"sub-communicator nodes {got} (world nodes {comm.transport.nodes})")
        sub.free()


def main() -> None:
    sub_communicators_keep_the_nodes()
    matrix = Matrix(comm, groups).run()
    split_paths(matrix)
    arena_is_reused()
    for failure in matrix.failures:
        report.check(False, failure)
    report.cases += matrix.cases
    everyone = WORLD.gather(matrix.digests, root=0)
    if WORLD.rank == 0:
        for problem in identical(everyone):
            report.check(False, problem)
    comm.free()
    report.finish(f"groups={groups}")


if __name__ == "__main__":
    main()
