"""The multi-device API: one process holds one array per device (TensorFlow's PerReplica).

Each function validates everything first, picks the algorithm, fetches its schedule and runs
it over the backend that owns the arrays (NumPy arrays: the embedded backend; CuPy arrays: a
GPU backend). Results come back one per device, on the device of its input; inputs are never
modified unless ``out`` names them. An ``out`` that shares memory with another ``out`` or with
an input (other than being exactly that device's input, which means in place) is filled from
buffers of the library's own, so aliasing never gives a wrong answer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import algorithms
from ..algorithms import select
from ..algorithms.base import Layout
from ..algorithms.cost import Placement
from ..algorithms.schedule import Collective
from ..arrays import unsafe_outputs
from ..compression import for_batch, requested
from ..foreign import accepts_foreign_values
from ..ops import ReduceOp, result_dtype
from ..registry import backend_for_arrays
from ..runtime import tracing_devices
from ..runtime.calls import resolve_algorithm
from ..runtime.execute import run_multi_device
from ..runtime.validate import (
    Groups,
    as_array,
    check_communicable,
    check_devices,
    check_op,
    check_out,
    check_root,
    check_shards,
    resolve_groups,
    same_layout,
)
from ..runtime.work import Completed
from ..timeline import recorder
from .compressed import multi_device_all_reduce

__all__ = ["all_gather", "all_reduce", "batch_all_reduce", "broadcast", "pick_algorithm",
           "reduce", "reduce_scatter"]


def backend_first(function: Callable) -> Callable:
    """A multi-device function whose arrays' backend may run the call its own way (the CuPy
    backend: NCCL for "nccl" names on distinct GPUs; handles that wait for the devices'
    streams), else the library's algorithms here. Adds ``async_op``: a handle whose ``wait()``
    returns the results. ``function.library`` is the library's own implementation, for
    backends that fall back to it."""

    @functools.wraps(function)
    def wrapper(values, *args, async_op: bool = False, **kwargs):
        if recorder.ON:  # the call as a span on every device's row
            return tracing_devices.device_call(function, values, args,
                                               lambda: dispatch(values, args, async_op, kwargs))
        return dispatch(values, args, async_op, kwargs)

    def dispatch(values, args, async_op, kwargs):
        first = values[0] if isinstance(values, (list, tuple)) and values else values
        if not requested(kwargs.get("compression")):
            kwargs.pop("compression", None)  # (a backend's own functions never compress)
        if first is not None and not isinstance(first, np.ndarray) and hasattr(first, "shape"):
            own = getattr(backend_for_arrays([first]), "own", None)
            runner = own(function.__name__) if own is not None else None
            if runner is not None and "compression" not in kwargs:
                return runner(values, *args, async_op=async_op, **kwargs)
        result = function(values, *args, **kwargs)
        return Completed(result) if async_op else result

    wrapper.library = function  # type: ignore[attr-defined]
    return wrapper


def pick_algorithm(collective: Collective, algorithm: Any, size: int, nbytes: int,
                   model: select.CostModel, count: int = 0, shards: int = 0) -> tuple[str, int]:
    """``(canonical name, shards)`` that run a call: ``auto`` resolved by the cost model,
    spec forms by the element ``count``."""
    name, shards, _ = pick(collective, algorithm, size, nbytes, model, count, shards)
    return name, shards


def pick(collective: Collective, algorithm: Any, size: int, nbytes: int, model: Any,
         count: int = 0, shards: int = 0) -> tuple[str, int, Layout | None]:
    """:func:`pick_algorithm`, with the groups of a two-level choice of ``auto`` (or None)."""
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


def _prepare(values: Any, op: Any, argument: str = "values"):
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    values = [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    shape, dtype = same_layout(values, argument, op)
    op = check_op(op, dtype, argument) if op is not None else None
    return values, shape, dtype, op


def _plan(backend, collective, algorithm, n, shape, dtype, shards=0, groups=None, root=0):
    count = math.prod(shape)
    nbytes = count * dtype.itemsize * (n if collective is Collective.ALL_GATHER else 1)
    name, shards, chosen = pick(collective, algorithm, n, nbytes, getattr(
        backend, "fabric", None) or backend.cost_model, count, check_shards(shards))
    layout = Layout(resolve_groups(groups, n)) if groups is not None else chosen
    shards = min(shards, max(count, 1))  # more sub-chunks than elements: pointless
    return algorithms.schedule(collective, name, n, root=root, shards=shards, layout=layout)


def _outputs(arrays, out, values, shape, dtype, argument="out") -> list:
    if out is None:
        return [arrays.result(shape, dtype, like=v) for v in values]
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise TypeError(f"{argument} must be a list of {len(values)} arrays, one per device")
    if len(out) != len(values):
        raise ValueError(f"{argument} has {len(out)} arrays for {len(values)} devices; pass one "
                         "per device")
    for i, o in enumerate(out):
        check_out(o, shape, dtype, f"{argument}[{i}]", arrays)
    return list(out)


def _work(arrays, results, values, shape, dtype, given: bool = True):
    """Work buffers: the results themselves where that is safe and the dtype fits. Results the
    library allocated (``given`` False) share memory with nothing: no check needed."""
    if results[0].dtype != dtype or (given and unsafe_outputs(arrays, values, results)):
        return [arrays.result(shape, dtype, like=v) for v in values]
    return results


def _deliver(arrays, op, work, results, size):
    """Results from work buffers: MEAN's one division, or a copy where work stood in."""
    for w, r in zip(work, results):
        if op is ReduceOp.MEAN:
            arrays.divide(w, size, out=r)
        elif w is not r:
            arrays.copy(r, w)


@accepts_foreign_values
@backend_first
def all_reduce(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
               out: Sequence | None = None, shards: int = 0, groups: Groups = None,
               accumulation_fn: Callable | None = None, shared_result: bool = False,
               compression: str | None = None) -> list:
    """Reduce the arrays of all devices; every device gets the result (bitwise identical).

    ``algorithm``: "auto", "one_device", "ring", "rechd", "tree", "shuffle", a TensorFlow
    name ("xring", "pscpu", "nccl", ...), a two-level "A/B" over ``groups``, or any spec form
    ("xring#2", ``("pscpu", 1, 1024)``, "pscpu:2k:xring": the range by element count).
    ``shards``: ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    ``accumulation_fn(list_of_arrays) -> array`` replaces the op's kernel for reductions.
    ``shared_result``: where the devices share memory (logical CPU devices), compute the
    result once and return it as read-only views, one per device (no per-device copies).
    ``compression``: "fp16" or "bf16" all-reduces float32/float64 SUM and MEAN in that
    narrower float and casts the result back (see ``collectives.compression``).
    """
    if requested(compression):
        return multi_device_all_reduce(all_reduce, values, op, algorithm, compression, out=out,
                                       shared_result=shared_result, shards=shards,
                                       groups=groups, accumulation_fn=accumulation_fn)
    values, shape, dtype, op = _prepare(values, op)
    n = len(values)
    backend = backend_for_arrays(values)
    arrays = backend.arrays
    final = result_dtype(op, dtype)
    if shared_result:
        if out is not None:
            raise ValueError("shared_result=True returns views of one new buffer; it takes "
                             "no out=")
        if not getattr(backend, "shares_memory", False):
            raise ValueError(f"shared_result=True needs devices that share memory; "
                             f"{type(backend).__name__} devices do not")
        result = reduce(values, op, 0, algorithm, shards=shards, groups=groups,
                        accumulation_fn=accumulation_fn)
        view = result.view()
        view.flags.writeable = False
        return [view] * n
    schedule = _plan(backend, Collective.ALL_REDUCE, algorithm, n, shape, dtype, shards, groups)
    results = _outputs(arrays, out, values, shape, final)
    work = _work(arrays, results, values, shape, dtype, out is not None)
    run_multi_device(schedule, [arrays.flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, accumulation_fn=accumulation_fn)
    _deliver(arrays, op, work, results, n)
    return results


@accepts_foreign_values
@backend_first
def reduce(values: Sequence, op: ReduceOp | str = "sum", root: int = 0, algorithm: Any = "auto",
           *, out: Any = None, shards: int = 0, groups: Groups = None,
           accumulation_fn: Callable | None = None) -> Any:
    """Reduce the arrays of all devices onto device ``root``; returns that one array."""
    values, shape, dtype, op = _prepare(values, op)
    n = len(values)
    root = check_root(root, n)
    backend = backend_for_arrays(values)
    arrays = backend.arrays
    schedule = _plan(backend, Collective.REDUCE, algorithm, n, shape, dtype, shards, groups,
                     root)
    final = result_dtype(op, dtype)
    result = _outputs(arrays, None if out is None else [out], [values[root]], shape, final)[0]
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
    _deliver(arrays, op, [total], [result], n)
    return result


@accepts_foreign_values
@backend_first
def broadcast(value: Any, devices: int | Sequence, algorithm: Any = "auto", *, out: Any = None,
              shards: int = 0) -> list:
    """Copy ``value`` to every device; ``devices`` is a count or a list of device ids."""
    value = as_array(value, "value")
    n = check_devices(devices)
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    check_communicable(dtype, "value")
    backend = backend_for_arrays([value])
    arrays = backend.arrays
    schedule = _plan(backend, Collective.BROADCAST, algorithm, n, shape, dtype, shards)
    results = _outputs(arrays, out, [value] * n, shape, dtype)
    work = _work(arrays, results, [value], shape, dtype, out is not None)
    run_multi_device(schedule, [arrays.flat(value)] + [None] * (n - 1),
                     [w.reshape(-1) for w in work], ReduceOp.SUM, backend)
    _deliver(arrays, None, work, results, n)
    return results


@accepts_foreign_values
@backend_first
def all_gather(values: Sequence, axis: int = 0, algorithm: Any = "auto", *, out: Any = None
               ) -> list:
    """Every device gets the concatenation of all devices' arrays along ``axis``."""
    values, shape, dtype, _ = _prepare(values, None)
    n = len(values)
    base = shape if shape else (1,)
    if not -len(base) <= axis < len(base):
        raise ValueError(f"axis={axis} is out of range for arrays of {len(shape)} dimensions")
    axis %= len(base)
    gathered_shape = list(base)
    gathered_shape[axis] *= n
    backend = backend_for_arrays(values)
    arrays = backend.arrays
    results = _outputs(arrays, out, values, tuple(gathered_shape), dtype)
    schedule = _plan(backend, Collective.ALL_GATHER, algorithm, n, shape, dtype)
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


@accepts_foreign_values
@backend_first
def reduce_scatter(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
                   out: Any = None, shards: int = 0) -> list:
    """Reduce, then device ``i`` keeps block ``i`` of axis 0.

    Block ``i`` is rows ``floor(i R / n)`` to ``floor((i + 1) R / n)`` of the ``R`` rows, so
    the blocks differ by at most one row when ``n`` does not divide ``R``.
    """
    values, shape, dtype, op = _prepare(values, op)
    if not shape:
        raise ValueError("values are scalars; reduce_scatter splits axis 0, so pass arrays")
    n = len(values)
    backend = backend_for_arrays(values)
    arrays = backend.arrays
    schedule = _plan(backend, Collective.REDUCE_SCATTER, algorithm, n, shape, dtype, shards)
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
    _deliver(arrays, op, [w[lo:hi] for w, (lo, hi) in zip(work, blocks)], results, n)
    return results


@backend_first
def batch_all_reduce(value_lists: Sequence[Sequence], op: ReduceOp | str = "sum",
                     algorithm: Any = "auto", *, num_packs: int = 0,
                     agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10,
                     bytes_per_pack: int | None = None, shards: int = 0,
                     groups: Groups = None, compression: str | None = None) -> list[list]:
    """All-reduce many tensors at once: ``value_lists[k]`` holds tensor k on every device.

    ``algorithm`` takes any all-reduce spec: a name, ``(alg, shards, limit)`` tuples with
    limits in elements, or a string like ``"pscpu:2k:pscpu#2:64k:xring"``. Tensors are packed
    (``num_packs``, small-tensor aggregation or ``bytes_per_pack``) so many small tensors cost
    few collectives. Returns ``results[k][d]``, in input order with input shapes.
    ``compression`` ("fp16", "bf16") compresses the float32 and float64 packs (see
    ``all_reduce``); others travel as they are.
    """
    from ..algorithms.batch import plan_batch

    if isinstance(value_lists, (str, bytes)) or not isinstance(value_lists, Sequence):
        raise TypeError("value_lists must be a list with, per tensor, one array per device")
    if len(value_lists) == 0:
        return []
    tensors = [_prepare(v, op, f"value_lists[{k}]") for k, v in enumerate(value_lists)]
    n = len(tensors[0][0])
    for k, (values, *_rest) in enumerate(tensors):
        if len(values) != n:
            raise ValueError(f"value_lists[{k}] has {len(values)} devices but value_lists[0] has "
                             f"{n}; every tensor needs one array per device")
    arrays = backend_for_arrays(tensors[0][0]).arrays
    results: list[list | None] = [None] * len(tensors)
    for part in plan_batch([t[1] for t in tensors], [t[2] for t in tensors], algorithm,
                           num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                           agg_small_grads_max_group=agg_small_grads_max_group,
                           bytes_per_pack=bytes_per_pack, shards=check_shards(shards)):
        per_device = [part.plan.pack([tensors[i][0][d] for i in part.indices], arrays=arrays)
                      for d in range(n)]
        squeeze = for_batch(compression, op, [per_device[0][j].dtype
                                              for j in range(len(part.plan.packs))])
        reduced = [all_reduce([per_device[d][j] for d in range(n)], op, part.spec.algorithm,
                              shards=part.spec.shards, groups=groups, compression=squeeze[j])
                   for j in range(len(part.plan.packs))]
        unpacked = [part.plan.unpack([reduced[j][d] for j in range(len(reduced))], arrays=arrays)
                    for d in range(n)]
        for position, i in enumerate(part.indices):
            results[i] = [unpacked[d][position] for d in range(n)]
    return results
