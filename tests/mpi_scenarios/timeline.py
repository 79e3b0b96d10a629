"""A timeline recorded on MPI ranks: one rank late to every call, a native fast-path loop, an
asynchronous call; each process writes its file (COLLECTIVES_TIMELINE names the folder).

Usage: mpiexec -n 4 python tests/mpi_scenarios/timeline.py [late rank] [seconds late]
The checks of the files are the test's (tests/test_timeline.py).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from _common import Report  # noqa: F401 - puts the checkout on the path

import collectives

comm = collectives.init()
late = int(sys.argv[1]) if len(sys.argv) > 1 else 2
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
x = np.ones(1 << 14, np.float32)
for algorithm in ("ring", "rechd"):
    for _ in range(3):
        if comm.rank == late:
            time.sleep(seconds)
        assert (comm.all_reduce(x, algorithm=algorithm) == comm.size).all()
small = np.ones(1024, np.float32)  # 4 KiB: MPI's persistent all-reduce, the fast path
for _ in range(20):
    comm.all_reduce(small, algorithm="native")
work = comm.all_reduce(x, algorithm="ring", async_op=True)
assert (work.wait() == comm.size).all()
comm.barrier()
if comm.rank == 0:
    print(f"SUMMARY timeline: rank {late} was {seconds} s late to 6 calls")
