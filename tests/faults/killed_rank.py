"""A rank killed with SIGKILL in the middle of a job: what happens to the others.

    mpiexec [-disable-auto-cleanup] -n N python tests/faults/killed_rank.py WHEN [TIMEOUT [HOW]]

The last rank kills itself; the others keep calling all-reduces with ``timeout=TIMEOUT``.
HOW is how it dies: ``signal`` (SIGKILL, the default) or ``exit`` (``os._exit(137)``: gone at
once, no exit hook, no goodbye to its peers, as a crash looks to them). Only ``exit`` leaves
survivors to report under hydra: its proxy kills every rank as soon as it reaps one that died
of a signal, whatever ``-disable-auto-cleanup`` says (``pmip.c``: ``PMIP_bcast_signal``).
WHEN is where it dies:

* ``waiting``: between calls, while the others already wait for it in the next one;
* ``native``: the same, on MPI's own all-reduce (``algorithm="native"``);
* ``mid-ring``: 5 ms into a ring all-reduce of 32 MiB (issued asynchronously), while data
  moves.

Every survivor that gets to report prints one line, ``SURVIVOR {json}``: its rank, the error
it got (or "no error") and after how long. It then waits a little (so the others can report
too) and leaves with ``os._exit``, since ``MPI_Finalize`` could wait for the dead rank forever.
Whether survivors live to report is the launcher's choice: see docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from collectives.backends import mpi  # noqa: E402


def die(how: str) -> None:
    if how == "exit":
        os._exit(137)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    when = sys.argv[1]
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    how = sys.argv[3] if len(sys.argv) > 3 else "signal"
    algorithm = {"waiting": "auto", "native": "native", "mid-ring": "ring"}[when]
    count = 8 << 20 if when == "mid-ring" else 1000  # 32 MiB of float32: a transfer in flight
    comm = mpi.init(timeout=30)
    x = np.ones(count, np.float32)
    for _ in range(2):
        comm.all_reduce(x, algorithm=algorithm)
    if comm.rank == comm.size - 1:
        if when == "mid-ring":  # issued, then gone while its data moves
            comm.all_reduce(x, algorithm=algorithm, async_op=True)
            time.sleep(0.005)
            die(how)
        time.sleep(0.3)  # the others are already waiting in the next call
        die(how)
    start = time.monotonic()
    report: dict = {"rank": comm.rank, "error": "no error", "message": "", "bases": []}
    try:
        for _ in range(1000):
            comm.all_reduce(x, algorithm=algorithm, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the outcome being measured
        report.update(error=type(exc).__name__, message=str(exc)[:500],
                      bases=[c.__name__ for c in type(exc).__mro__])
    report["seconds"] = round(time.monotonic() - start, 3)
    print("SURVIVOR " + json.dumps(report), flush=True)
    time.sleep(2 * timeout)  # let the other survivors report before anyone leaves
    os._exit(0)


if __name__ == "__main__":
    main()
