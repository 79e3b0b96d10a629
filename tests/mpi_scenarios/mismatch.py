"""Mismatched calls over real MPI ranks: the same CollectiveMismatchError on every rank.

Each case has the last rank disagree (shape, dtype, op, root, algorithm, shards, or a
different collective altogether) on a call made for the first time, so the agreement runs.
Every rank must raise ``CollectiveMismatchError`` before any data moves, with one message (up
to its "rank k:" prefix) naming the field; the communicator then still works. (Calls agreed
earlier disagree in ``natives.py``: there the check value riding with the data finds them.)
Last, the last rank passes ``init`` a bad timeout: every rank raises the ValueError naming it.
"""

from __future__ import annotations

import os

import numpy as np
from _common import WORLD, Report
from collectives.backends import mpi

from collectives.errors import CollectiveMismatchError

report = Report("mismatch")
n, rank = WORLD.size, WORLD.rank
odd = rank == n - 1
comm = mpi.init(timeout=10)
x = np.ones(8, np.float32)

CASES = {
    "shape": (lambda: comm.all_reduce(np.ones(9 if odd else 8, np.float32)), "shape"),
    "dtype": (lambda: comm.all_reduce(x.astype(np.float64) if odd else x), "dtype"),
    "op": (lambda: comm.all_reduce(x, "max" if odd else "sum"), "op"),
    "root": (lambda: comm.reduce(x, root=1 if odd else 0), "root"),
    "algorithm": (lambda: comm.all_reduce(x, algorithm="tree" if odd else "ring"), "algorithm"),
    "native vs ring": (lambda: comm.all_reduce(x, algorithm="native" if odd else "ring"),
                       "algorithm"),
    "shards": (lambda: comm.all_reduce(x, algorithm="ring", shards=2 if odd else 1), "shards"),
    "broadcast root": (lambda: comm.broadcast(x, root=1 if odd else 0), "root"),
    "collective": (lambda: comm.reduce(x) if odd else comm.all_reduce(x), "different collectives"),
    # a barrier is an all-reduce of one int64 underneath: the agreement names what differs
    "barrier": (lambda: comm.barrier() if odd else comm.all_reduce(x), "different"),
}


def main() -> None:
    if n == 1:
        report.finish("skipped: needs 2 or more ranks")
        return
    seen: dict[str, str] = {}
    for name, (fn, field) in CASES.items():
        try:
            fn()
            report.check(False, f"{name}: no error")
        except CollectiveMismatchError as exc:
            text = str(exc)
            report.check(text.startswith(f"rank {rank}: "), f"{name}: message {text!r}")
            report.check(field in text, f"{name}: message does not name {field!r}: {text!r}")
            seen[name] = text.split(": ", 1)[1]
        except Exception as exc:  # noqa: BLE001 - the wrong error is a failure to report
            report.check(False, f"{name}: raised {type(exc).__name__}: {exc}")
        # Nothing moved and nothing broke: the next call works everywhere.
        got = comm.all_reduce(np.full(3, rank, np.int64))
        report.check(np.array_equal(got, np.full(3, n * (n - 1) // 2)), f"{name}: comm unusable")
    # One rank's bad argument to init raises on every rank, naming that rank and the argument
    # (raised on that rank alone, it left the others in MPI's gather, which has no timeout).
    try:
        mpi.init(timeout=-1 if odd else 10)
        report.check(False, "init: no error")
    except ValueError as exc:
        report.check(str(exc).startswith(f"collectives.backends.mpi.init on rank {n - 1}: "
                                          "timeout=-1 must be a positive"), f"init: {exc}")
    # The same for its groups, and for COLLECTIVES_RANKS_PER_NODE (both were checked after
    # the gather: the others waited there for good)
    bad_groups = [[0], list(range(n))] if odd else None
    try:
        mpi.init(timeout=10, groups=bad_groups)
        report.check(False, "init groups: no error")
    except ValueError as exc:
        report.check(f"init on rank {n - 1}: groups=" in str(exc), f"init groups: {exc}")
    # Ranks that pass different check= (one agrees on calls, one does not) are told at init
    # (the second call raised a mismatch of calls that were alike, and broke the communicator)
    try:
        mpi.init(timeout=10, check=not odd)
        report.check(False, "init check: no error")
    except ValueError as exc:
        report.check("ranks passed different check= (rank 0: True" in str(exc),
                     f"init check: {exc}")
    saved = os.environ.get("COLLECTIVES_RANKS_PER_NODE")
    os.environ["COLLECTIVES_RANKS_PER_NODE"] = "+2" if odd else "1"
    try:
        mpi.init(timeout=10)
        report.check(False, "init env: no error")
    except ValueError as exc:
        report.check(f"init on rank {n - 1}: COLLECTIVES_RANKS_PER_NODE='+2'" in str(exc),
                     f"init env: {exc}")
    # ... and a good value on one rank, another (or none) on the others: each rank's auto
    # priced its own simulated nodes (a float16 reduce ran as tree on some ranks, one_device on
    # others, and the root's sum lacked a rank, without a word)
    os.environ["COLLECTIVES_RANKS_PER_NODE"] = "2" if odd else "1"
    try:
        mpi.init(timeout=10)
        report.check(False, "init env alike: no error")
    except ValueError as exc:
        report.check("ranks passed different COLLECTIVES_RANKS_PER_NODE (an environment "
                     "variable) (rank 0: 1" in str(exc), f"init env alike: {exc}")
    finally:
        if saved is None:
            del os.environ["COLLECTIVES_RANKS_PER_NODE"]
        else:
            os.environ["COLLECTIVES_RANKS_PER_NODE"] = saved
    # A communicator that is none (not mpi4py's, or the null one a split leaves a rank out
    # with): this rank's own mistake, named (mpi4py's AttributeError or raw error named none)
    from mpi4py import MPI
    for bad, error, fragment in ((5, TypeError, "comm=5 must be an mpi4py communicator"),
                                 (MPI.COMM_NULL, ValueError, "comm is MPI.COMM_NULL")):
        try:
            mpi.init(bad)
            report.check(False, f"init({bad!r}): no error")
        except error as exc:
            report.check(fragment in str(exc), f"init({bad!r}): {exc}")
    everyone = WORLD.gather(seen, root=0)
    if rank == 0:
        for name in CASES:
            texts = {d.get(name) for d in everyone}
            report.check(len(texts) == 1, f"{name}: ranks raised different messages {texts}")
        print(f"EXAMPLE {seen.get('dtype')}", flush=True)
        print(f"EXAMPLE {seen.get('barrier')}", flush=True)
    report.finish()


if __name__ == "__main__":
    main()
