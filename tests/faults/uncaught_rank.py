"""A rank whose program raises an exception it does not catch, launched the plain way.

    mpiexec -n N python tests/faults/uncaught_rank.py MODE

``raise``: after one all-reduce, rank 1 raises; the others call another all-reduce with the
default 300 s timeout. The library's hook aborts the job: it ends within about a second.
``keep``: ``init(abort_on_error=False)``; every rank prints whether the hook would abort,
then leaves normally.
``keep-raise``: ``init(abort_on_error=False)``; after one all-reduce, rank 1 raises; the
others' next all-reduce (``timeout=60``) raises ``PeerFailedError`` naming rank 1 and its
exception at once: with the aborts off, a rank that leaves still tells its peers.
``exit3``: after one all-reduce, rank 1 calls ``sys.exit(3)``; the others call another
all-reduce with ``timeout=60``: the job is aborted within seconds, naming rank 1 and status 3.
``exit0``: every rank makes ten more all-reduces (the hot path, which publishes nothing),
then rank 1 calls ``sys.exit(0)``; the others' next all-reduce raises ``PeerFailedError``
naming rank 1 and its last call, 11, at once (they print it and leave).
``exit0-last``: rank 1 leaves with ``sys.exit(0)`` after the last all-reduce, which the others
join late: they get their results, and the job ends with status 0.
``exit0-inflight``: a step of ``comm.buckets`` (two buckets, agreed on a first step); rank 1
marks the first tensor ready (its bucket goes out) and leaves with ``sys.exit(0)``, that bucket
in flight; the others' ``wait()`` (timeout 60 s) raises naming rank 1 at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import time  # noqa: E402

import numpy as np  # noqa: E402
from collectives.backends import mpi  # noqa: E402
from collectives.backends.mpi import abort  # noqa: E402

from collectives.errors import PeerFailedError  # noqa: E402


def main() -> None:
    mode = sys.argv[1]
    comm = mpi.init(abort_on_error=False) if mode.startswith("keep") else mpi.init()
    comm.all_reduce(np.ones(4))
    if mode == "keep":
        # one write (print writes the line and its newline apart when Python runs unbuffered,
        # and mpiexec may put the other rank's line between them)
        sys.stdout.write(f"RANK {comm.rank} ABORTS {abort.ENABLED}\n")
        sys.stdout.flush()
        return
    if mode == "exit0-last":
        if comm.rank == 1:
            comm.all_reduce(np.ones(4), algorithm="tree")  # its last call, then it leaves
            sys.exit(0)
        time.sleep(0.5 * comm.rank)  # (the others arrive late, and one later still)
        got = comm.all_reduce(np.ones(4), algorithm="tree", timeout=60)
        time.sleep(0.5)  # (rank 1's goodbye arrives while the others are still here)
        sys.stdout.write(f"RANK {comm.rank} GOT {float(got[0])}\n")
        return
    if mode == "exit0-inflight":
        xs = [np.ones(1000, np.float32), np.ones(10, np.float32)]
        buckets = comm.buckets(xs, bucket_bytes=0, timeout=60)
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        buckets.wait()
        if comm.rank == 1:
            buckets.ready(0, xs[0])  # in flight as it leaves
            sys.exit(0)
        time.sleep(0.3)
        try:
            for k, x in enumerate(xs):
                buckets.ready(k, x)
            buckets.wait()
        except Exception as exc:  # noqa: BLE001 - what it says is the outcome
            sys.stdout.write(f"RANK {comm.rank} {type(exc).__name__}: {exc}\n")
        else:
            sys.stdout.write(f"RANK {comm.rank} GOT RESULTS\n")
        sys.stdout.flush()
        return
    if mode == "exit0":  # ten more of the same call: the hot path from the second on
        for _ in range(10):
            comm.all_reduce(np.ones(4))
    if comm.rank == 1:
        if mode == "exit3":
            sys.exit(3)
        if mode == "exit0":
            sys.exit(0)
        raise RuntimeError("an error this program does not catch")
    if mode in ("exit0", "keep-raise"):  # (caught and printed: an abort could cut the
        # job's output short)
        try:
            comm.all_reduce(np.ones(4), timeout=60)
        except PeerFailedError as exc:
            sys.stdout.write(f"RANK {comm.rank} PEER FAILED: {exc}\n")
            sys.stdout.flush()
        return
    comm.all_reduce(np.ones(4), timeout=60)


if __name__ == "__main__":
    main()
