"""CuPy buckets kept from call to call (``collectives.algorithms.reuse``): what tells later
whether anything else refers to a bucket's memory, and a bucket's views in one pass.

A kept bucket is reused only where nothing but the keeper refers to its memory: CuPy counts
the references to the memory object (``bucket.data.mem``), and each view's own pointer
object says whether a view, or a pointer taken from one, is still held.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from collectives.arrays import split_by_slicing
from collectives.result_pool import held_by_one

from . import gather


class KeptBuckets:
    """The keeper's questions, for `CupyArrays` (a mixin over its ``stream``)."""

    if TYPE_CHECKING:
        def stream(self, device: int) -> Any: ...

    def address(self, x) -> int:
        return x.data.ptr

    def keep(self, bucket, views):
        """What tells later whether anything else refers to ``bucket``'s memory: the stream
        it is packed on and the number of pointers to that memory now (the bucket's and each
        view's own); None where there is no such count (a stand-in for CuPy)."""
        if not gather.available() or not hasattr(bucket.data, "mem"):
            return None  # (no local may hold the memory: it would count as a pointer)
        pointers = tuple(v.data for v in views)
        forms = tuple((v.shape, v.strides, v.dtype) for v in views)
        return (self.stream(bucket.device.id).ptr, sys.getrefcount(bucket.data.mem), pointers,
                forms)

    def unshared(self, bucket, views, record) -> bool:
        """Whether only the keeper refers to ``bucket`` and ``views``: no new pointer into the
        memory (a view of a view, ``x.data + k``), no reference to a view or its pointer (a
        kept result, a DLPack export), packing goes on the same stream, and each view has the
        shape, strides and dtype it was handed out with (a caller may set them, then drop
        it)."""
        stream, count, pointers, forms = record  # (the views' pointers: each view's, ours)
        return (self.stream(bucket.device.id).ptr == stream
                and sys.getrefcount(bucket.data.mem) == count and held_by_one(views)
                and held_by_one(pointers, holders=2)
                and [(v.shape, v.strides, v.dtype) for v in views] == list(forms))

    def split(self, buffer, shapes):
        """One array constructor per view, on the bucket's memory (a slice then a reshape
        cost CuPy about twice as much); slices where the array module has no pointer
        arithmetic."""
        if not buffer.flags.c_contiguous or not hasattr(type(buffer.data), "__add__"):
            return split_by_slicing(buffer, shapes)
        import cupy  # (a CuPy bucket's module: imported already)

        ndarray, dtype, base = cupy.ndarray, buffer.dtype, buffer.data
        itemsize, views, offset = dtype.itemsize, [], 0
        for shape in shapes:
            views.append(ndarray(shape, dtype, memptr=base + offset))
            count = 1
            for d in shape:
                count *= d
            offset += count * itemsize
        return views
