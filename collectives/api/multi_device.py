"""The multi-device API: one process holds one array per device (TensorFlow's PerReplica).

Each function validates everything first, picks the algorithm, fetches its schedule and runs
it over the backend that owns the arrays (NumPy arrays: the embedded backend; CuPy arrays: a
GPU backend). Results come back one per device, on the device of its input; inputs are never
modified unless ``out`` names them. An ``out`` that shares memory with another ``out`` or with
an input (other than being exactly that device's input, which means in place) is filled from
buffers of the library's own, so aliasing never gives a wrong answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast, overload

import numpy as np

from ..algorithms.fusion import DEFAULT_BUCKET_BYTES
from ..algorithms.reuse import BucketKeeper, keeper_in
from ..arrays import NUMPY
from ..compression import for_batch, requested
from ..foreign_calls import accepts_foreign_values
from ..hints import Algorithm, ArrayT, BatchSpec, Compression, Op
from ..registry import backend_for_arrays
from ..runtime.execute import DeviceBackend
from ..runtime.execute.device_calls import run_all_reduce, run_reduce
from ..runtime.validate import (
    Groups,
    check_op,
    check_root,
    check_shards,
)
from ..runtime.work import Work
from .compressed import multi_device_all_reduce
from .multi_device_parts import (
    backend_first,
    pick_algorithm,
    prepare,
    prepare_batch,
)

__all__ = ["all_reduce", "batch_all_reduce", "pick_algorithm", "reduce"]

Accumulate = Callable[[list[Any]], Any]  # accumulation_fn: the arrays of all devices -> their reduction


@overload
def all_reduce(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
               out: Sequence[ArrayT] | None = ..., shards: int = ..., groups: Groups = ...,
               accumulation_fn: Accumulate | None = ..., shared_result: bool = ...,
               compression: Compression = ..., async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def all_reduce(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
               out: Sequence[ArrayT] | None = ..., shards: int = ..., groups: Groups = ...,
               accumulation_fn: Accumulate | None = ..., shared_result: bool = ...,
               compression: Compression = ..., async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def all_reduce(values: Sequence[ArrayT], op: Op = "sum", algorithm: Algorithm = "auto", *,
               out: Sequence[ArrayT] | None = None, shards: int = 0, groups: Groups = None,
               accumulation_fn: Accumulate | None = None, shared_result: bool = False,
               compression: Compression = None, async_op: bool = False) -> list[ArrayT]:
    """Reduce the arrays of all devices; every device gets the result (bitwise identical).

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype.
    op
        ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
    algorithm
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"rechd"``,
        ``"tree"``, ``"shuffle"``, a TensorFlow name (``"xring"``, ``"pscpu"``, ``"nccl"``,
        ...), a two-level ``"A/B"`` over ``groups``, or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count).
    out
        One array per device for the results (a device's own input: in place).
    shards
        Ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    groups
        The groups of a two-level ``"A/B"``: a group size, or a partition of the devices.
    accumulation_fn
        ``accumulation_fn(list_of_arrays) -> array`` replaces the op's kernel.
    shared_result
        Where the devices share memory (logical CPU devices), compute the result once and
        return it as read-only views, one per device (no per-device copies).
    compression
        ``"fp16"`` or ``"bf16"``: all-reduce float32/float64 SUM and MEAN in that narrower
        float and cast the result back (see `collectives.compression`); None: as they are.
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        One result per device, of the inputs' array type (integer MEAN: float64 arrays).

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays, or their dtype cannot take ``op``.
    ValueError
        Arrays of different shapes or dtypes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit, a ``compression`` the call cannot take (another op,
        another dtype, ``accumulation_fn``); before any data moves.
    """
    if requested(compression):
        return multi_device_all_reduce(all_reduce, values, op, algorithm, compression, out=out,
                                       shared_result=shared_result, shards=shards,
                                       groups=groups, accumulation_fn=accumulation_fn)
    values, shape, dtype, op = prepare(values, op)
    n = len(values)
    backend = cast(DeviceBackend, backend_for_arrays(values))
    if shared_result:
        if out is not None:
            raise ValueError("shared_result=True returns views of one new buffer; it takes "
                             "no out=")
        if not backend.shares_memory:
            raise ValueError(f"shared_result=True needs devices that share memory; "
                             f"{type(backend).__name__} devices do not")
        result = reduce(values, op, 0, algorithm, shards=shards, groups=groups,
                        accumulation_fn=accumulation_fn)
        view = result.view()
        view.flags.writeable = False
        return [view] * n
    return run_all_reduce(backend, values, shape, dtype, op, algorithm, out=out, shards=shards,
                          groups=groups, accumulation_fn=accumulation_fn)


@overload
def reduce(values: Sequence[ArrayT], op: Op = ..., root: int = ..., algorithm: Algorithm = ...,
           *, out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
           accumulation_fn: Accumulate | None = ..., async_op: Literal[False] = ...) -> ArrayT: ...
@overload
def reduce(values: Sequence[ArrayT], op: Op = ..., root: int = ..., algorithm: Algorithm = ...,
           *, out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
           accumulation_fn: Accumulate | None = ..., async_op: Literal[True]) -> Work[ArrayT]: ...
@accepts_foreign_values
@backend_first
def reduce(values: Sequence[ArrayT], op: Op = "sum", root: int = 0, algorithm: Algorithm = "auto",
           *, out: ArrayT | None = None, shards: int = 0, groups: Groups = None,
           accumulation_fn: Accumulate | None = None, async_op: bool = False) -> ArrayT:
    """Reduce the arrays of all devices onto device ``root``.

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype.
    op
        ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
    root
        The device that gets the result.
    algorithm
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"rechd"``,
        ``"tree"``, ``"shuffle"``, a TensorFlow name (``"xring"``, ``"pscpu"``, ``"nccl"``,
        ...), a two-level ``"A/B"`` over ``groups``, or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count).
    out
        The array for the result (``values[root]`` itself: in place).
    shards
        Ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    groups
        The groups of a two-level ``"A/B"``: a group size, or a partition of the devices.
    accumulation_fn
        ``accumulation_fn(list_of_arrays) -> array`` replaces the op's kernel.
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    ArrayT
        The result, on device ``root``.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays, or their dtype cannot take ``op``.
    ValueError
        Arrays of different shapes or dtypes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit; before any data moves.
    """
    values, shape, dtype, op = prepare(values, op)
    root = check_root(root, len(values))
    backend = cast(DeviceBackend, backend_for_arrays(values))
    return run_reduce(backend, values, shape, dtype, op, root, algorithm, out=out, shards=shards,
                      groups=groups, accumulation_fn=accumulation_fn)


@overload
def batch_all_reduce(value_lists: Sequence[Sequence[ArrayT]], op: Op = ...,
                     algorithm: BatchSpec = ..., *, num_packs: int = ...,
                     agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                     bytes_per_pack: int | None = ..., shards: int = ..., groups: Groups = ...,
                     compression: Compression = ..., bucket_bytes: int = ...,
                     async_op: Literal[False] = ...) -> list[list[ArrayT]]: ...
@overload
def batch_all_reduce(value_lists: Sequence[Sequence[ArrayT]], op: Op = ...,
                     algorithm: BatchSpec = ..., *, num_packs: int = ...,
                     agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                     bytes_per_pack: int | None = ..., shards: int = ..., groups: Groups = ...,
                     compression: Compression = ..., bucket_bytes: int = ...,
                     async_op: Literal[True]) -> Work[list[list[ArrayT]]]: ...
@accepts_foreign_values
@backend_first
def batch_all_reduce(value_lists: Sequence[Sequence[ArrayT]], op: Op = "sum",
                     algorithm: BatchSpec = "auto", *, num_packs: int = 0,
                     agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10,
                     bytes_per_pack: int | None = None, shards: int = 0, groups: Groups = None,
                     compression: Compression = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     async_op: bool = False) -> list[list[ArrayT]]:
    """All-reduce many tensors at once, packed so that many small tensors cost few
    collectives.

    Parameters
    ----------
    value_lists
        ``value_lists[k]`` holds tensor ``k`` on every device.
    op
        ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
    algorithm
        Any all-reduce spec: a name, ``(algorithm, shards, limit)`` tuples with limits in
        elements, or a string such as ``"pscpu:2k:pscpu#2:64k:xring"``.
    num_packs
        Pack the tensors into this many buffers (0: no such packing).
    agg_small_grads_max_bytes
        Aggregate tensors of at most this many bytes (0: no aggregation).
    agg_small_grads_max_group
        At most this many tensors per aggregate.
    bytes_per_pack
        Pack into buffers of about this many bytes (None: no such packing).
    shards
        Ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    groups
        The groups of a two-level ``"A/B"``: a group size, or a partition of the devices.
    compression
        ``"fp16"`` or ``"bf16"`` compresses the float32 and float64 packs (see `all_reduce`);
        packs of other dtypes travel as they are.
    bucket_bytes
        With none of the knobs above: fuse each dtype's tensors, in order, into buckets of at
        most this many bytes (64 MiB by default, Horovod's fusion threshold; DDP uses 25 MiB),
        a tensor of this size or more alone and not copied; 0: every tensor alone. Fused
        results are views of their bucket (on CuPy arrays, kept for the calling thread's
        next call of the same list, which reuses them where nothing refers to them any
        more: ``algorithms/reuse.py``).
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        ``results[k][d]``: tensor ``k`` on device ``d``, in input order with input shapes.

    Raises
    ------
    TypeError
        ``value_lists`` is not a list of lists of arrays.
    ValueError
        Tensors with different device counts, a bad spec or packing knob, a ``compression``
        the op cannot take; before any data moves.
    """
    from ..algorithms.batch import in_place, plan_batch, start_batch

    if isinstance(value_lists, (str, bytes)) or not isinstance(value_lists, Sequence):
        raise TypeError("value_lists must be a list with, per tensor, one array per device")
    knobs = dict(num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                 agg_small_grads_max_group=agg_small_grads_max_group,
                 bytes_per_pack=bytes_per_pack, shards=check_shards(shards),
                 bucket_bytes=bucket_bytes)
    if len(value_lists) == 0:  # nothing to reduce; the arguments are checked all the same
        check_op(op, np.dtype(np.float64))  # (every op takes float64)
        plan_batch([], [], algorithm, **knobs)  # type: ignore[arg-type]
        for_batch(compression, op, [])
        return []
    tensors = prepare_batch(value_lists, op)
    n = len(tensors[0][0])
    for k, (values, *_rest) in enumerate(tensors):
        if len(values) != n:
            raise ValueError(f"value_lists[{k}] has {len(values)} devices but value_lists[0] has "
                             f"{n}; every tensor needs one array per device")
    arrays = backend_for_arrays(tensors[0][0]).arrays
    parts = plan_batch([t[1] for t in tensors], [t[2] for t in tensors], algorithm,
                       alone_bytes=arrays.alone_bytes(tensors[0][0][0]),
                       **knobs)  # type: ignore[arg-type]
    for_batch(compression, op, [])  # (a compression the op cannot take: raised before packing)

    def reduce_pack(part, buffers, fresh):
        squeeze = for_batch(compression, op, [buffers[0].dtype])[0]
        return all_reduce(buffers, op, part.spec.algorithm, shards=part.spec.shards,
                          groups=groups, compression=squeeze,
                          out=buffers if in_place(fresh, op, buffers[0].dtype) else None)

    first = tensors[0][0][0]
    owned = type(first) if arrays.owns(first) else None  # (its other arrays: one type check)
    for k, (values, *_rest) in enumerate(tensors):  # (one library: packing trusts it)
        for d, value in enumerate(values):
            if type(value) is owned:
                continue
            if isinstance(value, np.generic) and arrays.owns(np.asarray(value)):
                values[d] = np.asarray(value)  # (a NumPy scalar: a 0-d array)
            elif not arrays.owns(value):
                raise TypeError(f"value_lists[{k}][{d}] is a {type(value).__module__}."
                                f"{type(value).__name__} but value_lists[0][0] is a "
                                f"{type(tensors[0][0][0]).__name__}; one batch takes arrays "
                                "of one library")
    per_device = [[t[0][d] for t in tensors] for d in range(n)]
    if arrays is not NUMPY:  # (device d's arrays are fused there: they must share its device)
        for d, column in enumerate(per_device):
            home = arrays.extent(column[0])[0]
            for k, value in enumerate(column):
                if arrays.extent(value)[0] != home:
                    raise ValueError(f"value_lists[{k}][{d}] is on device "
                                     f"{arrays.extent(value)[0]} but value_lists[0][{d}] on "
                                     f"device {home}; a batch's device {d} is one device: give "
                                     "every tensor's arrays in the same order of devices")
    batch = start_batch(per_device, parts, reduce_pack, arrays=arrays, validated=True,
                        keeper=_bucket_keeper(arrays))
    return batch.finish(batch.pending)


_KEEPERS = threading.local()  # each thread's keepers of fused buckets, by array library


def _bucket_keeper(arrays: Any) -> BucketKeeper:
    """The calling thread's keeper of multi-device batches' buckets in ``arrays``' library
    (``algorithms/reuse.py``)."""
    return keeper_in(_KEEPERS.__dict__.setdefault("by_library", {}), arrays)
