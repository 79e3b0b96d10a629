"""The checks of a rank's tensor list, shared by ``batch_all_reduce`` and ``buckets``.

A list is taken only as a sequence of arrays of one library (NumPy with JAX, say, is refused
with the rule: one batch, one library), none of them requiring grad (named by its index, with
the fix). ``batch_tag`` is what the list's buckets carry in their signatures
(``CallRunner.part_of``): the list's description and digest, with its buckets', so that
ranks that pass different lists, or cut them into other buckets, fail with
``CollectiveMismatchError`` on every call, not only the first;
an empty list makes its call too (``agree_on_empty``).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..foreign import has_attribute
from ..runtime.calls import BatchTag
from ..runtime.work import BatchWork


def checked_list(xs: Any, argument: str, *, read: bool = True) -> list:
    """``xs`` as a list of arrays of one library, or raise naming the item and the fix
    (``read`` False: only their shapes and dtypes are used, so a tensor that requires grad,
    a model's parameter, will do)."""
    if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence):
        raise TypeError(f"{argument} must be a list of arrays, not {type(xs).__name__}")
    items = list(xs)
    kinds = set(map(type, items))
    if kinds <= {np.ndarray}:  # (the common case, checked in microseconds)
        return items
    kind = next(iter(kinds)) if len(kinds) == 1 else None
    if kind is not None and _array_type(kind) and not (
            read and _tracks_grad(kind) and any(x.requires_grad or _lazy(x) for x in items)):
        return items  # (arrays of one type, none requiring grad: nothing to name)
    first = None
    for k, x in enumerate(items):
        if not (has_attribute(x, "shape") and has_attribute(x, "dtype")):
            what = "None" if x is None else f"a {_name(x)}"
            raise TypeError(f"{argument}[{k}] is {what}, not an array; pass a list of arrays "
                            "(NumPy, or one other library's)")
        if read and getattr(x, "requires_grad", False):
            raise TypeError(f"{argument}[{k}] requires grad; pass {argument}[{k}].detach()")
        if read and _lazy(x):  # (refused as a single call's x is: a fused batch's copy read it)
            what, fix = ("conjugate", "resolve_conj") if x.is_conj() else ("negation",
                                                                            "resolve_neg")
            raise TypeError(f"{argument}[{k}] is a lazy {what} (its memory holds the values "
                            f"before it); pass {argument}[{k}].{fix}()")
        if first is None:
            first = x
        elif _library(x) != _library(first):
            raise TypeError(f"{argument}[{k}] is a {_name(x)} but {argument}[0] is a "
                            f"{_name(first)}; one batch takes arrays of one library: convert "
                            "them to one first (np.asarray, torch.as_tensor, jnp.asarray)")
    return items


@functools.cache
def _array_type(kind: Any) -> bool:
    """Whether instances of ``kind`` are arrays: ``shape`` and ``dtype`` on the class."""
    return hasattr(kind, "shape") and hasattr(kind, "dtype")


@functools.cache
def _tracks_grad(kind: Any) -> bool:
    return hasattr(kind, "requires_grad")


def _lazy(x: Any) -> bool:
    """Whether the tensor ``x`` is PyTorch's lazy conjugate or negation: its memory holds the
    values before the conjugate (negation), which a single call refuses to read."""
    is_conj, is_neg = getattr(x, "is_conj", None), getattr(x, "is_neg", None)
    return bool((is_conj is not None and is_conj()) or (is_neg is not None and is_neg()))


def layout_of(arrays: Any, xs: list, argument: str) -> tuple[list, list]:
    """Each array's shape and dtype (``dtypes_of``), or a TypeError naming the first whose
    shape or dtype the library cannot take (a nested tensor has no shape, a quantized one no
    dtype NumPy knows: their own errors named nothing, and a RuntimeError was no refusal)."""
    try:
        return [tuple(x.shape) for x in xs], dtypes_of(arrays, xs)
    except Exception:
        for k, x in enumerate(xs):
            shape_and_dtype(arrays, x, f"{argument}[{k}]")
        raise


def shape_and_dtype(arrays: Any, x: Any, name: str) -> tuple[tuple[int, ...], Any]:
    """``x``'s shape and dtype (``arrays.dtype_of``), or a TypeError naming ``name``."""
    try:
        return tuple(x.shape), arrays.dtype_of(x)
    except Exception as why:  # noqa: BLE001 - each library raises its own kind
        raise TypeError(f"{name} ({_name(x)}, dtype {x.dtype}) has no shape and dtype the "
                        f"library can take: {type(why).__name__}: {why}") from why


def dtypes_of(arrays: Any, xs: list) -> list:
    """Each array's dtype as ``arrays.dtype_of`` gives it, asked once per distinct
    ``(type, dtype)`` (a gradient list has hundreds of tensors and one or two dtypes)."""
    if xs:  # (the common case: one type, one dtype object)
        kind, dtype = xs[0].__class__, xs[0].dtype
        if all(x.__class__ is kind and x.dtype is dtype for x in xs):
            return [arrays.dtype_of(xs[0])] * len(xs)
    seen: dict = {}
    out = []
    try:
        for x in xs:
            key = (type(x), x.dtype)
            dtype = seen.get(key)
            if dtype is None:
                dtype = seen[key] = arrays.dtype_of(x)
            out.append(dtype)
    except TypeError:  # (a dtype that is no dict key: each asked on its own)
        return [arrays.dtype_of(x) for x in xs]
    return out


def _library(x: Any) -> str:
    return type(x).__module__.partition(".")[0]


def _name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__name__}"


def brief(layout: tuple) -> str:
    """A tensor list for an error message: ``[float32(3, 5), ...]``, cut short."""
    items = [f"{dtype}{tuple(shape)}" for shape, dtype in layout]
    return "[" + ", ".join(items[:6]) + (f", ... {len(items)} in all" if len(items) > 6 else "") + "]"


@functools.lru_cache(maxsize=256)
def batch_tag(layout: tuple, buckets: tuple = (), ahead: bool = False) -> BatchTag:
    """What every bucket of a list of ``layout`` (``((shape, dtype), ...)``) cut into
    ``buckets`` (``bucket_plan``) carries in its signature: the list's brief description and
    bucket count (for the mismatch error) and a digest of both (lists that differ past the
    description's cut differ here, and so do lists cut into other buckets: a rank's bucket
    would otherwise pair with another bucket of its peer's). ``ahead``: every bucket is
    issued before any is waited on (asynchronous, or buckets), which the tag says too: ranks
    that issued different numbers of calls break when a mismatch stops them."""
    digest = zlib.crc32(repr(([(tuple(s), str(d)) for s, d in layout], buckets)).encode())
    count = f" in {len(buckets)} bucket{'' if len(buckets) == 1 else 's'}" if buckets else ""
    return BatchTag(f"{brief(layout)}{count} #{digest:08x}", len(buckets) if ahead else 1)


def bucket_plan(order: Sequence[tuple[Any, int]]) -> tuple[tuple[int, ...], ...]:
    """The tensors of each bucket, in the order the buckets are issued (``order``: each
    bucket as a part of a batch's plan and the index of its pack there)."""
    return tuple(tuple(part.indices[m] for m in part.plan.packs[j].indices) for part, j in order)


def own_copy(arrays: Any, result: Any) -> Any:
    """``result`` (a view of its bucket) as an array of its own, in ``arrays``' library."""
    mine = arrays.empty(tuple(result.shape), arrays.dtype_of(result), like=result)
    arrays.copy(mine, result)
    return mine


def agree_on_empty(comm: Any, op: Any, timeout: float | None, async_op: bool) -> Any:
    """An empty list's call (``[]``, or a handle of it): a zero-size all-reduce carrying the
    empty list's tag. Nothing moves, but the ranks agree on it: where a peer's list is not
    empty, every rank raises ``CollectiveMismatchError`` naming the lists, rather than this
    rank returning at once and its peers waiting out their timeout."""
    nothing = comm.arrays.empty((0,), np.float32)
    with comm.calls.part_of(batch_tag(())):
        done = comm.all_reduce(nothing, op, timeout=timeout, async_op=async_op)
    return BatchWork([done], lambda _: [], "batch_all_reduce of 0 tensors") if async_op else []


def unreadable(edge: Any, xs: Sequence, names: Sequence[str], exc: Exception) -> Exception:
    """The error for a foreign list whose bucket could not be packed or read (PyTorch's sparse,
    nested or conjugate-bit tensors pass the cheap checks, and fail in packing or DLPack): the
    first tensor ``edge.adopt`` refuses, named (``names[k]``: what the caller calls ``xs[k]``),
    else ``exc`` itself. Looked for only once packing failed: a check of every tensor on every
    call would cost the hot gradient list (161 tensors) about 60 us."""
    for x, name in zip(xs, names, strict=True):
        try:
            edge.adopt(x, name)
        except Exception as why:  # noqa: BLE001 - each library raises its own kind
            error = why if isinstance(why, TypeError) else TypeError(
                f"{name} cannot be read as an array: {type(why).__name__}: {why}")
            error.__cause__ = exc
            return error
    return exc
