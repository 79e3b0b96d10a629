"""Under mpiexec, no GPU needed: the NCCL backend's host side over real MPI ranks.

* every rank receives the same 128-byte NCCL unique id, made by NCCL on rank 0;
* nodes from MPI (one node here) and from COLLECTIVES_RANKS_PER_NODE;
* the control channel runs the core's SPMD executor (an all-reduce plan) over MPI;
* a failure notice reaches every peer; activity queries are answered, and the watchdog reads
  the answers (five items each) as the engine publishes them.
"""

from __future__ import annotations

import hashlib
import sys
import time
import warnings

import numpy as np
from collectives.backends.nccl import broadcast_unique_id, node_of_ranks, ranks_per_node
from collectives.backends.nccl.control import MpiChannel, Notices
from collectives.backends.nccl.watchdog import late_ranks
from mpi4py import MPI

from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime.execute.spmd import SpmdRun
from collectives.runtime.transport import Failure

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from cupy.cuda import nccl

uid = broadcast_unique_id(comm)
digests = comm.allgather(hashlib.sha256(uid).hexdigest())
assert len(uid) == 128 and len(set(digests)) == 1, digests
second = broadcast_unique_id(comm)
assert second != uid, "every communicator gets a fresh id"

nodes = node_of_ranks(comm)
expected = ranks_per_node()
if expected is None:
    assert nodes == (tuple(range(size)),), nodes  # one host: one node
else:
    assert nodes == tuple(tuple(range(i, min(i + expected, size)))
                          for i in range(0, size, expected)), nodes

channel = MpiChannel(comm.Dup())
for name in ("rechd", "ring", "tree"):
    buf = np.arange(10, dtype=np.int64) * (rank + 1)
    plan = algorithms.rank_plan(Collective.ALL_REDUCE, name, size, rank)
    run = SpmdRun(plan, buf, ReduceOp.SUM, channel, seq=7, check=1)
    deadline = time.monotonic() + 30
    while not run.advance():
        assert time.monotonic() < deadline, f"{name}: all-reduce over the control channel hung"
    total = sum(range(1, size + 1))
    assert (buf == np.arange(10) * total).all(), (name, buf)

notices = Notices(comm.Dup())
notices.activity = (3, "all_reduce(float32[4], op=sum)", True)
comm.Barrier()
if rank == 0:
    answers = notices.ask(20.0)
    assert sorted(answers) == list(range(1, size)), answers
    assert all(seq == 3 for seq, *_ in answers.values()), answers
    # what the watchdog makes of real answers when call 4 does not finish: nobody is in it
    missing, doing = late_ranks(answers, 4)
    assert missing == list(range(1, size)), (missing, doing)
    assert size == 1 or "in call 3" in doing, doing
    assert late_ranks(answers, 3)[0] == list(range(1, size))  # all in it: every peer named
    notices.notify(Failure(0, 5, "error", "ValueError: on purpose"))
else:
    got = None
    deadline = time.monotonic() + 30
    while got is None:
        got = notices.poll()  # answers rank 0's query while it waits
        assert time.monotonic() < deadline, "no failure notice arrived"
        time.sleep(1e-3)
    assert got.rank == 0 and got.seq == 5 and "on purpose" in got.message, got
comm.Barrier()
if rank == 0:
    print(f"SUMMARY host_side PASS ranks={size} nodes={nodes} nccl={nccl.get_version()}")
sys.stdout.flush()
