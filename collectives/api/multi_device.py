"""The multi-device API: one process holds one array per device (TensorFlow's PerReplica).

Each function validates everything first, picks the algorithm, fetches its schedule and runs
it over the backend that owns the arrays (NumPy arrays: the embedded backend; CuPy arrays: a
GPU backend). Results come back one per device, on the device of its input; inputs are never
modified unless ``out`` names them. An ``out`` that shares memory with another ``out`` or with
an input (other than being exactly that device's input, which means in place) is filled from
buffers of the library's own, so aliasing never gives a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, cast, overload

from ..compression import requested
from ..foreign_calls import accepts_foreign_values
from ..hints import Algorithm, ArrayT, Compression, Op
from ..registry import backend_for_arrays
from ..runtime.execute import DeviceBackend
from ..runtime.execute.device_calls import run_all_reduce, run_reduce
from ..runtime.validate import (
    Groups,
    check_flag,
    check_function,
    check_root,
)
from ..runtime.work import Work
from .compressed import multi_device_all_reduce
from .multi_device_parts import (
    backend_first,
    pick_algorithm,
    prepare,
)

__all__ = ["all_reduce", "pick_algorithm", "reduce"]

Accumulate = Callable[[list[Any]], Any]  # accumulation_fn: the arrays of all devices -> their reduction

ACCUMULATION = "a function of the devices' arrays (a list) returning their reduction, or None"


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
        ``values`` is not a list of arrays of one dtype, or their dtype cannot take
        ``op``.
    ValueError
        Arrays of different shapes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit, a ``compression`` the call cannot take (another op,
        another dtype, ``accumulation_fn``); before any data moves.
    """
    check_flag(shared_result, "shared_result")
    if accumulation_fn is not None:
        check_function(accumulation_fn, "accumulation_fn", ACCUMULATION)
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
        ``values`` is not a list of arrays of one dtype, or their dtype cannot take
        ``op``.
    ValueError
        Arrays of different shapes, an unknown ``op`` or ``algorithm``, or an
        ``out`` that does not fit; before any data moves.
    """
    if accumulation_fn is not None:  # (as all_reduce checks it: else it raised when called)
        check_function(accumulation_fn, "accumulation_fn", ACCUMULATION)
    values, shape, dtype, op = prepare(values, op)
    root = check_root(root, len(values))
    backend = cast(DeviceBackend, backend_for_arrays(values))
    return run_reduce(backend, values, shape, dtype, op, root, algorithm, out=out, shards=shards,
                      groups=groups, accumulation_fn=accumulation_fn)
