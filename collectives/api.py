"""The multi-device API: one process holds one array per device (TensorFlow's PerReplica).

Each function validates everything first, picks the algorithm, builds (or fetches) its
schedule and runs it over the backend that owns the arrays (NumPy arrays: the embedded
backend; CuPy arrays: the GPU backend). Results come back one per device, on the device of
its input; inputs are never modified unless ``out`` names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from . import algorithms, select
from .batch import plan_batch
from .execute import run_multi_device
from .ops import ReduceOp, divide_for_mean, result_dtype
from .registry import backend_for_arrays
from .schedule import Collective
from .validate import as_array, check_op, check_out, check_root, check_shards, flat, same_layout

Groups = Sequence[Sequence[int]] | int | None


def resolve_groups(groups: Groups, size: int) -> tuple[tuple[int, ...], ...] | None:
    """Groups for two-level algorithms: None, a group size, or a partition of the participants."""
    if groups is None:
        return None
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"groups={groups} must be a positive group size or a list of groups")
        return tuple(tuple(range(i, min(i + groups, size))) for i in range(0, size, groups))
    out = tuple(tuple(int(p) for p in g) for g in groups)
    members = sorted(p for g in out for p in g)
    if members != list(range(size)) or any(len(g) == 0 for g in out):
        raise ValueError(f"groups={groups!r} must split the participants 0..{size - 1} into "
                         "non-empty groups, each participant in exactly one")
    return out


def pick_algorithm(collective: Collective, algorithm: str, size: int, nbytes: int,
                   model: select.CostModel) -> str:
    name = algorithms.canonical(algorithm)
    if name == "auto":
        return select.choose(collective, size, nbytes, model)
    if not algorithms.supports(collective, name):
        raise ValueError(
            f"algorithm={algorithm!r} has no {collective.value}; use 'auto' or one of "
            f"{', '.join(n for n in algorithms.MODULES if algorithms.supports(collective, n))}")
    return name


def _prepare(values, op, argument="values"):
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    values = [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    shape, dtype = same_layout(values, argument)
    op = check_op(op, dtype, argument) if op is not None else None
    return values, shape, dtype, op


def _outputs(backend, out, values, shape, dtype, argument="out"):
    if out is None:
        return [backend.empty_like(v, shape, dtype) for v in values]
    if len(out) != len(values):
        raise ValueError(f"{argument} has {len(out)} arrays for {len(values)} devices")
    for i, o in enumerate(out):
        check_out(o, shape, dtype, f"{argument}[{i}]")
    return list(out)


def _finish_mean(op, work, results, size):
    if op is ReduceOp.MEAN:
        for w, r in zip(work, results):
            divide_for_mean(w, size, out=r)


def all_reduce(values: Sequence, op: ReduceOp | str = "sum", algorithm: str = "auto", *,
               out: Sequence | None = None, shards: int = 0, groups: Groups = None,
               accumulation_fn: Callable | None = None) -> list:
    """Reduce the arrays of all devices; every device gets the result (bitwise identical).

    ``algorithm``: "auto", "one_device", "ring", "rechd", "tree", "shuffle", a TensorFlow
    name ("xring", "pscpu", "nccl", ...) or a two-level "A/B" over ``groups``.
    ``shards``: ring sub-chunks or shuffle gather devices (0: the algorithm's default).
    ``accumulation_fn(list_of_arrays) -> array`` replaces the op's kernel for reductions.
    """
    values, shape, dtype, op = _prepare(values, op)
    n, shards = len(values), check_shards(shards)
    backend = backend_for_arrays(values)
    name = pick_algorithm(Collective.ALL_REDUCE, algorithm, n,
                          math.prod(shape) * dtype.itemsize, backend.cost_model)
    schedule = algorithms.build(Collective.ALL_REDUCE, name, n, shards=shards,
                                groups=resolve_groups(groups, n))
    final = result_dtype(op, dtype)
    results = _outputs(backend, out, values, shape, final)
    work = results if final == dtype else [backend.empty_like(v, shape, dtype) for v in values]
    run_multi_device(schedule, [flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, accumulation_fn=accumulation_fn)
    _finish_mean(op, work, results, n)
    return results


def reduce(values: Sequence, op: ReduceOp | str = "sum", root: int = 0, algorithm: str = "auto",
           *, out=None, shards: int = 0, groups: Groups = None,
           accumulation_fn: Callable | None = None):
    """Reduce the arrays of all devices onto device ``root``; returns that one array."""
    values, shape, dtype, op = _prepare(values, op)
    n, shards = len(values), check_shards(shards)
    root = check_root(root, n)
    backend = backend_for_arrays(values)
    name = pick_algorithm(Collective.REDUCE, algorithm, n,
                          math.prod(shape) * dtype.itemsize, backend.cost_model)
    schedule = algorithms.build(Collective.REDUCE, name, n, root=root, shards=shards,
                                groups=resolve_groups(groups, n))
    final = result_dtype(op, dtype)
    result = _outputs(backend, None if out is None else [out], [values[root]], shape, final)[0]
    # Participants the schedule never writes keep reading their inputs: no buffer for them.
    inputs = [flat(v) for v in values]
    written = {s.dst for s in schedule.steps}
    work = [backend.empty_like(v, shape, dtype).reshape(-1) if p in written else inputs[p]
            for p, v in enumerate(values)]
    if final == dtype:
        work[root] = result.reshape(-1)
    elif root not in written:
        work[root] = backend.empty_like(values[root], shape, dtype).reshape(-1)
    run_multi_device(schedule, inputs, work, op.wire_op, backend, accumulation_fn=accumulation_fn)
    work[root] = work[root].reshape(shape)
    _finish_mean(op, [work[root]], [result], n)
    return result


def broadcast(value, devices: int | Sequence, algorithm: str = "auto", *, out=None,
              shards: int = 0) -> list:
    """Copy ``value`` to every device; ``devices`` is a count or a list of device ids."""
    value = as_array(value, "value")
    n = devices if isinstance(devices, (int, np.integer)) else len(devices)
    if n < 1:
        raise ValueError(f"devices={devices!r} names no device; pass a count or a list")
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    backend = backend_for_arrays([value])
    name = pick_algorithm(Collective.BROADCAST, algorithm, n,
                          math.prod(shape) * dtype.itemsize, backend.cost_model)
    schedule = algorithms.build(Collective.BROADCAST, name, n, shards=check_shards(shards))
    targets = [None] * n if isinstance(devices, (int, np.integer)) else list(devices)
    results = ([backend.empty_on(d, value, shape, dtype) for d in targets] if out is None
               else _outputs(backend, out, [value] * n, shape, dtype))
    run_multi_device(schedule, [flat(value)] + [None] * (n - 1),
                     [r.reshape(-1) for r in results], ReduceOp.SUM, backend)
    return results


def all_gather(values: Sequence, axis: int = 0, algorithm: str = "auto", *, out=None) -> list:
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
    results = _outputs(backend, out, values, tuple(gathered_shape), dtype)
    name = pick_algorithm(Collective.ALL_GATHER, algorithm, n,
                          n * math.prod(shape) * dtype.itemsize, backend.cost_model)
    schedule = algorithms.build(Collective.ALL_GATHER, name, n)
    size = math.prod(shape)
    # Along the leading axis the rank-major buffer already is the result: gather in place.
    leading = all(d == 1 for d in base[:axis])
    stacked = ([r.reshape(-1) for r in results] if leading
               else [backend.empty_like(v, (n * size,), dtype) for v in values])
    run_multi_device(schedule, [flat(v) for v in values], stacked, ReduceOp.SUM, backend,
                     granule=size if size else 1, input_offsets=[p * size for p in range(n)])
    if not leading:
        for r, s in zip(results, stacked):
            backend.copy(r, backend.concatenate(s.reshape((n, *base)), axis))
    return results


def reduce_scatter(values: Sequence, op: ReduceOp | str = "sum", algorithm: str = "auto", *,
                   out=None, shards: int = 0) -> list:
    """Reduce, then device ``i`` keeps block ``i`` of axis 0.

    Block ``i`` is rows ``floor(i R / n)`` to ``floor((i + 1) R / n)`` of the ``R`` rows, so
    the blocks differ by at most one row when ``n`` does not divide ``R``.
    """
    values, shape, dtype, op = _prepare(values, op)
    if not shape:
        raise ValueError("values are scalars; reduce_scatter splits axis 0, so pass arrays")
    n = len(values)
    backend = backend_for_arrays(values)
    name = pick_algorithm(Collective.REDUCE_SCATTER, algorithm, n,
                          math.prod(shape) * dtype.itemsize, backend.cost_model)
    schedule = algorithms.build(Collective.REDUCE_SCATTER, name, n, shards=check_shards(shards))
    rows, row = shape[0], math.prod(shape[1:])
    final = result_dtype(op, dtype)
    blocks = [(i * rows // n, (i + 1) * rows // n) for i in range(n)]
    if out is not None:
        if len(out) != n:
            raise ValueError(f"out has {len(out)} arrays for {n} devices")
        for i, (o, (lo, hi)) in enumerate(zip(out, blocks)):
            check_out(o, (hi - lo, *shape[1:]), final, f"out[{i}]")
    work = [backend.empty_like(v, shape, dtype) for v in values]
    run_multi_device(schedule, [flat(v) for v in values], [w.reshape(-1) for w in work],
                     op.wire_op, backend, granule=row if row else 1)
    results = []
    for w, (lo, hi) in zip(work, blocks):
        results.append(divide_for_mean(w[lo:hi], n) if op is ReduceOp.MEAN else w[lo:hi])
    if out is None:
        return results
    for o, r in zip(out, results):
        backend.copy(o, r)
    return list(out)


def batch_all_reduce(value_lists: Sequence[Sequence], op: ReduceOp | str = "sum",
                     algorithm="auto", *, num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
                     agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
                     shards: int = 0, groups: Groups = None) -> list[list]:
    """All-reduce many tensors at once: ``value_lists[k]`` holds tensor k on every device.

    ``algorithm`` takes any all-reduce spec: a name, ``(alg, shards, limit)`` tuples with
    limits in elements, or a string like ``"pscpu:2k:pscpu#2:64k:xring"``. Tensors are packed
    (``num_packs``, small-tensor aggregation or ``bytes_per_pack``) so many small tensors cost
    few collectives. Returns ``results[k][d]``, in input order with input shapes.
    """
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
    shapes = [t[1] for t in tensors]
    dtypes = [t[2] for t in tensors]
    results: list[list | None] = [None] * len(tensors)
    for part in plan_batch(shapes, dtypes, algorithm, num_packs=num_packs,
                           agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                           agg_small_grads_max_group=agg_small_grads_max_group,
                           bytes_per_pack=bytes_per_pack, shards=check_shards(shards)):
        per_device = [part.plan.pack([tensors[i][0][d] for i in part.indices]) for d in range(n)]
        reduced = [all_reduce([per_device[d][j] for d in range(n)], op, part.spec.algorithm,
                              shards=part.spec.shards, groups=groups)
                   for j in range(len(part.plan.packs))]
        unpacked = [part.plan.unpack([reduced[j][d] for j in range(len(reduced))])
                    for d in range(n)]
        for position, i in enumerate(part.indices):
            results[i] = [unpacked[d][position] for d in range(n)]
    return results
