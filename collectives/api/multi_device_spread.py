"""The multi-device collectives that spread data: broadcast copies one array to every
device, all-gather concatenates every device's array on every device, reduce-scatter reduces
and leaves each device one block. Validated and run as in ``multi_device``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, cast, overload

import numpy as np

from ..algorithms.schedule import Collective
from ..arrays import unsafe_outputs
from ..foreign import accepts_foreign_values
from ..hints import Algorithm, ArrayT, Op
from ..ops import ReduceOp, result_dtype
from ..registry import backend_for_arrays
from ..runtime.execute import DeviceBackend, run_multi_device
from ..runtime.validate import as_array, check_communicable, check_devices, check_out
from ..runtime.work import Work
from .multi_device_parts import backend_first, deliver, outputs, plan, prepare, work_buffers

__all__ = ["all_gather", "broadcast", "reduce_scatter"]


@overload
def broadcast(value: ArrayT, devices: int | Sequence[Any], algorithm: Algorithm = ..., *,
              out: Sequence[ArrayT] | None = ..., shards: int = ...,
              async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def broadcast(value: ArrayT, devices: int | Sequence[Any], algorithm: Algorithm = ..., *,
              out: Sequence[ArrayT] | None = ..., shards: int = ...,
              async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def broadcast(value: ArrayT, devices: int | Sequence[Any], algorithm: Algorithm = "auto", *,
              out: Sequence[ArrayT] | None = None, shards: int = 0,
              async_op: bool = False) -> list[ArrayT]:
    """Copy ``value`` to every device.

    Parameters
    ----------
    value
        The array to copy.
    devices
        How many devices, or a list of arrays (one per device) to place the copies beside.
    algorithm
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"rechd"``,
        ``"tree"``, ``"shuffle"``, a TensorFlow name (``"xring"``, ``"pscpu"``, ``"nccl"``,
        ...), a two-level ``"A/B"`` over ``groups``, or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count).
    out
        One array per device for the copies.
    shards
        Ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        One copy per device.

    Raises
    ------
    TypeError
        ``value`` is not an array, or holds Python objects.
    ValueError
        A bad ``devices``, ``algorithm`` or ``out``; before any data moves.
    """
    value = as_array(value, "value")
    n = check_devices(devices)
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    check_communicable(dtype, "value")
    backend = cast(DeviceBackend, backend_for_arrays([value]))
    arrays = backend.arrays
    schedule = plan(backend, Collective.BROADCAST, algorithm, n, shape, dtype, shards)
    results = outputs(arrays, out, [value] * n, shape, dtype)
    work = work_buffers(arrays, results, [value], shape, dtype, out is not None)
    run_multi_device(schedule, [arrays.flat(value)] + [None] * (n - 1),
                     [w.reshape(-1) for w in work], ReduceOp.SUM, backend)
    deliver(arrays, None, work, results, n)
    return results


@overload
def all_gather(values: Sequence[ArrayT], axis: int = ..., algorithm: Algorithm = ..., *,
               out: Sequence[ArrayT] | None = ..., async_op: Literal[False] = ...
               ) -> list[ArrayT]: ...
@overload
def all_gather(values: Sequence[ArrayT], axis: int = ..., algorithm: Algorithm = ..., *,
               out: Sequence[ArrayT] | None = ..., async_op: Literal[True]
               ) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def all_gather(values: Sequence[ArrayT], axis: int = 0, algorithm: Algorithm = "auto", *,
               out: Sequence[ArrayT] | None = None, async_op: bool = False) -> list[ArrayT]:
    """Every device gets the concatenation of all devices' arrays along ``axis``.

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype.
    axis
        The axis to concatenate along.
    algorithm
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"rechd"``,
        ``"tree"``, ``"shuffle"``, a TensorFlow name (``"xring"``, ``"pscpu"``, ``"nccl"``,
        ...), a two-level ``"A/B"`` over ``groups``, or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count).
    out
        One array per device for the results.
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        One concatenation per device, in device order.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays.
    ValueError
        Arrays of different shapes or dtypes, an ``axis`` out of range, an unknown
        ``algorithm`` or an ``out`` that does not fit; before any data moves.
    """
    values, shape, dtype, _ = prepare(values, None)
    n = len(values)
    base = shape if shape else (1,)
    if not -len(base) <= axis < len(base):
        raise ValueError(f"axis={axis} is out of range for arrays of {len(shape)} dimensions")
    axis %= len(base)
    gathered_shape = list(base)
    gathered_shape[axis] *= n
    backend = cast(DeviceBackend, backend_for_arrays(values))
    arrays = backend.arrays
    results = outputs(arrays, out, values, tuple(gathered_shape), dtype)
    schedule = plan(backend, Collective.ALL_GATHER, algorithm, n, shape, dtype)
    size = math.prod(shape)
    # Along the leading axis the rank-major buffer already is the result: gather in place.
    leading = all(d == 1 for d in base[:axis]) and not unsafe_outputs(arrays, values, results)
    stacked = ([r.reshape(-1) for r in results] if leading
               else [arrays.empty((n * size,), dtype, like=v) for v in values])
    run_multi_device(schedule, [arrays.flat(v) for v in values], stacked, ReduceOp.SUM, backend,
                     granule=size if size else 1, input_offsets=[p * size for p in range(n)])
    if not leading:
        for r, s in zip(results, stacked):
            arrays.copy(r, arrays.concatenate(list(s.reshape((n, *base))), axis))
    return results


@overload
def reduce_scatter(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
                   out: Sequence[ArrayT] | None = ..., shards: int = ...,
                   async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def reduce_scatter(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
                   out: Sequence[ArrayT] | None = ..., shards: int = ...,
                   async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def reduce_scatter(values: Sequence[ArrayT], op: Op = "sum", algorithm: Algorithm = "auto", *,
                   out: Sequence[ArrayT] | None = None, shards: int = 0,
                   async_op: bool = False) -> list[ArrayT]:
    """Reduce, then device ``i`` keeps block ``i`` of axis 0.

    Block ``i`` is rows ``floor(i R / n)`` to ``floor((i + 1) R / n)`` of the ``R`` rows, so
    the blocks differ by at most one row when ``n`` does not divide ``R``.

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype, at least one-dimensional.
    op
        ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
    algorithm
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"rechd"``,
        ``"tree"``, ``"shuffle"``, a TensorFlow name (``"xring"``, ``"pscpu"``, ``"nccl"``,
        ...), a two-level ``"A/B"`` over ``groups``, or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count).
    out
        One array per device for its block.
    shards
        Ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        Block ``i`` of the reduction on device ``i``.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays, or their dtype cannot take ``op``.
    ValueError
        Arrays of different shapes or dtypes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit; before any data moves.
    """
    values, shape, dtype, op = prepare(values, op)
    if not shape:
        raise ValueError("values are scalars; reduce_scatter splits axis 0, so pass arrays")
    n = len(values)
    backend = cast(DeviceBackend, backend_for_arrays(values))
    arrays = backend.arrays
    schedule = plan(backend, Collective.REDUCE_SCATTER, algorithm, n, shape, dtype, shards)
    rows, row = shape[0], math.prod(shape[1:])
    final = result_dtype(op, dtype)
    blocks = [(i * rows // n, (i + 1) * rows // n) for i in range(n)]
    if out is not None:
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
            raise TypeError(f"out must be a list of {n} arrays, one per device")
        if len(out) != n:
            raise ValueError(f"out has {len(out)} arrays for {n} devices; pass one per device")
        for i, (o, (lo, hi)) in enumerate(zip(out, blocks)):
            check_out(o, (hi - lo, *shape[1:]), final, f"out[{i}]", arrays)
    work = [arrays.result(shape, dtype, like=v) for v in values]
    run_multi_device(schedule, [arrays.flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, granule=row if row else 1)
    results = list(out) if out is not None else [
        arrays.result((hi - lo, *shape[1:]), final, like=v) for v, (lo, hi) in zip(values, blocks)]
    deliver(arrays, op, [w[lo:hi] for w, (lo, hi) in zip(work, blocks)], results, n)
    return results
