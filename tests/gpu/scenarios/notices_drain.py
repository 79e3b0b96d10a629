"""The NCCL transport's notices, freed with a question nobody answered: the free drains it
(``collectives.backends.mpi.draining``, as the MPI transport's free does), so no communicator
made afterwards finds it. Host side only: runs without a GPU or CuPy, under mpiexec.

Run as ``mpiexec -n 2 python tests/gpu/scenarios/notices_drain.py``.
"""

from __future__ import annotations

import sys
import time

from collectives.backends.mpi import draining
from collectives.backends.nccl.control import Notices
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
problems = []
for _ in range(3):
    notices = Notices(comm.Dup())
    notices.activity = (1, "all_reduce(float32[4], op=sum)", True)
    if rank == 0:
        notices.ask(0.01)  # (its peers never answer: they never poll)
    else:
        deadline = time.monotonic() + 5
        while not notices.comm.Iprobe(0, MPI.ANY_TAG) and time.monotonic() < deadline:
            time.sleep(0.001)
    comm.Barrier()
    sent, received, sends = notices.free()
    draining.free_when_drained([(notices.comm, sent, received)], [notices.comm], sends)
    made = [comm.Dup() for _ in range(3)]
    problems += [f"a new communicator holds a message from rank {s.Get_source()}"
                 for c in made if c.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, s := MPI.Status())]
    for c in made:
        c.Free()
comm.Barrier()
deadline = time.monotonic() + 5
while draining.pending() and time.monotonic() < deadline:
    draining.progress()
    time.sleep(0.01)
if draining.pending():
    problems.append(f"frees never finished: {draining.pending()}")
for problem in problems:
    print(f"FAIL rank {rank}: {problem}", flush=True)
every = comm.allreduce(len(problems))
if rank == 0:
    print(f"SUMMARY notices_drain {'PASS' if every == 0 else 'FAIL'} ranks={size}")
sys.stdout.flush()
