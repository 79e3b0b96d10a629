"""Aligned result buffers for TensorFlow, and a bounded pool that reuses them.

Nothing here imports TensorFlow: ``convert`` hands these buffers to TensorFlow, which aliases
an array (no copy) only when its data is 64-byte aligned.

Why a pool: a fresh large NumPy buffer costs a page fault per 4 KiB page on first touch (on a
2-vCPU machine, allocating the outputs of one ResNet-50 batch cost more than reducing it).
TensorFlow's own allocator reuses memory; the pool does the same for the buffers results are
aliased from. Why a *bounded* pool: a loop whose tensor sizes change every step would otherwise
keep a buffer of every size it ever saw. The pool holds at most ``max_bytes`` and
``max_entries`` buffers (and ``keep`` of one size); past that, the least recently handed out
buffers are forgotten, and their memory returns once TensorFlow lets go of them.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from math import prod

import numpy as np

__all__ = ["ALIGNMENT", "BufferPool", "aligned_empty"]

ALIGNMENT = 64  # Eigen's EIGEN_MAX_ALIGN_BYTES: TF aliases buffers aligned to this, copies others


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


def _aligned_bytes(nbytes: int) -> np.ndarray:
    owner = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = (-owner.ctypes.data) % ALIGNMENT
    # Every view of this slice has ``owner`` as its .base (NumPy collapses view chains).
    return owner[start:start + nbytes]


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT`` boundary."""
    dtype, shape = np.dtype(dtype), _shape(shape)
    return _aligned_bytes(prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def _is_free(raw: np.ndarray) -> bool:
    # The owner's references: the aligned slice the pool keeps, getrefcount's argument and one
    # per live view. More than 2: TensorFlow (or a caller) still holds a view of the buffer.
    return sys.getrefcount(raw.base) <= 2


class BufferPool:
    """Aligned buffers, reused once TensorFlow has let go of them; bounded, least recently used out.

    ``empty(shape, dtype)`` returns a free pooled buffer of that byte size, or a fresh one
    (which joins the pool). TensorFlow holds a reference to every array it aliases (and the
    DLPack capsule of an eager result holds one too), so a buffer whose only reference is the
    pool's is free. Limits: ``max_bytes`` and ``max_entries`` over all buffers the pool knows
    (in use or free), ``keep`` buffers of one size; a buffer larger than ``max_bytes`` is never
    pooled. ``nbytes`` and ``len(pool)`` say what it holds now.
    """

    def __init__(self, max_bytes: int = 256 << 20, max_entries: int = 1024, keep: int = 4):
        self._lock = threading.Lock()
        # key: id of the owner array -> its aligned slice; order = least recently handed out first
        self._order: OrderedDict[int, np.ndarray] = OrderedDict()
        self._by_size: dict[int, list[np.ndarray]] = {}
        self._nbytes = 0
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.keep = keep

    def limit(self, *, max_bytes: int | None = None, max_entries: int | None = None,
              keep: int | None = None) -> None:
        """Change the bounds; buffers over the new bounds are forgotten now."""
        for name, value in (("max_bytes", max_bytes), ("max_entries", max_entries), ("keep", keep)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"{name}={value!r} must be a non-negative integer")
        with self._lock:
            if max_bytes is not None:
                self.max_bytes = max_bytes
            if max_entries is not None:
                self.max_entries = max_entries
            if keep is not None:
                self.keep = keep
                for held in list(self._by_size.values()):
                    for raw in held[keep:]:
                        self._forget(raw)
            self._evict()

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers the pool holds (in use by TensorFlow or free)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._order)

    def empty(self, shape, dtype) -> np.ndarray:
        """Like ``aligned_empty``, from the pool where a buffer of that size is free."""
        dtype, shape = np.dtype(dtype), _shape(shape)
        nbytes = prod(shape) * dtype.itemsize
        with self._lock:
            raw = next((r for r in self._by_size.get(nbytes, ()) if _is_free(r)), None)
            if raw is not None:
                self._order.move_to_end(id(raw.base))
            else:
                raw = _aligned_bytes(nbytes)
                self._remember(raw)
        return raw.view(dtype).reshape(shape)

    def clear(self) -> None:
        """Forget every pooled buffer (memory returns once TensorFlow frees its tensors)."""
        with self._lock:
            self._order.clear()
            self._by_size.clear()
            self._nbytes = 0

    # --- bookkeeping, under the lock ------------------------------------------------------

    def _remember(self, raw: np.ndarray) -> None:
        assert raw.base is not None  # a slice of its _aligned_bytes owner
        held = self._by_size.setdefault(raw.nbytes, [])
        if len(held) >= self.keep or raw.base.nbytes > self.max_bytes:
            if not held:
                del self._by_size[raw.nbytes]
            return
        held.append(raw)
        self._order[id(raw.base)] = raw
        self._nbytes += raw.base.nbytes
        self._evict()

    def _evict(self) -> None:
        while self._order and (self._nbytes > self.max_bytes or len(self._order) > self.max_entries):
            _, oldest = self._order.popitem(last=False)
            self._drop(oldest)

    def _forget(self, raw: np.ndarray) -> None:
        del self._order[id(raw.base)]
        self._drop(raw)

    def _drop(self, raw: np.ndarray) -> None:
        assert raw.base is not None  # a slice of its _aligned_bytes owner
        # By identity: `list.remove` would compare the arrays element by element.
        held = [r for r in self._by_size[raw.nbytes] if r is not raw]
        if held:
            self._by_size[raw.nbytes] = held
        else:
            del self._by_size[raw.nbytes]
        self._nbytes -= raw.base.nbytes
