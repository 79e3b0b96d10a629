"""The multi-device collectives that spread data: broadcast copies one array to every
device, all-gather concatenates every device's array on every device, reduce-scatter reduces
and leaves each device one block. Validated here, then run by the runtime's forms
(``collectives.runtime.execute.device_calls``), as in ``multi_device``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast, overload

import numpy as np

from ..foreign_calls import accepts_foreign_values
from ..hints import Algorithm, ArrayT, Op
from ..registry import backend_for_arrays
from ..runtime.execute import DeviceBackend
from ..runtime.execute.device_calls import (
    run_all_gather,
    run_broadcast,
    run_reduce_scatter,
)
from ..runtime.validate import (
    Groups,
    as_array,
    check_communicable,
    check_devices,
    check_rows,
    gather_axis,
)
from ..runtime.work import Work
from .multi_device_parts import backend_first, prepare

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
        ``"auto"`` (the cost model chooses), ``"one_device"``, ``"ring"``, ``"tree"``,
        ``"shuffle"`` (recursive halving-doubling has no broadcast), a TensorFlow name
        (``"xring"``, ``"pscpu"``, ``"nccl"``, ...), or a spec (``("xring", 2)``,
        ``"pscpu:2k:xring"``: the range by element count). (Two-level names have no
        broadcast.)
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
    return run_broadcast(backend, value, n, shape, dtype, algorithm, out=out, shards=shards)


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
        ...), or a spec (``("xring", 2)``, ``"pscpu:2k:xring"``: the range by element
        count). (Two-level names have no all-gather.)
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
        ``values`` is not a list of arrays of one dtype.
    ValueError
        Arrays of different shapes, an ``axis`` out of range, an unknown
        ``algorithm`` or an ``out`` that does not fit; before any data moves.
    """
    values, shape, dtype, _ = prepare(values, None, reducing=False)
    axis = gather_axis(axis, shape)
    backend = cast(DeviceBackend, backend_for_arrays(values))
    return run_all_gather(backend, values, shape, dtype, axis, algorithm, out=out)


@overload
def reduce_scatter(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
                   out: Sequence[ArrayT] | None = ..., shards: int = ..., groups: Groups = ...,
                   async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def reduce_scatter(values: Sequence[ArrayT], op: Op = ..., algorithm: Algorithm = ..., *,
                   out: Sequence[ArrayT] | None = ..., shards: int = ..., groups: Groups = ...,
                   async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def reduce_scatter(values: Sequence[ArrayT], op: Op = "sum", algorithm: Algorithm = "auto", *,
                   out: Sequence[ArrayT] | None = None, shards: int = 0, groups: Groups = None,
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
    groups
        The groups of a two-level ``"A/B"``: a group size, or a partition of the devices.
    async_op
        Return a `Work` handle whose ``wait()`` returns the result(s) instead.

    Returns
    -------
    list
        Block ``i`` of the reduction on device ``i``.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays of one dtype, or their dtype cannot take
        ``op``.
    ValueError
        Arrays of different shapes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit; before any data moves.
    """
    values, shape, dtype, op = prepare(values, op)
    check_rows(shape)
    backend = cast(DeviceBackend, backend_for_arrays(values))
    return run_reduce_scatter(backend, values, shape, dtype, op, algorithm, out=out,
                              shards=shards, groups=groups)
