"""What MPI may still write into when the program ends, kept alive until ``MPI_Finalize``.

mpi4py finalizes MPI after the interpreter has torn its modules down. The buffers of a
request still active then (a free's exchange of counts whose peers' counts are on their way,
an agreement given up on, receives withdrawn after a failure) were freed by the teardown,
and ``MPI_Finalize`` wrote the messages still arriving into freed memory: glibc then aborted
the process ("malloc(): unsorted double linked list corrupted"), in one launch of three of a
program that freed a communicator just before it ended.

So such buffers are held here (``keep``), or the lists that hold them (``hold``), and at exit
(before the teardown) this module's list takes a reference that nothing gives back: what it
holds outlives the teardown, and ``MPI_Finalize`` writes into live memory. Only a program's
end leaves them, once.
"""

from __future__ import annotations

import atexit
import ctypes
from typing import Any

_HELD: list[Any] = []  # buffers, and lists of them, that MPI may still write into


def keep(buffer: Any) -> None:
    """Hold ``buffer`` (MPI may still write into it) until the process ends."""
    _HELD.append(buffer)


def hold(holder: list) -> list:
    """Keep whatever ``holder`` holds at the program's end alive past the teardown (a module's
    list of requests and their buffers, changed in place); returns it."""
    _HELD.append(holder)
    return holder


@atexit.register
def _outlive_teardown() -> None:
    # (a reference the teardown does not know of: it clears the module's dict, and the list,
    # with all it holds, stays)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_HELD))
