"""An uncaught exception on one rank ends the whole MPI job, as ``python -m mpi4py`` does.

Without this, a rank whose program raises prints its traceback and leaves, while every other
rank waits in its next collective for the whole timeout (300 s by default), then in
``MPI_Finalize``. ``init()`` installs a ``sys.excepthook`` that prints the traceback as
Python would, then calls ``MPI_Abort`` on ``COMM_WORLD``: the launcher ends every rank within
about a second. ``init(abort_on_error=False)`` turns the aborts off (the latest ``init``
decides).

A rank that leaves through ``sys.exit(status)`` is handled at its exit (an ``atexit`` hook,
before MPI finalizes): a non-zero status aborts the job the same way, naming the rank and the
status. Any other exit (status 0, the end of the program, or with the aborts off any exit at
all) tells the rank's peers, on every communicator still alive, after which call it left (a
failure notice of kind "exited"): a peer waiting in a later call, which this rank will never
join, raises ``PeerFailedError`` naming it at once instead of waiting out its timeout, while
peers still finishing the calls this rank joined are left alone. That notice does not depend
on ``abort_on_error``: a rank that left is never waited for. (``raise SystemExit(n)``
bypasses ``sys.exit`` and counts as status 0 here.)

It stays out of the way where aborting would be wrong or useless: an interactive session,
a job of one process, MPI not (or no longer) initialised. Under ``python -m mpi4py`` mpi4py
aborts first and the hook is never reached. Exceptions in other threads end only their
thread, as in any Python program, and abort nothing.
"""

from __future__ import annotations

import atexit
import sys
import time
from types import TracebackType
from typing import Any, NoReturn

ENABLED = True  # what the latest init() asked for
_previous = None  # the hook this one chains to, once installed
_exit = sys.exit  # Python's own
_status: list = []  # the status sys.exit was last called with
_uncaught: list = []  # the exception that ended the program, where the aborts were off


def install(enabled: bool) -> None:
    """Install the hooks (once), and enable or disable the aborts (the exit's notice to the
    rank's peers stays on)."""
    global ENABLED, _previous
    ENABLED = bool(enabled)
    if _previous is None:
        _previous = sys.excepthook
        sys.excepthook = _abort_on_uncaught
        sys.exit = _exit_noting_status
        atexit.register(_at_exit)


def _exit_noting_status(status: Any = None) -> NoReturn:
    """``sys.exit``, noting the status for the exit hook (atexit cannot see it)."""
    _status.append(status)
    _exit(status)


def _world() -> Any:
    """MPI's COMM_WORLD where aborting or telling peers makes sense, else None."""
    if hasattr(sys, "ps1"):
        return None
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() < 2:
        return None
    return MPI.COMM_WORLD


def _at_exit() -> None:
    world = _world()
    if world is None:
        return
    status = _status[-1] if _status else None
    code = status if isinstance(status, int) else (0 if status is None else 1)
    if code != 0 and ENABLED:
        _abort(world, code, f"exited with status {code}")
        return
    from .transport import say_goodbye

    say_goodbye(_uncaught[-1] if _uncaught else f"it exited (status {code})")


# MPI_Abort ends every process of the job at once, and the launcher may drop what a process
# wrote but it has not forwarded yet: the traceback saying why. A moment to forward it.
FORWARD_SECONDS = 0.5


def _abort(world: Any, code: int, what: str) -> None:
    """Say why, give the launcher a moment to forward it, and end the job (MPI_Abort)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream must not stop the abort
            pass
    print(f"collectives: rank {world.Get_rank()} {what}: aborting the MPI job (MPI_Abort), "
          "so that the other ranks do not wait for it", file=sys.stderr, flush=True)
    time.sleep(FORWARD_SECONDS)
    world.Abort(code)


def _abort_on_uncaught(kind: type[BaseException], value: BaseException,
                       tb: TracebackType | None) -> None:
    (_previous or sys.__excepthook__)(kind, value, tb)  # the traceback, as usual
    world = _world()
    if world is None:
        return
    if not ENABLED:  # the exit hook tells the peers this rank left, and why
        _uncaught.append(f"it raised an uncaught {kind.__name__}: {value}")
        return
    _abort(world, 1, f"raised an uncaught {kind.__name__}")
