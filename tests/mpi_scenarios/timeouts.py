"""Timeouts over real MPI ranks: a rank that never comes is named, in time, on every waiter.

Each case makes a fresh communicator (a timed-out one is unusable by design), lets the last
rank stay away while the others call, and then meets on ``COMM_WORLD`` (the user's own
communicator, which the library never touches). Prints the first error message seen so the
docs can quote a real one.
"""

from __future__ import annotations

import time

import numpy as np
from _common import WORLD, Report
from collectives.backends import mpi

from collectives.errors import CollectiveError, CollectiveTimeoutError

TIMEOUT = 0.5
MARGIN = 0.5  # polling, scheduling on an oversubscribed machine
report = Report("timeouts")
n, rank = WORLD.size, WORLD.rank
late = n - 1
messages: list[str] = []


def expect_timeout(name: str, fn, missing: list[int] | None, collective: str, timeout: float) -> None:
    start = time.monotonic()
    try:
        fn()
    except CollectiveTimeoutError as exc:
        took = time.monotonic() - start
        messages.append(str(exc))
        report.check(exc.collective == collective,
                     f"{name}: error names collective {exc.collective!r}, not {collective!r}")
        if missing is not None:
            report.check(exc.missing == missing, f"{name}: missing {exc.missing}, not {missing}")
        report.check(bool(exc.missing), f"{name}: names no missing rank")
        report.check(f"rank {rank}: {collective} timed out after {timeout:g} s" in str(exc),
                     f"{name}: message {str(exc)!r}")
        report.check(timeout <= took <= timeout + MARGIN,
                     f"{name}: raised after {took:.2f} s for a {timeout} s timeout")
        return
    except Exception as exc:  # noqa: BLE001 - the wrong error is a failure to report
        report.check(False, f"{name}: raised {type(exc).__name__}: {exc}")
        return
    report.check(False, f"{name}: returned instead of timing out")


def case(name: str, body, *, check: bool = True, timeout: float = 30.0) -> None:
    """``body(comm)`` on every rank but the last, which arrives only after they gave up."""
    comm = mpi.init(timeout=timeout, check=check)
    if rank != late:
        body(comm)
        try:  # a timed-out communicator refuses further calls, saying why
            comm.all_reduce(np.ones(3))
            report.check(False, f"{name}: communicator still usable after a timeout")
        except CollectiveError as exc:
            report.check("unusable after an earlier failure" in str(exc),
                         f"{name}: later call said {exc!r}")
    WORLD.Barrier()


def main() -> None:
    if n == 1:
        report.finish("skipped: needs 2 or more ranks")
        return
    x = np.ones(1000, np.float32)
    everyone_else = [r for r in range(n) if r != rank]
    # The argument check is the first wait: it names exactly the ranks that did not arrive.
    case("agreement", lambda c: expect_timeout(
        "agreement", lambda: c.all_reduce(x, timeout=TIMEOUT), [late], "all_reduce", TIMEOUT))
    case("native", lambda c: expect_timeout(
        "native", lambda: c.all_reduce(x, algorithm="native", timeout=TIMEOUT), [late],
        "all_reduce", TIMEOUT))
    case("default timeout", lambda c: expect_timeout(
        "default timeout", lambda: c.broadcast(x, root=0), [late], "broadcast", TIMEOUT),
        timeout=TIMEOUT)
    case("barrier", lambda c: expect_timeout(
        "barrier", lambda: c.barrier(timeout=TIMEOUT), [late], "barrier", TIMEOUT))
    # check=False: no agreement; the schedule's first receive from the late rank times out.
    # Rank 0 receives from the last rank first in the ring; others may wait on a waiter.
    case("ring, check=False", lambda c: expect_timeout(
        "ring, check=False", lambda: c.all_reduce(x, algorithm="ring", timeout=TIMEOUT),
        [late] if rank == 0 else None, "all_reduce", TIMEOUT), check=False)
    # check=False and MPI's own collective: MPI cannot say who is missing, so every peer is named.
    case("native, check=False", lambda c: expect_timeout(
        "native, check=False", lambda: c.all_reduce(x, algorithm="native", timeout=TIMEOUT),
        everyone_else, "all_reduce", TIMEOUT), check=False)
    if n >= 3:  # only rank 0 comes: all the others are named
        comm = mpi.init(timeout=30)
        if rank == 0:
            expect_timeout("several missing", lambda: comm.reduce(x, timeout=TIMEOUT),
                           list(range(1, n)), "reduce", TIMEOUT)
        WORLD.Barrier()
    if rank == 0 and messages:
        print(f"EXAMPLE {messages[0]}", flush=True)
    report.finish()


if __name__ == "__main__":
    main()
