"""Reading another process's memory: Linux's cross-memory attach (``process_vm_readv``).

One system call copies bytes from a peer process's address space into ours, so a rank reads
a peer's input where it lies, with no copy through shared memory first. The kernel allows it
where this process may trace the peer (same user, and no Yama or seccomp rule against it):
``usable`` asks every rank of a node once, and the shared-memory all-reduce reads directly
only where every rank can read every other.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np

from collectives.errors import CollectiveError


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _readv() -> Any:
    """libc's ``process_vm_readv``, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    function.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                         ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return function


READV = _readv()


def read_into(pid: int, address: int, out: np.ndarray) -> None:
    """Fill the contiguous ``out`` with the ``out.nbytes`` bytes at ``address`` in process
    ``pid``; ``CollectiveError`` if the kernel refuses (the peer is gone, say)."""
    done, total, base = 0, out.nbytes, out.ctypes.data
    while done < total:
        local = _IoVec(base + done, total - done)
        remote = _IoVec(address + done, total - done)
        got = READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) if READV else -1
        if got <= 0:
            error = ctypes.get_errno()
            raise CollectiveError(
                f"reading {total - done} bytes of process {pid} (a rank on this node) failed: "
                f"{os.strerror(error) if error else 'no process_vm_readv'}; the peer may have "
                "exited (algorithm='ring' or 'native' do not read peers' memory)")
        done += got


def usable(node: Any) -> bool:
    """Whether every rank of ``node`` (an mpi4py communicator of one host's ranks) can read
    every other's memory; collective over ``node``, the same answer on every rank."""
    from mpi4py import MPI

    probe = np.full(8, node.Get_rank() + 1, np.int64)
    peers = node.allgather((os.getpid(), probe.ctypes.data))
    ok = READV is not None
    got = np.empty_like(probe)
    for rank, (pid, address) in enumerate(peers):
        if not ok:
            break
        try:
            read_into(pid, address, got)
            ok = bool((got == rank + 1).all())
        except CollectiveError:
            ok = False
    return bool(node.allreduce(ok, op=MPI.LAND))
