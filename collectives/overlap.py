"""Whether arrays share memory: what the ``out=`` aliasing checks ask (an ``out`` that
overlaps an input other than its own, or another ``out``, is filled from buffers of the
library's own, or refused).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def any_overlap(backend: ArrayBackend, arrays: Sequence[Array]) -> bool:
    """Whether any two of ``arrays`` share memory (``O(n log n)``: a sweep over extents)."""
    spans = sorted(backend.extent(a) for a in arrays if a is not None and a.size)
    for (d0, _, end), (d1, start, _) in zip(spans, spans[1:]):
        if d0 == d1 and start < end:
            return True
    return False


def unsafe_outputs(backend: ArrayBackend, inputs: Sequence[Array],
                   outputs: Sequence[Array]) -> bool:
    """Whether writing ``outputs`` could clobber data still to be read: an output that shares
    memory with another output, or with an input other than exactly its own (``outputs[i] is
    inputs[i]``: in place). A sweep over memory extents, ``O(n log n)`` in the usual case."""
    if len(inputs) == 1 and len(outputs) == 1:  # (one device: every call of a one-GPU job)
        (x,), (y,) = inputs, outputs
        return y is not None and y is not x and x is not None and bool(x.size) and \
            bool(y.size) and overlaps(backend, x, y)
    if len(inputs) + len(outputs) <= 16 and all(  # (a few NumPy arrays: pair by pair, as
            type(a) is np.ndarray for a in (*inputs, *outputs) if a is not None):  # overlaps)
        return _unsafe_pairs(inputs, outputs)
    items = []
    for kind, arrays in (("in", inputs), ("out", outputs)):
        for i, a in enumerate(arrays):
            if a is not None and a.size:
                device, start, end = backend.extent(a)
                items.append((device, start, end, kind, i, a))
    items.sort(key=lambda item: (item[0], item[1]))
    active: list[tuple] = []
    for item in items:
        device, start = item[0], item[1]
        active = [a for a in active if a[0] == device and a[2] > start]
        for other in active:
            kinds = {other[3], item[3]}
            if kinds == {"in"}:
                continue  # inputs are only read: sharing memory is harmless
            if kinds == {"in", "out"} and other[4] == item[4] and other[5] is item[5]:
                continue  # a device's own input as its output: in place
            return True
        active.append(item)
    return False


def _unsafe_pairs(inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
    """``unsafe_outputs`` of a few NumPy arrays, each output against the rest with NumPy's
    bounds test (0.2 µs a pair, where the sweep takes 1 µs an array for its extents)."""
    outs = [(i, y) for i, y in enumerate(outputs) if y is not None and y.size]
    for k, (i, y) in enumerate(outs):
        if any(np.may_share_memory(y, z) for _, z in outs[k + 1:]):
            return True
        for j, x in enumerate(inputs):
            if x is not None and x.size and not (j == i and x is y) and np.may_share_memory(x, y):
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

    if len(outs) <= 16 and all(type(o) is np.ndarray for o in outs):  # (as _unsafe_pairs)
        for j, b in enumerate(outs):
            for i, a in enumerate(outs[:j]):
                if a.size and b.size and np.may_share_memory(a, b) and not harmless(a, b):
                    return i, j
        return None
    items = sorted((*backend.extent(o), i) for i, o in enumerate(outs) if o.size)
    active: list[tuple] = []
    for device, start, end, j in items:
        active = [a for a in active if a[0] == device and a[2] > start]
        for *_, i in active:
            if not harmless(outs[i], outs[j]):
                return min(i, j), max(i, j)
        active.append((device, start, end, j))
    return None
