"""Whether the transport finds its rank oversubscribed, and waits without spinning then.

Usage: ``mpiexec -n N python oversubscribed.py [PINS]``; ``PINS``, as ``0,0,1``, binds each
rank to one core of this process's (rank r to the PINS[r]-th) before MPI starts. Each rank
prints ``OVERSUBSCRIBED rank R FLAG hot_spin=S dup=FLAG``: the transport's finding, the spin
of its hot path (its only spin), and a duplicate's finding (inherited),
after a checked all-reduce.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _common import WORLD, Report
from collectives.backends import mpi

if len(sys.argv) > 1:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(sys.argv[1].split(",")[WORLD.rank])]})
comm = mpi.init(timeout=60)
report = Report("oversubscribed")
x = np.arange(1000, dtype=np.float64) + comm.rank
for _ in range(20):  # (the hot path too)
    got = comm.all_reduce(x)
want = np.arange(1000, dtype=np.float64) * comm.size + sum(range(comm.size))
report.check(np.array_equal(got, want), "wrong all-reduce")
transport = comm.transport
with comm.dup() as twin:
    inherited = twin.transport.oversubscribed
line = (f"OVERSUBSCRIBED rank {comm.rank} {transport.oversubscribed} "
        f"hot_spin={transport.native.spin:g} dup={inherited}")
os.write(1, (line + "\n").encode())  # (one write: ranks' lines do not mix)
report.finish()
