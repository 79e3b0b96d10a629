"""The multi-device batch: many tensors, one array per device each, all-reduced at once and
packed so that many small tensors cost few collectives (TensorFlow's ``batch_reduce`` with
its packing knobs, Horovod's fusion by default).

Each pack (a fused bucket, or a tensor alone) is one multi-device ``all_reduce``
(``multi_device``), on the device of its arrays: a device's arrays must all be on it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from ..algorithms.fusion import DEFAULT_BUCKET_BYTES
from ..algorithms.reuse import BucketKeeper, keeper_in
from ..arrays import NUMPY
from ..compression import for_batch
from ..foreign_calls import accepts_foreign_values
from ..hints import ArrayT, BatchSpec, Compression, Op
from ..registry import backend_for_arrays
from ..runtime.execute.device_calls import check_batch_devices
from ..runtime.validate import Groups, check_groups, check_op, check_shards
from ..runtime.work import Work
from .multi_device import all_reduce
from .multi_device_parts import backend_first, prepare_batch

__all__ = ["batch_all_reduce"]


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
        check_groups(groups)
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
    if arrays is not NUMPY:  # (NumPy's arrays are all of one host: nothing to look at)
        check_batch_devices(arrays, per_device)
    batch = start_batch(per_device, parts, reduce_pack, arrays=arrays, validated=True,
                        keeper=_bucket_keeper(arrays))
    return batch.finish(batch.pending)


_KEEPERS = threading.local()  # each thread's keepers of fused buckets, by array library


def _bucket_keeper(arrays: Any) -> BucketKeeper:
    """The calling thread's keeper of multi-device batches' buckets in ``arrays``' library
    (``algorithms/reuse.py``)."""
    return keeper_in(_KEEPERS.__dict__.setdefault("by_library", {}), arrays)
