"""A program that frees a communicator just before it ends: on rank 0 the free's exchange of
message counts is still pending at the end (rank 1 frees later), and MPI may write its
peer's counts into its buffers until ``MPI_Finalize``, which mpi4py calls after the
interpreter's teardown. The teardown freed them (``backends/mpi/leftovers.py``): the counts
went into freed memory, and glibc aborted one launch in three or so.

Each pending buffer gets a weak reference whose callback writes a line where the buffer is
freed; the references themselves are kept past the teardown, so the line shows whenever a
buffer is freed before the process ends. Run as ``mpiexec -n 2 python exit_after_free.py``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
import weakref

import numpy as np
from _common import Report
from collectives.backends import mpi
from collectives.backends.mpi import draining

report = Report("exit_after_free")
comm = mpi.init(timeout=60)
dup = comm.dup()
report.check(dup.all_reduce(np.ones(3)).tolist() == [2.0] * 3, "the call before the free")
if comm.rank == 1:
    time.sleep(0.5)  # (rank 0 ends first, its free pending)
dup.free()
watched = []
if comm.rank == 0:
    report.check(len(draining._PENDING) == 1, f"pending frees: {draining.pending()}")
    freed = functools.partial(os.write, 2, b"FREED: a pending free's buffer, before the end\n")
    watched = [weakref.ref(buffer, lambda _, say=freed: say())
               for drain in draining._PENDING for buffer in (drain.mine, drain.theirs)]
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(watched))  # (the references outlive teardown)
report.finish(f"watched={len(watched)}")
