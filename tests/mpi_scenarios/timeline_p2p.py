"""Point-to-point messages on the timeline, on MPI ranks: messages while nothing records, then
recording into the folder given: rank 0 late to a blocking send, an isend/irecv pair, a
receive that times out, and a clock exchange (rank 1 told it is on another host).

Usage: mpiexec -n 2 python tests/mpi_scenarios/timeline_p2p.py FOLDER
The checks of the files are the test's (tests/test_p2p_timeline.py).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from _common import Report  # noqa: F401 - puts the checkout on the path

import collectives
from collectives import timeline

LATE = 0.2  # seconds rank 0 computes before its blocking send (at 0.05 s, a rank 1 held
# back on a loaded machine once came after the message: no wait to record)
UNRECORDED_TAG = 7  # the tag of the messages sent while nothing records

comm = collectives.init()
assert comm.size == 2, "run it on 2 ranks"
peer = 1 - comm.rank
inbox = np.empty((3, 4), np.float32)
unrecorded = comm.isend(np.ones(2, np.int64), peer, UNRECORDED_TAG)
comm.recv(np.empty(2, np.int64), peer, UNRECORDED_TAG)
unrecorded.wait()
assert unrecorded._op.trace is None  # nothing records: no trace, no event

timeline.start(sys.argv[1])
if comm.rank == 0:
    time.sleep(LATE)
    comm.send(np.arange(12, dtype=np.float32).reshape(3, 4), 1, tag=5)
else:
    assert (comm.recv(inbox, 0, tag=5) == np.arange(12).reshape(3, 4)).all()
sent = comm.isend(np.full(6, comm.rank, np.float64), peer, tag=2)
received = comm.irecv(np.empty(6), peer, tag=2)
assert (received.wait() == peer).all() and sent.wait() is None
if comm.rank == 1:
    try:
        comm.recv(np.empty(1), 0, tag=9, timeout=0.1)  # rank 0 sends nothing with tag 9
        raise AssertionError("the receive did not time out")
    except collectives.CollectiveTimeoutError:
        pass
timeline.align(comm, [("h0", True), ("h1", True)])  # its ping-pongs are not recorded
comm.barrier()
timeline.stop()
if comm.rank == 0:
    print(f"SUMMARY timeline_p2p: rank 0 was {LATE} s late to its send")
