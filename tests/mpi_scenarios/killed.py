"""A rank killed with SIGKILL mid-job: the others fail with an error or are torn down, never hang.

Usage: ``mpiexec [-disable-auto-cleanup] -n N python killed.py [algorithm [folder [how]]]``.
The last rank kills itself while the others wait in the next all-reduce: with SIGKILL (``how``
``signal``, the default), or ending at once without a signal (``exit``: ``os._exit(137)``, no
exit hook, no goodbye, as a crash looks to its peers). Under hydra's default the launcher
tears the whole job down at once ("BAD TERMINATION ... Killed (signal 9)"); so does its proxy
once it reaps a rank killed by a signal, whatever ``-disable-auto-cleanup`` says. With that
flag and ``exit`` the survivors keep running and each prints one ``SURVIVOR`` line with the
error it got: ``CollectiveTimeoutError`` naming the dead rank after the timeout (or
``PeerFailedError`` where MPI noticed the dead peer first, or a peer's notice of either).
Survivors then leave with ``os._exit``: ``MPI_Finalize`` could wait for the dead rank forever.
A survivor leaves once every survivor has printed its line (a file each in a folder rank 0
made, told to all while all were alive), or after ``2 * TIMEOUT`` at most.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
from _common import WORLD
from collectives.backends import mpi

from collectives.errors import CollectiveError

TIMEOUT = 1.0
algorithm = sys.argv[1] if len(sys.argv) > 1 else "auto"
comm = mpi.init(timeout=30)
victim = comm.size - 1
if len(sys.argv) > 2:  # an empty folder of the caller's
    reported = sys.argv[2]
else:
    reported = WORLD.bcast(tempfile.mkdtemp(prefix="killed-") if WORLD.rank == 0 else None)
x = np.ones(1000, np.float32)
for _ in range(3):
    comm.all_reduce(x, algorithm=algorithm)
if comm.rank == victim:
    time.sleep(0.3)  # the others are already waiting in the next call
    if len(sys.argv) > 3 and sys.argv[3] == "exit":
        os._exit(137)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    for _ in range(1000):
        comm.all_reduce(x, algorithm=algorithm, timeout=TIMEOUT)
    line = "no error"
except CollectiveError as exc:
    line = f"{type(exc).__name__}: {exc}"
print(f"SURVIVOR rank {WORLD.rank} after {time.monotonic() - start:.2f} s: {line}", flush=True)
# let the other survivors report before the launcher reacts to this one's leaving
open(os.path.join(reported, str(WORLD.rank)), "w").close()
until = time.monotonic() + 2 * TIMEOUT
while time.monotonic() < until:
    try:
        if len(os.listdir(reported)) >= WORLD.size - 1:
            break
    except FileNotFoundError:  # rank 0 saw them all and removed the folder
        break
    time.sleep(0.01)
time.sleep(0.1)  # (the launcher forwards the last lines)
if WORLD.rank == 0 and len(sys.argv) <= 2:
    shutil.rmtree(reported, ignore_errors=True)
os._exit(0)
