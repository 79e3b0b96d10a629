"""The compiled hot path (``_hot.c``), where it built and loads: finding MPI's ``MPI_Start`` and
``MPI_Test`` in the library mpi4py uses, and binding one to a persistent all-reduce.

It is optional: the package installs and runs without it (``hot_path.py`` does the same in
Python), it is left out where the extension did not build, where MPI's library cannot be
found among those this process has loaded (Linux's ``/proc/self/maps``) or is not the one
mpi4py reports, and wherever ``COLLECTIVES_PURE_PYTHON=1`` is set (every rank must set it
alike: it changes no MPI call, only who makes them).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Literal

import numpy as np
from mpi4py import MPI

try:
    from . import _hot
except ImportError:  # not built here: the Python hot path runs
    _hot = None  # type: ignore[assignment]  # (_hot.pyi types the module; None: not built)

ENV_PURE = "COLLECTIVES_PURE_PYTHON"
RAN, RUNNING, MISMATCH, REFUSED = 0, 1, 2, 3  # what Hot.run returns (negative: MPI's error)
STATUS_ROOM = 256  # bytes _hot.c keeps for an MPI_Status

_functions: tuple[int, int] | None | Literal[False] = False  # (MPI_Start, MPI_Test), None: unavailable


def _library() -> Any:
    """The MPI library mpi4py loaded, as a ctypes handle (None where it cannot be told)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps
                     if line.count(" ") >= 5 and "libmpi" in os.path.basename(line.strip())}
    except (OSError, IndexError):
        return None
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            lib.MPI_Start, lib.MPI_Test, lib.MPI_Get_library_version  # noqa: B018
        except (OSError, AttributeError):
            continue
        found.append(lib)
    if len(found) != 1:
        return None
    lib = found[0]
    text, length = ctypes.create_string_buffer(8192), ctypes.c_int(0)
    if lib.MPI_Get_library_version(text, ctypes.byref(length)):
        return None
    if text.value.decode(errors="replace").strip() != MPI.Get_library_version().strip():
        return None  # another MPI than mpi4py's
    return lib


def pure_python() -> bool:
    """Whether ``COLLECTIVES_PURE_PYTHON`` switches the compiled path off (``1``, ``true``,
    ``on``, ``yes``; unset, ``0``, ``false``, ``off``, ``no`` leave it on); any other value
    raises ValueError naming it (``false`` switched it off: any text but ``0`` did)."""
    value = os.environ.get(ENV_PURE, "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    raise ValueError(f"{ENV_PURE}={value!r}: use 1 to switch the compiled hot path off, or 0 "
                     "(or leave it unset) to keep it")


def functions() -> tuple[int, int] | None:
    """The addresses of ``MPI_Start`` and ``MPI_Test``, or None where the compiled path is off."""
    global _functions
    if _functions is False:
        _functions = None
        if (_hot is not None and not pure_python()
                and MPI._sizeof(MPI.Status) <= STATUS_ROOM):
            lib = _library()
            if lib is not None:
                address = ctypes.cast(lib.MPI_Start, ctypes.c_void_p).value
                test = ctypes.cast(lib.MPI_Test, ctypes.c_void_p).value
                assert address is not None and test is not None  # symbols found: not NULL
                _functions = (address, test)
    return _functions


def bind(entry: Any, mine: bytes, spin: float, hold: float) -> Any:
    """A compiled hot path over ``entry``'s request and in-place buffer (``mine``: this rank's
    trailer), or None where there is none."""
    found = functions()
    if found is None:
        return None
    start, test = found
    mine_arr = np.frombuffer(mine, np.uint8).copy()
    expected = np.frombuffer(entry.rider.expected, np.uint8).copy()
    return _hot.Hot(entry.head.ctypes.data, entry.head.nbytes, entry.tail.ctypes.data,
                    mine_arr.ctypes.data, mine_arr.nbytes, entry.trailer.ctypes.data,
                    expected.ctypes.data, expected.nbytes, MPI._addressof(entry.data_req),
                    start, test, spin, hold, (entry, mine_arr, expected))
