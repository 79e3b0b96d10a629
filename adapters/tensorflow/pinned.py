"""Pinned host memory for staging device totals: no TensorFlow needed, so that ``Workers``
(``world.py``) and ``launched_world_size`` import without it."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PinnedBuffer"]


class PinnedBuffer:
    """Pinned host memory for staging device arrays, allocated on first use, grown as needed
    and reused; one user at a time (each cross-device-ops object has one, used under its
    lock)."""

    def __init__(self) -> None:
        self._memory: Any = None  # CuPy's pinned memory
        self._nbytes = 0

    def views(self, arrays) -> list[np.ndarray]:
        """One host array per device array (same shape and dtype), in this buffer."""
        import cupy

        sizes = [-(-a.nbytes // 256) * 256 for a in arrays]  # 256-byte aligned starts
        if sum(sizes) > self._nbytes:
            self._memory = cupy.cuda.alloc_pinned_memory(sum(sizes))
            self._nbytes = sum(sizes)
        raw = np.frombuffer(self._memory, np.uint8, self._nbytes) if self._nbytes else None
        views, at = [], 0
        for a, size in zip(arrays, sizes):
            # (raw is None only where no array has bytes: then it is never indexed)
            views.append(raw[at:at + a.nbytes].view(a.dtype).reshape(a.shape)  # type: ignore[index]
                         if a.nbytes else np.empty(a.shape, a.dtype))
            at += size
        return views
