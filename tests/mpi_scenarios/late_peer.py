"""A peer that stops in the middle of MPI's own all-reduce (3 ranks): the memory MPI may still
write is never handed out again.

Rank 1 stops itself (SIGSTOP, as a descheduled or swapped-out process would be) once its
2 MiB ``Iallreduce`` is in flight, after the call's check went through. Ranks 0 and 2 time
out, then run 30 all-reduces on a communicator of their own, each result checked as it
returns and all of them again at the end, after rank 0 has let rank 1 go on (SIGCONT) and
rank 1's data has landed where the failed call was writing. A failed call gave its pooled
result buffer back (``NativeStage.abort`` dropped the run, and MPI's requests with it): the
next result of that size was handed out in it, and a healthy call's result, right when it
returned, later held rank 1's sums.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
from _common import WORLD, Report
from collectives.backends import mpi
from mpi4py import MPI

from collectives.errors import CollectiveError

report = Report("late_peer")
rank, n = WORLD.rank, WORLD.size
COUNT = 1 << 18  # float64: 2 MiB, MPI's rendezvous protocol
pids = WORLD.allgather(os.getpid())
comm = mpi.init(timeout=30)
group = WORLD.Split(0 if rank != 1 else MPI.UNDEFINED, rank)
healthy = mpi.init(group, timeout=30) if rank != 1 else None
x = np.full(COUNT, rank + 1.0)
comm.all_reduce(x, algorithm="native")  # (agreed: the next call's check rides with it)
if healthy is not None:
    healthy.all_reduce(x, algorithm="native")
WORLD.Barrier()


def data_in_flight(engine) -> bool:
    """Whether a native run has passed its check and issued every piece of its data."""
    for op in list(engine.inflight):
        stage = op.stages[op.stage] if op.stage < len(op.stages) else None
        run = getattr(stage, "run", None)
        if run is not None and run.verified and not run.steps and run.requests:
            return True
    return False


if n != 3:
    report.check(False, "run with 3 ranks")
elif rank == 1:
    engine = comm.calls.engine

    stopped = threading.Event()

    def stop_when_in_flight() -> None:
        while not data_in_flight(engine):
            time.sleep(0)
        os.kill(os.getpid(), signal.SIGSTOP)
        stopped.set()  # (once rank 0 has let it go on)

    threading.Thread(target=stop_when_in_flight, daemon=True).start()
    try:
        comm.all_reduce(np.full(COUNT, 2000.0), algorithm="native")
    except CollectiveError:
        pass  # (or it returns: its data went out before its peers gave up, a known window)
    # (a rank that never stopped, its data never found in flight, would test nothing)
    report.check(stopped.wait(30), "rank 1 never stopped with its data in flight")
else:
    try:
        got = comm.all_reduce(np.full(COUNT, 1000.0 * (rank + 1)), algorithm="native",
                              timeout=1.0)
        # (it may return on one of them: every piece it needed came before rank 1 stopped,
        # or MPICH's shared memory read it from the stopped rank's memory; then it is right)
        report.check(bool((got == 6000.0).all()), "the call with a stopped peer returned "
                     f"{np.unique(got)[:4]} where 6000 was right")
    except CollectiveError:
        pass
    held = []
    for k in range(30):
        got = healthy.all_reduce(x, algorithm="native")  # (ranks 0 and 2: 1 + 3)
        report.check(bool((got == 4.0).all()), f"healthy call {k}: wrong when it returned")
        held.append(got)
        if k == 10 and rank == 0:
            os.kill(pids[1], signal.SIGCONT)
        if k >= 10:
            time.sleep(0.02)
    time.sleep(0.3)
    healthy.barrier()
    for k, got in enumerate(held):
        report.check(bool((got == 4.0).all()),
                     f"healthy call {k}: right when it returned, now {np.unique(got)[:4]}")
WORLD.Barrier()
report.finish()
