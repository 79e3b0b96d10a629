"""Timeouts and failure notices over real MPI ranks: a rank that never comes is named, in
time, on every waiter; a rank that fails tells the others, who raise at once.

Each case makes a fresh communicator (a failed one is broken by design), lets the last rank
stay away while the others call, and then meets on ``COMM_WORLD`` (the user's own
communicator, which the library never touches). Prints the first timeout message seen so
the docs can quote a real one.
"""

from __future__ import annotations

import time

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi

from collectives.errors import CollectiveTimeoutError, CommunicatorBrokenError, PeerFailedError

TIMEOUT = 0.5
REPEATS = 20  # of the asynchronous rejection case (one repeat: tens of milliseconds)
# asking the peers what they do (0.25 s at most), polling, a busy machine: the bound shows the
# call's own 0.5 s timeout ended it, not the communicator's 30 s (at 0.6 s, 0.75 s of the
# 1.1 s went to the timeout and the asking, leaving a loaded machine 0.35 s)
MARGIN = 2.0
report = Report("timeouts")
n, rank = WORLD.size, WORLD.rank
late = n - 1
messages: list[str] = []


def expect(name: str, fn, error: type | tuple[type, ...], within: float, *, missing=None,
           says: str = "") -> None:
    start = time.monotonic()
    try:
        fn()
    except error as exc:
        took = time.monotonic() - start
        messages.append(str(exc))
        report.check(took <= within, f"{name}: raised after {took:.2f} s, not within {within}")
        report.check(says in str(exc), f"{name}: message {str(exc)!r} does not say {says!r}")
        if missing is not None:
            report.check(exc.missing == missing, f"{name}: missing {exc.missing}, not {missing}")
        return
    except Exception as exc:  # noqa: BLE001 - the wrong error is a failure to report
        report.check(False, f"{name}: raised {type(exc).__name__}: {exc}")
        return
    names = error.__name__ if isinstance(error, type) else " or ".join(e.__name__ for e in error)
    report.check(False, f"{name}: returned instead of raising {names}")


def case(name: str, body, *, check: bool = True, timeout: float = 30.0) -> None:
    """``body(comm)`` on every rank but the last, which arrives only after they gave up."""
    comm = mpi.init(timeout=timeout, check=check)
    if rank != late:
        body(comm)
        expect(f"{name}, next call", lambda: comm.all_reduce(np.ones(3)), CommunicatorBrokenError,
               0.5, says="is broken since")
    meet()
    comm.free()


def timed_out(name: str, call, what: str, missing=None, timeout: float = TIMEOUT):
    return lambda c: expect(name, lambda: call(c), CollectiveTimeoutError, timeout + MARGIN,
                            missing=missing, says=f"{what}")


def main() -> None:
    if n == 1:
        report.finish("skipped: needs 2 or more ranks")
        return
    x = np.ones(1000, np.float32)
    others = [r for r in range(n) if r != rank]
    # The argument agreement is the first wait: it names the ranks that did not arrive.
    case("agreement", timed_out("agreement", lambda c: c.all_reduce(x, timeout=TIMEOUT),
                                "all_reduce(float32[1000], op=sum)", [late]))
    case("native", timed_out("native", lambda c: c.all_reduce(x, algorithm="native",
                                                              timeout=TIMEOUT),
                             "timed out after 0.5 s", [late]))
    case("default timeout", timed_out("default timeout", lambda c: c.broadcast(x, root=0),
                                      "broadcast", [late]), timeout=TIMEOUT)
    case("barrier", timed_out("barrier", lambda c: c.barrier(timeout=TIMEOUT), "barrier", [late]))
    # check=False: no agreement; the late rank is the one that answers no question.
    for algorithm in ("ring", "native"):
        case(f"{algorithm}, check=False", timed_out(
            f"{algorithm}, check=False", lambda c, a=algorithm: c.all_reduce(
                x, algorithm=a, timeout=TIMEOUT), "timed out", [late]), check=False)
    notices(x, others)
    if rank == 0 and messages:
        print(f"EXAMPLE {messages[0]}", flush=True)
    report.finish()


def notices(x: np.ndarray, others: list[int]) -> None:
    """A rank that fails tells the others: they raise PeerFailedError naming it, within a
    second of its failure, instead of waiting out their own (long) timeouts."""
    # 1. rank 0 times out (the last rank stays away); the others wait with a long timeout
    comm = mpi.init(timeout=30)
    comm.all_reduce(x)  # agreed: the next call goes straight to the data
    if rank != late:
        short = TIMEOUT if rank == 0 else 30.0
        if rank == 0:
            expect("timing-out rank", lambda: comm.all_reduce(x, timeout=short),
                   CollectiveTimeoutError, TIMEOUT + MARGIN)
        else:
            expect("told of rank 0's timeout", lambda: comm.all_reduce(x, timeout=short),
                   PeerFailedError, TIMEOUT + MARGIN + 1.0, says="rank 0 failed in call 2")
    meet()
    comm.free()
    # 2. check=False, a rank-local argument error: no agreement would have told the others
    comm = mpi.init(timeout=30, check=False)
    comm.all_reduce(x)
    if rank == 1:
        expect("bad op on rank 1", lambda: comm.all_reduce(x.astype(bool), "sum"), TypeError, 0.5)
    else:
        expect("told of rank 1's error", lambda: comm.all_reduce(x.astype(bool), "max"),
               PeerFailedError, 1.5, says="rank 1 failed in call 2")
    meet()
    comm.free()
    # 3. a bad op on rank 0 while its peers issue agreed calls asynchronously: each peer hears
    # of the rejections in its own order and joins the calls' agreements late; repeated,
    # since which order each rank meets decides whether late agreements could wait on each
    # other (they once did, about one launch in six on three ranks)
    shapes = [(2, 3), (5,), (3, 2)]
    for repeat in range(REPEATS):
        comm = mpi.init(timeout=3.0)
        xs = [np.full(s, float(rank + 1), np.float32) for s in shapes]
        for h in [comm.all_reduce(y, async_op=True) for y in xs]:
            h.wait()

        def issue_all(op, comm=comm, xs=xs):
            return [h.wait() for h in [comm.all_reduce(y, op, async_op=True) for y in xs]]

        # (a rank that learns of the verdict while issuing its next call raises
        # CommunicatorBrokenError, which says why)
        if rank == 0:
            expect(f"bad op, async, repeat {repeat}", lambda: issue_all("median"),
                   (ValueError, CommunicatorBrokenError), 1.0, says="median")
        else:
            expect(f"told of rank 0's bad op, async, repeat {repeat}", lambda: issue_all("sum"),
                   (PeerFailedError, CommunicatorBrokenError), 1.0, says="rank 0")
        meet()
        comm.free()


if __name__ == "__main__":
    main()
