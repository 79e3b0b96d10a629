"""A validated multi-device call, run: its schedule, its result and work buffers, and the
delivery of results (MEAN's one division, or a copy where a work buffer stood in).

The multi-device API (``collectives.api.multi_device``, ``multi_device_spread``) and a backend
that validated a call itself (the CuPy backend, where NCCL does not run it) both come here
once the arrays are checked: ``run_all_reduce``, ``run_reduce``, ``run_broadcast``,
``run_all_gather`` and ``run_reduce_scatter`` take the call's validated pieces and run it over
the backend's devices, without checking the arrays again (``validate.gather_axis`` and ``check_rows`` are the
checks of all-gather's axis and reduce-scatter's rows that both callers make, once, before
them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import algorithms
from ...algorithms import select
from ...algorithms.base import Layout
from ...algorithms.cost import Placement
from ...algorithms.schedule import Collective
from ...algorithms.spec import spec_key
from ...arrays import NUMPY
from ...ops import ReduceOp, result_dtype
from ...overlap import clashing, unsafe_outputs
from ..calls import resolve_algorithm
from ..validate import check_out, check_shards, resolve_groups
from .devices import DeviceBackend, run_multi_device


def pick(collective: Collective, algorithm: Any, size: int, nbytes: int, model: Any,
         count: int = 0, shards: int = 0) -> tuple[str, int, Layout | None]:
    """`pick_algorithm`, with the groups of a two-level choice of ``auto`` (or None)."""
    name, shards = resolve_algorithm(algorithm, count, shards)
    if name == "auto":
        fabric = select.fabric_of(model)
        decision = select.decide(collective, size, nbytes, fabric,
                                 Placement(size, None, processes=False))
        return decision.name, decision.shards or shards, decision.layout
    if not algorithms.supports(collective, name):
        raise ValueError(f"algorithm={algorithm!r} has no {collective.value}; use 'auto' or one "
                         f"of {', '.join(algorithms.names_for(collective))}")
    return name, shards, None


_PLANS: dict[tuple, Any] = {}  # the schedule of each call's arguments, as ``plan`` made it


def plan(backend: Any, collective: Collective, algorithm: Any, n: int, shape: tuple[int, ...],
         dtype: np.dtype, shards: int = 0, groups: Any = None, root: int = 0) -> Any:
    """The schedule that runs the call: ``algorithm`` resolved (``auto`` by the cost model).
    Kept by its arguments (a gradient list repeats a few shapes every step: choosing cost
    10 µs a call); arguments that raise are never kept, so they raise every time."""
    model = getattr(backend, "fabric", None) or backend.cost_model
    count = math.prod(shape)
    # (types too: True == 1 and 2.0 == 2, where a bool or a float must raise as it did)
    key: tuple | None = (collective, spec_key(algorithm), n, count, dtype.itemsize, model,
                         type(shards), shards, spec_key(groups), root)
    try:
        found = _PLANS.get(key)  # type: ignore[arg-type]
    except TypeError:  # (an array as groups, an unhashable model: not kept)
        key = found = None
    if found is not None:
        return found
    nbytes = count * dtype.itemsize * (n if collective is Collective.ALL_GATHER else 1)
    name, shards, chosen = pick(collective, algorithm, n, nbytes, model, count,
                                check_shards(shards))
    layout = Layout(resolve_groups(groups, n)) if groups is not None else chosen
    shards = min(shards, max(count, 1))  # more sub-chunks than elements: pointless
    schedule = algorithms.schedule(collective, name, n, root=root, shards=shards, layout=layout)
    if key is not None:
        if len(_PLANS) > 4096:  # (programs use few shapes; bounded anyway)
            _PLANS.clear()
        _PLANS[key] = schedule
    return schedule


def elsewhere(arrays, a, b) -> tuple[int, int] | None:
    """``(a's device, b's)`` where ``a`` is on another device than ``b``, else None (arrays
    of one host, NumPy's: never)."""
    if arrays is NUMPY:
        return None
    mine, theirs = arrays.extent(a)[0], arrays.extent(b)[0]
    return None if mine == theirs else (mine, theirs)


def check_batch_devices(arrays, per_device) -> None:
    """A batch's arrays for device ``d`` (``per_device[d]``: tensor ``k``'s at ``[k]``) are
    all on one device: they are fused there."""
    for d, column in enumerate(per_device):
        for k, value in enumerate(column):
            apart = elsewhere(arrays, value, column[0])
            if apart is not None:
                raise ValueError(f"value_lists[{k}][{d}] is on device {apart[0]} but "
                                 f"value_lists[0][{d}] on device {apart[1]}; a batch's device "
                                 f"{d} is one device: give every tensor's arrays in the same "
                                 "order of devices")


def root_output(arrays, out, values, root, shape, dtype) -> Any:
    """A reduce's one ``out``, checked: the result's shape and dtype, on the root's device."""
    check_out(out, shape, dtype, "out", arrays)
    apart = elsewhere(arrays, out, values[root])
    if apart is not None:
        raise ValueError(f"out is on device {apart[0]} but the root's value, values[{root}], "
                         f"on device {apart[1]}; the result stays on the root's device")
    return out


def outputs(arrays, out, values, shape, dtype, argument="out", beside=True,
            same_results=True) -> list:
    """``out`` checked (one array per device, each ``values[i]``'s device's where ``beside``,
    none spoiling another's result: ``apart``), or new results there."""
    if out is None:
        return [arrays.result(shape, dtype, like=v) for v in values]
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise TypeError(f"{argument} must be a list of {len(values)} arrays, one per device")
    if len(out) != len(values):
        raise ValueError(f"{argument} has {len(out)} arrays for {len(values)} devices; pass one "
                         "per device")
    for i, o in enumerate(out):
        check_out(o, shape, dtype, f"{argument}[{i}]", arrays)
        apart = elsewhere(arrays, o, values[i]) if beside else None
        if apart is not None:
            raise ValueError(f"{argument}[{i}] is on device {apart[0]} but values[{i}] on "
                             f"device {apart[1]}; each result stays on its input's device")
    return apart_outputs(arrays, list(out), argument, same_results)


def apart_outputs(arrays, outs: list, argument: str = "out", same_results: bool = True) -> list:
    """``outs``, where no two share memory so that writing one spoils the other: none at all
    where each device's result is its own (``same_results`` False: a reduce-scatter's
    blocks); else none but the same array (or the same view) given twice, which takes the same
    result twice. (Overlapping outputs were filled one after another: the last one written
    won where they overlap, and the devices' results differed.)"""
    pair = clashing(arrays, outs, same_results)
    if pair is not None:
        raise ValueError(
            f"{argument}[{pair[1]}] shares memory with {argument}[{pair[0]}]; each device's "
            f"result needs memory of its own: pass {argument} arrays that do not overlap"
            + (" (or one array for every device)" if same_results else ""))
    return outs


def work_buffers(arrays, results, values, shape, dtype, given: bool = True):
    """Work buffers, one per result: the results themselves where that is safe and the dtype
    fits, else new ones on the results' devices. Results the library allocated (``given``
    False) share memory with nothing: no check needed."""
    if results[0].dtype != dtype or (given and unsafe_outputs(arrays, values, results)):
        return [arrays.result(shape, dtype, like=r) for r in results]
    return results


def deliver(arrays, op, work, results, size):
    """Results from work buffers: MEAN's one division, or a copy where work stood in."""
    for w, r in zip(work, results):
        if op is ReduceOp.MEAN:
            arrays.divide(w, size, out=r)
        elif w is not r:
            arrays.copy(r, w)


def run_all_reduce(backend: DeviceBackend, values: Sequence, shape: tuple[int, ...],
                   dtype: np.dtype, op: ReduceOp, algorithm: Any, *, out: Any = None,
                   shards: int = 0, groups: Any = None, accumulation_fn: Any = None) -> list:
    """All-reduce checked ``values`` (one per device, of ``shape`` and ``dtype``) with the
    library's algorithm; a result per device (into ``out``, checked here as it is used)."""
    n = len(values)
    arrays = backend.arrays
    schedule = plan(backend, Collective.ALL_REDUCE, algorithm, n, shape, dtype, shards, groups)
    results = outputs(arrays, out, values, shape, result_dtype(op, dtype))
    work = work_buffers(arrays, results, values, shape, dtype, out is not None)
    run_multi_device(schedule, [arrays.flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, accumulation_fn=accumulation_fn)
    deliver(arrays, op, work, results, n)
    return results


def run_reduce(backend: DeviceBackend, values: Sequence, shape: tuple[int, ...],
               dtype: np.dtype, op: ReduceOp, root: int, algorithm: Any, *, out: Any = None,
               shards: int = 0, groups: Any = None, accumulation_fn: Any = None) -> Any:
    """Reduce checked ``values`` onto device ``root`` (a checked index) with the library's
    algorithm; the result (into ``out``, checked here as it is used)."""
    n = len(values)
    arrays = backend.arrays
    schedule = plan(backend, Collective.REDUCE, algorithm, n, shape, dtype, shards, groups,
                    root)
    final = result_dtype(op, dtype)
    result = (arrays.result(shape, final, like=values[root]) if out is None
              else root_output(arrays, out, values, root, shape, final))
    # Participants the schedule never writes keep reading their inputs: no buffer for them.
    inputs = [arrays.flat(v) for v in values]
    written = {s[0] for s in schedule.steps}
    # (work buffers come from the backend's pool: mapped memory reused across calls)
    work = [arrays.result(shape, dtype, like=v).reshape(-1) if p in written else inputs[p]
            for p, v in enumerate(values)]
    # in place only as the root's own input: ``out`` is values[root] (else it aliases an input)
    safe = out is None or not unsafe_outputs(arrays, values, [None] * root + [result])
    total = result if final == dtype and safe else arrays.result(shape, dtype, like=values[root])
    work[root] = total.reshape(-1)
    if root not in written:  # a single participant: its input is the total
        arrays.copy(work[root], inputs[root])
    run_multi_device(schedule, inputs, work, op.wire_op, backend, accumulation_fn=accumulation_fn)
    deliver(arrays, op, [total], [result], n)
    return result


def run_broadcast(backend: DeviceBackend, value: Any, n: int, shape: tuple[int, ...],
                  dtype: np.dtype, algorithm: Any, *, out: Any = None, shards: int = 0,
                  out_checked: bool = False) -> list:
    """Copy checked ``value`` (of ``shape`` and ``dtype``) to ``n`` devices (a checked count)
    with the library's algorithm; a copy per device, into ``out`` (checked here as it is used,
    unless ``out_checked``: the CuPy backend checks it before it chooses NCCL)."""
    arrays = backend.arrays
    schedule = plan(backend, Collective.BROADCAST, algorithm, n, shape, dtype, shards)
    results = (list(out) if out_checked and out is not None
               else outputs(arrays, out, [value] * n, shape, dtype, beside=False))
    work = work_buffers(arrays, results, [value], shape, dtype, out is not None)
    run_multi_device(schedule, [arrays.flat(value)] + [None] * (n - 1),
                     [w.reshape(-1) for w in work], ReduceOp.SUM, backend)
    deliver(arrays, None, work, results, n)
    return results


def run_all_gather(backend: DeviceBackend, values: Sequence, shape: tuple[int, ...],
                   dtype: np.dtype, axis: int, algorithm: Any, *, out: Any = None) -> list:
    """Concatenate checked ``values`` along ``axis`` (``gather_axis``'s) on every device with
    the library's algorithm; a result per device (into ``out``, checked here as it is used)."""
    n = len(values)
    arrays = backend.arrays
    base = shape if shape else (1,)
    gathered_shape = list(base)
    gathered_shape[axis] *= n
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


def run_reduce_scatter(backend: DeviceBackend, values: Sequence, shape: tuple[int, ...],
                       dtype: np.dtype, op: ReduceOp, algorithm: Any, *, out: Any = None,
                       shards: int = 0, groups: Any = None) -> list:
    """Reduce checked ``values`` (with rows: ``check_rows``) with the library's algorithm and
    leave device ``i`` block ``i`` of axis 0 (into ``out``, checked here as it is used)."""
    n = len(values)
    arrays = backend.arrays
    schedule = plan(backend, Collective.REDUCE_SCATTER, algorithm, n, shape, dtype, shards,
                    groups)
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
        apart_outputs(arrays, list(out), same_results=False)
    work = [arrays.result(shape, dtype, like=v) for v in values]
    run_multi_device(schedule, [arrays.flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, granule=row if row else 1)
    results = list(out) if out is not None else [
        arrays.result((hi - lo, *shape[1:]), final, like=v) for v, (lo, hi) in zip(values, blocks)]
    deliver(arrays, op, [w[lo:hi] for w, (lo, hi) in zip(work, blocks)], results, n)
    return results
