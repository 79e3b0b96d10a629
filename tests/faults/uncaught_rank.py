"""A rank whose program raises an exception it does not catch, launched the plain way.

    mpiexec -n N python tests/faults/uncaught_rank.py MODE

``raise``: after one all-reduce, rank 1 raises; the others call another all-reduce with the
default 300 s timeout. The library's hook aborts the job: it ends within about a second.
``keep``: ``init(abort_on_error=False)``; every rank prints whether the hook would abort,
then leaves normally.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from collectives.backends import mpi  # noqa: E402
from collectives.backends.mpi import abort  # noqa: E402


def main() -> None:
    mode = sys.argv[1]
    comm = mpi.init(abort_on_error=False) if mode == "keep" else mpi.init()
    comm.all_reduce(np.ones(4))
    if mode == "keep":
        # one write (print writes the line and its newline apart when Python runs unbuffered,
        # and mpiexec may put the other rank's line between them)
        sys.stdout.write(f"RANK {comm.rank} ABORTS {abort.ENABLED}\n")
        sys.stdout.flush()
        return
    if comm.rank == 1:
        raise RuntimeError("an error this program does not catch")
    comm.all_reduce(np.ones(4))


if __name__ == "__main__":
    main()
