"""Whether arrays share memory: what the ``out=`` aliasing checks ask (an ``out`` that
overlaps an input other than its own, or another ``out``, is filled from buffers of the
library's own, or refused).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .arrays import Array, ArrayBackend


def overlaps(backend: ArrayBackend, a: Array, b: Array) -> bool:
    """Whether two arrays' memory extents intersect (a conservative overlap test)."""
    if type(a) is np.ndarray and type(b) is np.ndarray:  # (NumPy's test of the same bounds:
        return bool(np.may_share_memory(a, b))  # 0.6 µs, where two byte_bounds take 7)
    da, sa, ea = backend.extent(a)
    db, sb, eb = backend.extent(b)
    return da == db and sa < eb and sb < ea


def same_memory(backend: ArrayBackend, a: Array, b: Array) -> bool:
    """Whether ``a`` and ``b`` are views of the very same elements (one extent, shape and
    dtype, both C-contiguous): a call reading one and writing the other runs in place."""
    return (tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
            and backend.contiguous(a) and backend.contiguous(b)
            and backend.extent(a) == backend.extent(b))


def any_overlap(backend: ArrayBackend, arrays: Sequence[Array]) -> bool:
    """Whether any two of ``arrays`` share memory (``O(n log n)``: a sweep over extents)."""
    spans = sorted(backend.extent(a) for a in arrays if a is not None and a.size)
    for (d0, _, end), (d1, start, _) in zip(spans, spans[1:]):
        if d0 == d1 and start < end:
            return True
    return False


def overlapping_pairs(backend: ArrayBackend, arrays: Sequence[Any]) -> Iterator[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, of ``arrays`` (None and empty ones left out) whose
    memory intersects: for a few NumPy arrays, NumPy's bounds test pair by pair (0.2 µs a
    pair, where a sweep takes 1 µs an array for its extents), else a sweep over extents,
    ``O(n log n)`` in the usual case."""
    present = [(k, a) for k, a in enumerate(arrays) if a is not None and a.size]
    if len(present) <= 16 and all(type(a) is np.ndarray for _, a in present):
        for n, (j, b) in enumerate(present):
            for i, a in present[:n]:
                if np.may_share_memory(a, b):
                    yield i, j
        return
    active: list[tuple] = []
    for device, start, end, j in sorted((*backend.extent(a), k) for k, a in present):
        active = [a for a in active if a[0] == device and a[2] > start]
        for *_, i in active:
            yield min(i, j), max(i, j)
        active.append((device, start, end, j))


def unsafe_outputs(backend: ArrayBackend, inputs: Sequence[Array],
                   outputs: Sequence[Array]) -> bool:
    """Whether writing ``outputs`` could clobber data still to be read: an output that shares
    memory with another output, or with an input other than exactly its own (``outputs[i] is
    inputs[i]``: in place)."""
    if len(inputs) == 1 and len(outputs) == 1:  # (one device: every call of a one-GPU job)
        (x,), (y,) = inputs, outputs
        return y is not None and y is not x and x is not None and bool(x.size) and \
            bool(y.size) and overlaps(backend, x, y)
    n = len(inputs)
    for i, j in overlapping_pairs(backend, [*inputs, *outputs]):
        if j < n:
            continue  # inputs are only read: sharing memory is harmless
        if i < n and j - n == i and outputs[i] is inputs[i]:
            continue  # a device's own input as its output: in place
        return True
    return False


def clashing(backend: ArrayBackend, outs: Sequence[Array],
             same_results: bool = True) -> tuple[int, int] | None:
    """The first two of ``outs`` (``(i, j)``, ``i < j``) where writing one spoils the other:
    any two that share memory, but (``same_results``: every one takes the same result) the
    same array, or the same view, given twice."""
    def harmless(a: Any, b: Any) -> bool:
        return same_results and (a is b or (a.shape == b.shape and a.dtype == b.dtype
                                             and a.strides == b.strides
                                             and backend.extent(a) == backend.extent(b)))

    for i, j in overlapping_pairs(backend, outs):
        if not harmless(outs[i], outs[j]):
            return i, j
    return None
