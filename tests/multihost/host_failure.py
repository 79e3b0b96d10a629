"""All-reduces in a loop while the test harms a host; every rank that can still talk reports.

Usage: ``mpiexec -disable-auto-cleanup ... python host_failure.py ALGORITHM TIMEOUT``. Each
rank warms up, prints ``READY rank R host H``, then all-reduces with ``timeout=TIMEOUT`` until
an error. The test kills a host's ranks or unplugs its cable in the meantime. Each rank that
gets an error prints one ``ERROR`` line: its rank, hostname, ``time.monotonic()`` when the error
arrived (the machine's clock, so the test compares it with the moment of the fault), the
exception's class, the ranks it names (``missing``) and its message. Ranks then wait
``2 * TIMEOUT`` seconds (a rank that reports late, on a loaded machine, still finds its peers) and
leave with ``os._exit``: ``MPI_Finalize`` could wait for the dead peers forever. A rank stuck
inside an MPI call that never returns is ended by the library's hang guard, with its report;
a rank with no error and no report ``TIMEOUT + 20`` seconds after ``READY`` dumps its threads'
Python stacks (``faulthandler``).
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from collectives.backends import mpi  # noqa: E402

from collectives.errors import CollectiveError  # noqa: E402


def say(line: str) -> None:
    """One write per line: hydra forwards what each write gives it, so lines of different ranks
    would mix if a line took two writes (as ``print`` does without output buffering)."""
    os.write(1, (line + "\n").encode())


algorithm, timeout = sys.argv[1], float(sys.argv[2])
comm = mpi.init(timeout=timeout)  # (the hang guard goes by the longer of this and a call's)
host = socket.gethostname()
x = np.full(1 << 14, comm.rank + 1, np.float32)
for _ in range(3):
    comm.all_reduce(x, algorithm=algorithm)
say(f"READY rank {comm.rank} host {host}")
# A rank neither in error nor ended by the hang guard well past its deadline prints where each
# thread is: a hang the guard missed
faulthandler.dump_traceback_later(timeout + 20)
try:
    while True:
        comm.all_reduce(x, algorithm=algorithm, timeout=timeout)
except CollectiveError as exc:
    faulthandler.cancel_dump_traceback_later()
    missing = sorted(getattr(exc, "missing", None) or [])
    say(f"ERROR rank {comm.rank} host {host} at {time.monotonic():.3f} {type(exc).__name__} "
        f"missing={','.join(map(str, missing))} | {exc}")
# Let the other ranks report before this one leaves: a rank still inside the failed call when
# a peer leaves sees MPI fail with it (another error than the test expects). The test accepts
# errors up to TIMEOUT + SLACK (3 s) after the fault, and this rank's may have come at once
# (a node-mate's notice): 2 * TIMEOUT after it covers the slowest the test accepts
time.sleep(2 * timeout)
os._exit(0)
