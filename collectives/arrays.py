"""Arrays are the backend's business: the core asks it for every allocation, copy and reduction.

``ArrayBackend`` is what the core needs from whoever owns the arrays: NumPy for the
embedded and MPI transports (``NumpyArrays``, here, since NumPy is the core's one
dependency), CuPy for GPU backends. The core never calls an array library itself on a user's
array or a result; it only reads ``shape`` and ``dtype`` and asks the backend.

Results that the library allocates come from ``ResultPool``: memory that stays mapped,
reused only once nothing outside the pool refers to it, so a fresh result never page-faults in
the steady state and a user never holds a buffer the library will write again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import kernels
from .ops import ReduceOp
from .result_pool import ResultPool, held_by_one

Array = Any  # an array of the backend's array module

# In a batch, a host-memory tensor this large travels alone rather than be copied into a
# fusion bucket: the copy costs more than the call it saves (ResNet-50's gradients over 2 MPI
# ranks on 2 cores: 21.9 ms alone from 1 MiB, 34.8 ms all fused, 25.4 ms alone from 16 KiB).
# On a GPU a copy is cheap beside a call: there only the bucket size sends a tensor alone.
HOST_ALONE_BYTES = 1 << 20


class ArrayBackend(Protocol):
    """Everything the core does to arrays."""

    name: str  # "numpy", "cupy", ...
    xp: Any  # the array module

    def owns(self, x: object) -> bool:
        """Whether ``x`` is an array of this backend."""
        ...

    def dtype_of(self, x: Array) -> np.dtype:
        """``x``'s element type as a NumPy dtype."""
        ...

    def alone_bytes(self, x: Array) -> int:
        """In a batch, tensors like ``x`` of at least this many bytes travel alone rather than
        be copied into a fusion bucket (where a copy costs more than the call it saves)."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, like: Array | None = None) -> Array:
        """A new array, on ``like``'s device where that matters."""
        ...

    def result(self, shape: tuple[int, ...], dtype: np.dtype, like: Array | None = None) -> Array:
        """A new array handed to the user (may come from a pool of mapped memory)."""
        ...

    def flat(self, x: Array) -> Array:
        """A 1-D view of ``x`` when it is C-contiguous, else a contiguous 1-D copy."""
        ...

    def copy(self, dst: Array, src: Array) -> None: ...

    def combine(self, op: ReduceOp, dst: Array, srcs: Sequence[Array]) -> None:
        """``dst = op(dst, srcs[0], srcs[1], ...)``, left to right (the order is the result)."""
        ...

    def combine_into(self, op: ReduceOp, dst: Array, first: Array, srcs: Sequence[Array]) -> None:
        """``dst = op(first, srcs[0], ...)``, left to right, without copying ``first`` first."""
        ...

    def divide(self, total: Array, count: int, out: Array | None = None) -> Array:
        """MEAN's one division (integers divide into float64)."""
        ...

    def round_inward(self, narrow: Array, exact: Array, limit: float, inside: float) -> None:
        """Where ``|exact| <= limit`` and ``narrow`` (``exact`` rounded to its narrower dtype)
        lies beyond ``±inside``, ``narrow`` takes ``±inside`` (wire compression's shares,
        ``compression.compress``)."""
        ...

    def concatenate(self, arrays: Sequence[Array], axis: int) -> Array: ...

    def fuse(self, arrays: Sequence[Array]) -> Array:
        """A new 1-D buffer: ``arrays`` (one dtype, one device) flattened, one after another
        (a batch's bucket: one pass, or one kernel launch)."""
        ...

    def split(self, buffer: Array, shapes: Sequence[tuple[int, ...]]) -> list[Array]:
        """Views of the consecutive pieces of the 1-D ``buffer``, of ``shapes``."""
        ...

    def contiguous(self, x: Array) -> bool: ...

    def writable(self, x: Array) -> bool: ...

    def misplaced(self, x: Array) -> str | None:
        """Why ``x`` cannot take a result here (``"is on GPU 1, but ..."``: a backend whose
        arrays live on one device), or None where it can."""
        ...

    def extent(self, x: Array) -> tuple[int, int, int]:
        """``(device, first byte address, end address)``: for overlap checks."""
        ...


def form(view: np.ndarray) -> tuple:
    """What a kept result must still be to be handed out again: its shape, strides, dtype and
    writability, which its holder may set in place (``collectives.algorithms.reuse``)."""
    return view.shape, view.strides, view.dtype, view.flags.writeable


def kind_name(x: Any) -> str:
    """``x``'s type as its library spells it: ``numpy.ndarray``, ``torch.Tensor``."""
    return f"{library_of(x)}.{type(x).__qualname__}"


def library_of(x: Any) -> str:
    """The library ``x``'s type comes from (``numpy`` for an array and a NumPy scalar alike,
    ``torch`` for a tensor and a parameter)."""
    return type(x).__module__.split(".")[0]


def plain_ndarray(x: np.ndarray, argument: str) -> np.ndarray:
    """A NumPy subclass (``np.matrix``, ``np.memmap``, record arrays) as the plain array a
    collective reduces, sharing its memory; a masked array raises, since a collective would
    reduce its masked entries and drop the mask without a word."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{argument} is a numpy.ma.MaskedArray: a collective reduces every "
                        "element and would drop the mask; pass "
                        f"{argument}.filled(value) with the value a masked entry should count "
                        f"as (0 for a sum), or np.asarray({argument}) to reduce the values "
                        "underneath the mask as well")
    return x.view(np.ndarray)


class NumpyArrays:
    """The array backend for NumPy arrays (host memory)."""

    name = "numpy"
    xp = np

    def __init__(self) -> None:
        self.pool = ResultPool()

    def owns(self, x: object) -> bool:
        return isinstance(x, np.ndarray)

    def dtype_of(self, x) -> np.dtype:
        return x.dtype

    def alone_bytes(self, x) -> int:
        return HOST_ALONE_BYTES  # (host memory: a copy costs about what a small call does)

    def empty(self, shape, dtype, like=None):
        return np.empty(shape, dtype)

    def result(self, shape, dtype, like=None):
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        owner = self.pool.take(count * dtype.itemsize)
        return owner.view(dtype).reshape(shape)

    def flat(self, x):
        if x.flags.c_contiguous:
            return x if x.ndim == 1 else x.reshape(-1)
        return np.ascontiguousarray(x).reshape(-1)

    def copy(self, dst, src) -> None:
        if dst.dtype != getattr(src, "dtype", None):  # a cast (wire compression's compiled)
            kernels.cast_into(dst, src)
            return
        dst[...] = src  # (cheaper than np.copyto's argument handling for small copies)

    def combine(self, op, dst, srcs) -> None:
        kernels.combine_into(op, dst, dst, srcs)  # one pass over all sources (kernels.py)

    def combine_into(self, op, dst, first, srcs) -> None:
        kernels.combine_into(op, dst, first, srcs)

    def divide(self, total, count, out=None):
        return np.true_divide(total, count, out=out, casting="unsafe")

    def round_inward(self, narrow, exact, limit, inside) -> None:
        if not narrow.size or (narrow.max() <= inside and narrow.min() >= -inside):
            return  # (two reads of the narrow array: the usual case ends here)
        np.clip(narrow, -inside, inside, out=narrow, where=np.abs(exact) <= limit)

    def concatenate(self, arrays, axis):
        arrays = list(arrays)
        if axis == 0 and arrays and all(a.ndim == 1 and a.dtype == arrays[0].dtype
                                        for a in arrays):
            # (a batch's bucket, made every step: from the pool, so its pages stay mapped)
            out = self.result((sum(a.shape[0] for a in arrays),), arrays[0].dtype)
            return np.concatenate(arrays, out=out)
        return np.concatenate(arrays, axis=axis)

    def fuse(self, arrays, out=None, views=None):
        """A bucket of ``arrays`` (``out``: a kept bucket to fill; its ``views`` are not
        needed: one ``concatenate`` fills it)."""
        arrays = list(arrays)
        dtype = arrays[0].dtype if arrays else None
        if dtype is not None and all(a.dtype == dtype for a in arrays):
            # NumPy flattens each itself (axis=None, C order, as ``flat``): no view per tensor
            if out is None:
                out = self.result((sum(a.size for a in arrays),), dtype)
            return np.concatenate(arrays, axis=None, out=out)
        if out is not None:
            return np.concatenate([self.flat(a) for a in arrays], out=out)
        return self.concatenate([self.flat(a) for a in arrays], 0)

    # --- buckets kept from call to call (collectives.algorithms.reuse) ----------------------

    @staticmethod
    def address(x) -> int:
        return x.__array_interface__["data"][0]

    def keep(self, bucket, views) -> Any:
        """The views' forms (``form``), where ``bucket`` can be kept: a view of an owner from
        ``result`` (so that every array on its memory refers to that owner); None where it
        owns its memory."""
        if bucket.base is None or bucket.base.base is not None:
            return None
        return tuple(map(form, views))

    def unshared(self, bucket, views, record) -> bool:
        """Whether only the bucket and its kept views refer to their memory: the owner's
        holders are exactly those (a result kept, a view, reshape or DLPack export of one, a
        ``memoryview``: each one more), nothing but the keeper holds a view, and each view
        has the form it was handed out in (a caller may set a result's ``shape`` or make it
        read-only, then drop it)."""
        owner = bucket.base
        # (the holders: this frame's ``owner``, the bucket, each view)
        return (held_by_one(views) and self.pool.holders(owner) == 2 + len(views)
                and list(map(form, views)) == list(record))

    def split(self, buffer, shapes):
        return split_by_slicing(buffer, shapes)

    def contiguous(self, x) -> bool:
        return x.flags.c_contiguous

    def writable(self, x) -> bool:
        return x.flags.writeable

    def misplaced(self, x) -> str | None:
        return None  # host memory: one place

    def extent(self, x) -> tuple[int, int, int]:
        lo, hi = byte_bounds(x)
        return 0, lo, hi


NUMPY = NumpyArrays()


def split_by_slicing(buffer: Any, shapes: Sequence[tuple[int, ...]]) -> list:
    """``ArrayBackend.split`` for libraries whose slices are views: one slice (and reshape,
    beyond 1-D) per shape."""
    views, offset = [], 0
    for shape in shapes:
        count = 1
        for d in shape:
            count *= d
        view = buffer[offset:offset + count]
        views.append(view if len(shape) == 1 else view.reshape(shape))
        offset += count
    return views
