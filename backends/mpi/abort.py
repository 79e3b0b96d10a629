"""An uncaught exception on one rank ends the whole MPI job, as ``python -m mpi4py`` does.

Without this, a rank whose program raises prints its traceback and leaves, while every other
rank waits in its next collective for the whole timeout (300 s by default), then in
``MPI_Finalize``. ``init()`` installs a ``sys.excepthook`` that prints the traceback as
Python would, then calls ``MPI_Abort`` on ``COMM_WORLD``: the launcher ends every rank within
about a second. ``init(abort_on_error=False)`` turns it off (the latest ``init`` decides).

It stays out of the way where aborting would be wrong or useless: an interactive session,
a job of one process, MPI not (or no longer) initialised. Under ``python -m mpi4py`` mpi4py
aborts first and the hook is never reached. Exceptions in other threads end only their
thread, as in any Python program, and abort nothing.
"""

from __future__ import annotations

import sys
from types import TracebackType

ENABLED = True  # what the latest init() asked for
_previous = None  # the hook this one chains to, once installed


def install(enabled: bool) -> None:
    """Install the hook (once), and enable or disable it."""
    global ENABLED, _previous
    ENABLED = bool(enabled)
    if _previous is None and enabled:
        _previous = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def _abort_on_uncaught(kind: type[BaseException], value: BaseException,
                       tb: TracebackType | None) -> None:
    (_previous or sys.__excepthook__)(kind, value, tb)  # the traceback, as usual
    if not ENABLED or hasattr(sys, "ps1"):
        return
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() < 2:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream must not stop the abort
            pass
    print(f"collectives: rank {MPI.COMM_WORLD.Get_rank()} raised an uncaught "
          f"{kind.__name__}: aborting the MPI job (MPI_Abort), so that the other ranks do "
          "not wait for it", file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Abort(1)
