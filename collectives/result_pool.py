"""Mapped memory for the library's NumPy results and buckets (``NumpyArrays.result``).

Each buffer is an *owner*: a ``uint8`` array that results and buckets view, so its reference
count says whether anyone still holds any part of it (every view of a view refers to the
owner: NumPy's ``base`` is always the array that owns the memory). ``held_by_one`` counts
the holders of other objects alike (``algorithms/reuse.py``'s kept views).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np


class ResultPool:
    """Mapped memory for results, reused only when nobody else holds it.

    A result is a view of an owner buffer from the pool; every view of it (and every view of
    those) keeps the owner alive, so the owner's reference count tells exactly whether a user
    still holds any part of it. Buffers below ``min_bytes`` come from ``malloc``'s heap anyway
    and are not pooled. The pool keeps at most ``per_size`` buffers of one size, buffers of at
    most ``sizes`` different sizes and ``max_bytes`` in all, dropping the least recently used:
    a loop that repeats its sizes is served from the pool, one whose sizes keep changing holds
    little.
    """

    def __init__(self, min_bytes: int = 64 << 10, per_size: int = 8, sizes: int = 16,
                 max_bytes: int = 256 << 20):
        self.min_bytes, self.per_size, self.max_bytes = min_bytes, per_size, max_bytes
        self.sizes = sizes
        self._free: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.min_bytes:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            owners = self._free.get(nbytes)
            if owners is None:
                owners = self._free[nbytes] = []
            self._free.move_to_end(nbytes)
            for owner in owners:
                # the list, the loop variable and getrefcount's argument: nobody else
                if sys.getrefcount(owner) <= 3:
                    return owner
            owner = np.empty(nbytes, np.uint8)
            if len(owners) < self.per_size:
                owners.append(owner)
                self._bytes += nbytes
                self._evict()
            return owner

    def _evict(self) -> None:
        while (self._bytes > self.max_bytes or len(self._free) > self.sizes) and self._free:
            size, owners = next(iter(self._free.items()))
            if owners:
                owners.pop(0)
                self._bytes -= size
            if not owners:
                del self._free[size]

    @property
    def nbytes(self) -> int:
        return self._bytes

    def holders(self, owner: np.ndarray) -> int:
        """How many references ``owner`` has besides the pool's own and this call's: its
        caller's, and every array that views it. Counted under the pool's lock, so that no
        other thread drops it from the pool (or takes it) in between."""
        with self._lock:
            pooled = any(kept is owner for kept in self._free.get(owner.nbytes, ()))
            # (this frame's parameter and getrefcount's argument are two of them)
            return sys.getrefcount(owner) - 2 - pooled


def held_by_one(items: tuple, holders: int = 1) -> bool:
    """Whether each object of ``items`` is referenced by ``holders`` places only, counting
    ``items`` itself as one of them (CPython's reference counts; the count this function sees
    for such an object is measured once, on this interpreter, by ``_calibrate``)."""
    return not items or max(map(sys.getrefcount, items)) <= _SOLE + holders - 1


def _calibrate() -> int:
    # an object held by one tuple alone, seen through the expression above
    probe = (object(),)
    return max(map(sys.getrefcount, probe))


_SOLE = _calibrate()
