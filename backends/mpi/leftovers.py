"""What MPI may still write into when the program ends, kept alive until ``MPI_Finalize``.

mpi4py finalizes MPI after the interpreter has torn its modules down. The buffers of a
request still active then (a free's exchange of counts whose peers' counts are on their way,
an agreement given up on, receives withdrawn after a failure) were freed by the teardown,
and ``MPI_Finalize`` wrote the messages still arriving into freed memory: glibc then aborted
the process ("malloc(): unsorted double linked list corrupted"), in one launch of three of a
program that freed a communicator just before it ended.

So such buffers are held here (``keep``), or the lists that hold them, and at exit (before
the teardown) this module's list takes a reference that nothing gives back: what it holds
outlives the teardown, and ``MPI_Finalize`` writes into live memory. Only a program's end
leaves them, once.
"""

from __future__ import annotations

import atexit
import ctypes
from typing import Any, TypeVar

T = TypeVar("T")
_HELD: list[Any] = []  # buffers, and lists of them, that MPI may still write into


def keep(held: T) -> T:
    """Keep ``held`` alive until the process ends, and return it: a buffer MPI may still
    write into, or a list of such (a module's, changed in place: what it holds at the end)."""
    _HELD.append(held)
    return held


@atexit.register
def _outlive_teardown() -> None:
    # (a reference the teardown does not know of: it clears the module's dict, and the list,
    # with all it holds, stays)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_HELD))
