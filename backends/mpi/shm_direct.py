"""The shared-memory all-reduce's direct reads: peers' inputs where they lie, a block at a time.

Where every rank of the node can read every other's memory (``shm_cma.usable``) and the
payload is at least ``tuning.SHM_DIRECT_BYTES``, ranks copy nothing into the window: each
publishes where its input lies (process id and address, in its window header beside the
call's check value), and the reduction reads each peer's part of a block straight from the
peer's input into a small private buffer (``process_vm_readv``), so the block is read once
from memory, as the SPMD bound of ``benchmarks/ceiling.py`` counts, instead of copied into the
window by its owner and read from there. A peer's input is read only in the rounds' reductions,
all before the call's last barrier, which no rank passes before every reduction is done.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import shm_cma

PID, ADDRESS = 2, 3  # header words after the check value and sequence number


def publish(header: np.ndarray, src: Any) -> Any:
    """Write where this rank's input lies into its header; the input, contiguous (a copy
    where it is not: peers read it by address)."""
    if not src.flags.c_contiguous:
        src = np.ascontiguousarray(src)
    header[PID], header[ADDRESS] = os.getpid(), src.ctypes.data
    return src


class PeerInputs:
    """Every rank's input, from the headers, read a block at a time into ``scratch``."""

    __slots__ = ("buffers", "itemsize", "me", "peers")

    def __init__(self, headers: list[np.ndarray], me: int, dtype: np.dtype, step: int,
                 scratch: np.ndarray):
        self.peers = [(int(h[PID]), int(h[ADDRESS])) for h in headers]
        self.me, self.itemsize = me, dtype.itemsize
        flat = scratch.view(dtype)
        self.buffers = [flat[r * step:(r + 1) * step] for r in range(len(headers))]

    def blocks(self, a: int, b: int, own: Any) -> list[Any]:
        """Elements ``a:b`` of every rank's input, in rank order (this rank's from ``own``)."""
        out = []
        for rank, (pid, address) in enumerate(self.peers):
            if rank == self.me:
                out.append(own[a:b])
                continue
            buffer = self.buffers[rank][:b - a]
            shm_cma.read_into(pid, address + a * self.itemsize, buffer)
            out.append(buffer)
        return out
