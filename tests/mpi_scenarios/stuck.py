"""A call into the transport that never returns: the hang guard ends the rank, and the job.

Usage: ``COLLECTIVES_HANG_GUARD=1 mpiexec -n 2 python stuck.py CASE``. After a warm-up, rank 1
sleeps instead of joining the next call, and rank 0 calls with ``timeout=1`` (the
communicator's: 30 s):

* ``stuck``: rank 0's transport stops returning (its ``idle`` sleeps in C with the GIL released,
  as MPICH's ``MPI_Test`` does when it blocks after a peer died). The hang guard must end rank
  0 (exit code 124) with a report naming the call and the stuck frame, and the launcher the job.
* ``stuck-entering``: the same, but the transport call that never returns comes as the call
  starts (``publish_activity``), before any wait: the guard sees the call's claim held too long
  (here the communicator's timeout is 1 s too: the longer of the two counts outside a wait).
* ``stuck-progress``: an asynchronous all-reduce whose progress thread never comes back from
  the transport, while the caller polls ``is_completed()``: no wait, no claim, only the
  progress thread's silence tells.
* ``stopped``: rank 1 stops rank 0 (SIGSTOP) in its wait for 4 s, past the deadline and the
  grace, then resumes it: rank 0 must raise ``CollectiveTimeoutError`` itself, not be ended.
* ``slow``: nothing is stuck; rank 1 joins after 3 s and rank 0 waits with ``timeout=10`` (or
  ``wait(timeout=10)`` on an asynchronous call): longer than the communicator's timeout (here
  1 s) plus the grace, but within the call's own. Both ranks must finish and print ``SUMMARY stuck PASS``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import numpy as np
from _common import WORLD, Report
from collectives.backends import mpi

from collectives.errors import CollectiveError, CollectiveTimeoutError

case = sys.argv[1]
# (stuck: the call's own timeout, 1 s, is the one the guard must go by, not this)
comm = mpi.init(timeout=30.0 if case == "stuck" else 1.0)
x = np.ones(1000, np.float32)
for _ in range(3):
    comm.all_reduce(x)
report = Report("stuck")
if case.startswith("stuck"):
    if comm.rank == 0:
        libc = ctypes.CDLL(None)

        def never_returns(*args: object) -> None:
            libc.sleep(600)

        if case == "stuck-entering":
            comm.transport.publish_activity = never_returns
        else:
            comm.transport.idle = never_returns
        if case == "stuck-progress":
            work = comm.all_reduce(x[:999], async_op=True)
            polled = time.monotonic()
            while not work.is_completed() and time.monotonic() - polled < 60:
                time.sleep(0.01)
        else:
            comm.all_reduce(x[:999], timeout=1.0)  # (a new signature: not the hot path)
        print("rank 0 came back from a stuck call", flush=True)
    else:
        time.sleep(600)
elif case == "stopped":
    pids = WORLD.allgather(os.getpid())
    if comm.rank == 0:
        try:
            comm.all_reduce(x[:999], timeout=1.0)
            report.check(False, "the call returned")
        except CollectiveError as exc:
            report.check(isinstance(exc, CollectiveTimeoutError), f"raised {exc!r}")
            print(f"rank 0 raised {type(exc).__name__}", flush=True)
    else:
        time.sleep(0.3)  # rank 0 is waiting in its call
        os.kill(pids[0], signal.SIGSTOP)
        time.sleep(4.0)
        os.kill(pids[0], signal.SIGCONT)
        # (rank 1 never joins the call: it waits for rank 0 in COMM_WORLD's barrier, which
        # is no call of the library's)
    WORLD.Barrier()
    report.finish()
else:
    for blocking in (True, False):
        if comm.rank == 1:
            time.sleep(3.0)
        if blocking:
            got = comm.all_reduce(x, timeout=10.0)
        else:
            got = comm.all_reduce(x, async_op=True).wait(timeout=10.0)
        report.check(np.array_equal(got, x * comm.size), f"blocking={blocking}: wrong sum")
    report.finish()
