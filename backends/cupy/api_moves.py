"""Broadcast, all-gather and reduce-scatter for CuPy arrays, with NCCL and ``async_op``.

The same choice as ``.api``: NCCL for ``"nccl"`` (and for ``"auto"`` where every
participant has a GPU of its own), the library's algorithms otherwise. Each call is checked
here once; where NCCL does not run it, the runtime's forms
(``collectives.runtime.execute.device_calls``) run the library's algorithms on the checked
pieces, so the core's API never sees the call nor checks its arrays again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.ops import ReduceOp, result_dtype
from collectives.overlap import unsafe_outputs
from collectives.runtime.execute.device_calls import (
    run_all_gather,
    run_broadcast,
    run_reduce_scatter,
)
from collectives.runtime.validate import (
    as_array,
    check_communicable,
    check_devices,
    check_out,
    check_rows,
    gather_axis,
)

from . import group
from .call_parts import deliver, gpu_arrays, handle, library_devices, nccl_request, outputs, prepare, use_nccl
from .devices import own_function


def gpu_ids(devices: Sequence) -> list[int]:
    """``devices`` as GPU ids, each checked (``int()`` took 1.5 as GPU 1, and True as 1)."""
    import cupy

    check_devices(devices)  # (a list, not empty)
    count = cupy.cuda.runtime.getDeviceCount()
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"devices={devices!r} holds {d!r}; pass GPU ids (integers)")
        if not 0 <= d < count:
            raise ValueError(f"devices={devices!r} names GPU {d}; this machine has GPUs "
                             f"0 to {count - 1}")
    return [int(d) for d in devices]


@own_function
def broadcast(value: Any, devices: int | Sequence, algorithm: Any = "auto", *, out: Any = None,
              shards: int = 0, async_op: bool = False) -> Any:
    """``collectives.broadcast`` for a CuPy array. ``devices``: a count (every copy on the
    value's GPU, as logical devices) or a list of GPU ids (one copy on each); ``out``: the
    arrays to fill, wherever they are."""
    arrays = gpu_arrays()
    out_given = out is not None
    value = as_array(value, "value")
    if not arrays.owns(value):
        raise TypeError(f"value is a {type(value).__module__}.{type(value).__name__}; pass a "
                        "CuPy array (or call collectives.broadcast for NumPy arrays)")
    check_communicable(np.dtype(value.dtype), "value")
    if isinstance(devices, (str, bytes)):
        raise TypeError(f"devices={devices!r} is text; pass a count or a list of GPU ids")
    if out is None and not isinstance(devices, (int, np.integer)):
        ids = gpu_ids(devices)
        out = [arrays.empty_on(d, value.shape, value.dtype) for d in ids]
    n = devices if isinstance(devices, (int, np.integer)) else len(devices)
    if out is not None:
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) or len(out) != n:
            raise TypeError(f"out must be a list of {n} CuPy arrays, one per device")
        for i, o in enumerate(out):
            check_out(o, tuple(value.shape), np.dtype(value.dtype), f"out[{i}]", arrays)
    request = nccl_request(algorithm, int(value.size))
    targets = list(out) if out is not None else []
    if (out is None or (request or "").startswith("nccl/")
            or not use_nccl(request, targets, value.dtype, None,
                            argument="out" if out_given else "devices")):
        results = run_broadcast(library_devices(), value, check_devices(n),
                                tuple(value.shape), np.dtype(value.dtype), algorithm, out=out,
                                shards=shards, out_checked=True)
        return handle(results, results, "broadcast", async_op)
    if targets[0].data.ptr != value.data.ptr:
        arrays.order(targets[0].device.id, value.device.id)  # the value's producer first
        arrays.copy(targets[0], value)
    group.broadcast(targets, 0)
    return handle(targets, targets, "broadcast", async_op)


@own_function
def all_gather(values: Sequence, axis: int = 0, algorithm: Any = "auto", *, out: Any = None,
               async_op: bool = False) -> Any:
    """``collectives.all_gather`` for CuPy arrays, with NCCL and ``async_op``."""
    values, shape, dtype, _ = prepare(values, None, reducing=False)
    n = len(values)
    base = shape if shape else (1,)
    request = nccl_request(algorithm, math.prod(shape))
    if ((request or "").startswith("nccl/") or not -len(base) <= axis < len(base)
            or not use_nccl(request, values, dtype, None)):
        results = run_all_gather(library_devices(), values, shape, dtype,
                                 gather_axis(axis, shape), algorithm, out=out)
        return handle(results, results, "all_gather", async_op)
    arrays = gpu_arrays()
    axis %= len(base)
    gathered = list(base)
    gathered[axis] *= n
    results = outputs(arrays, out, values, tuple(gathered), dtype)
    flats = [arrays.flat(v) for v in values]
    leading = all(d == 1 for d in base[:axis]) and not unsafe_outputs(arrays, values, results)
    stacked = ([r.reshape(-1) for r in results] if leading
               else [arrays.empty((n * f.size,), dtype, like=f) for f in flats])
    group.all_gather(flats, stacked)
    if not leading:
        for r, s in zip(results, stacked):
            arrays.copy(r, arrays.concatenate(list(s.reshape((n, *base))), axis))
    return handle(results, results, "all_gather", async_op)


@own_function
def reduce_scatter(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
                   out: Any = None, shards: int = 0, groups: Any = None,
                   async_op: bool = False) -> Any:
    """``collectives.reduce_scatter`` for CuPy arrays, with NCCL and ``async_op``. NCCL needs
    equal blocks: rows not divisible by the device count run the library's algorithms (so
    do two-level names over ``groups``)."""
    values, shape, dtype, op = prepare(values, op)
    n = len(values)
    request = nccl_request(algorithm, math.prod(shape))
    if (not shape or shape[0] % n or (request or "").startswith("nccl/") or groups is not None
            or not use_nccl(request, values, dtype, op)):
        check_rows(shape)
        results = run_reduce_scatter(library_devices(), values, shape, dtype, op, algorithm,
                                     out=out, shards=shards, groups=groups)
        return handle(results, results, "reduce_scatter", async_op)
    arrays = gpu_arrays()
    final = result_dtype(op, dtype)
    rows = shape[0] // n
    block_shape = (rows, *shape[1:])
    results = outputs(arrays, out, values, block_shape, final, same_results=False)
    flats = [arrays.flat(v) for v in values]
    blocks = ([r.reshape(-1) for r in results]
              if final == dtype and not unsafe_outputs(arrays, values, results)
              else [arrays.result((math.prod(block_shape),), dtype, like=f) for f in flats])
    group.reduce_scatter(arrays, flats, blocks, op.wire_op)
    deliver(arrays, op, blocks, results, n)
    return handle(results, results, "reduce_scatter", async_op)
