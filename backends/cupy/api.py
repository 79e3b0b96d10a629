"""The multi-device API for CuPy arrays, with NCCL and ``async_op``.

These functions take the arguments of ``collectives.all_reduce`` and friends, plus
``async_op=True`` (a ``DeviceWork`` handle instead of the result). They decide
between NCCL and the library's algorithms, then run one or the other:

* ``algorithm="nccl"``: NCCL's own collective, one GPU per array (two arrays on one GPU raise
  ``ValueError`` naming it). Dtypes and ops NCCL cannot reduce exactly (``nccl_types``) run
  the library's ring instead, which is what the name means to the core;
* ``"nccl/X"`` (TensorFlow's ``nccl/xring``, ``nccl/rechd``, ``nccl/pscpu``): NCCL inside
  each group of ``groups`` (reduce onto the group's first device, then broadcast back), the
  library's ``X`` across the groups' first devices;
* ``"auto"``: NCCL where every array has a GPU of its own and NCCL reduces the dtype exactly;
  for logical devices that all share one GPU, one kernel that reads every input
  (``one_gpu``); else the library's choice;
* anything else: the library's algorithm, as ``collectives.all_reduce`` runs it.

Every check runs before anything is enqueued. MEAN is SUM then one division by the number of
devices (NCCL's AVG is never used), so results match the NumPy backend's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast, overload

import numpy as np

from collectives.algorithms.packing import DEFAULT_BUCKET_BYTES
from collectives.arrays import overlaps, unsafe_outputs
from collectives.ops import ReduceOp, result_dtype
from collectives.runtime.calls import resolve_algorithm
from collectives.runtime.execute import DeviceBackend
from collectives.runtime.execute.device_calls import run_all_reduce, run_reduce
from collectives.runtime.validate import as_array, check_op, check_out, resolve_groups, same_layout

from . import group, one_gpu
from .devices import devices as _devices
from .devices import own_function
from .probe import NcclUnavailableError, cupy_module, nccl_module
from .work import DeviceWork


def _arrays():
    return _devices().arrays


@overload
def _prepare(values: Any, op: None, argument: str = ...
             ) -> tuple[Sequence, tuple[int, ...], np.dtype, None]: ...
@overload
def _prepare(values: Any, op: ReduceOp | str, argument: str = ...
             ) -> tuple[Sequence, tuple[int, ...], np.dtype, ReduceOp]: ...
def _prepare(values: Any, op: ReduceOp | str | None, argument: str = "values"
             ) -> tuple[Sequence, tuple[int, ...], np.dtype, ReduceOp | None]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one CuPy array per device, "
                        f"not {type(values).__name__}")
    ndarray = cupy_module().ndarray
    for i, v in enumerate(values):
        if not isinstance(v, ndarray):
            as_array(v, f"{argument}[{i}]")  # None, a list of arrays: its own message
            raise TypeError(
                f"{argument}[{i}] is a {type(v).__module__}.{type(v).__name__}; these calls "
                "take CuPy arrays only (NumPy arrays and CuPy arrays cannot be mixed): move it "
                "with cupy.asarray under its device, or call collectives.all_reduce on NumPy "
                "arrays")
    shape, dtype = same_layout(values, argument)
    op = check_op(op, dtype, argument) if op is not None else None
    _arrays()  # no GPU visible: raise here, before anything else
    return values, shape, dtype, op


def _library_devices() -> DeviceBackend:
    """The devices the library's algorithms run on (the rounds strategy: no ``map_parallel``,
    which only the tiles strategy of host memory calls)."""
    return cast(DeviceBackend, _devices())


def _library(function: Any) -> Callable[..., Any]:
    """The library's own implementation of the multi-device ``function`` (``library``, which
    ``backend_first`` sets: the overloads that type ``function`` do not declare it)."""
    return function.library


def nccl_request(algorithm: Any, count: int) -> str | None:
    """``"nccl"``, ``"nccl/X"`` (X canonical), ``"auto"``, or None (a library algorithm)."""
    if isinstance(algorithm, str) and ":" not in algorithm and "#" not in algorithm:
        text = algorithm.strip().lower()
        if text in ("auto", "collective"):
            return "auto"
        if text == "nccl":
            return "nccl"
        if text.startswith("nccl/"):
            return "nccl/" + resolve_algorithm(text.split("/", 1)[1], count, 0)[0]
        return None
    name, _ = resolve_algorithm(algorithm, count, 0, ("nccl",))  # spec forms: by count
    return "nccl" if name == "nccl" else None


def _use_nccl(request: str | None, values: Sequence, dtype: np.dtype, op: ReduceOp | None,
              groups: Any = None) -> bool:
    """Whether NCCL runs this call; raises where NCCL was asked for and cannot be."""
    if request is None or (request == "auto" and len(values) < 2):
        return False
    if request == "auto":
        if len({v.device.id for v in values}) < len(values):
            return False  # logical devices share a GPU: the library's algorithms
        try:
            return group.supports(dtype, op)
        except (ImportError, NcclUnavailableError):
            return False
    nccl_module()  # raises, naming the wheel, where NCCL is missing
    if not group.supports(dtype, op):
        return False  # no exact NCCL form: the library's algorithms run it
    if request == "nccl" or groups is None:
        group.distinct_devices(values)
    else:
        layout = resolve_groups(groups, len(values))
        assert layout is not None  # groups is not None
        for members in layout:
            group.distinct_devices([values[p] for p in members])
    return True


def _handle(result: Any, arrays_out: Sequence, description: str, async_op: bool) -> Any:
    if not async_op:
        return result
    return DeviceWork(result, [a.device.id for a in arrays_out if a is not None], description)


def _outputs(arrays, out, values, shape, dtype) -> list:
    if out is None:
        return [arrays.result(shape, dtype, like=v) for v in values]
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) or len(out) != len(values):
        raise TypeError(f"out must be a list of {len(values)} CuPy arrays, one per device")
    for i, (o, v) in enumerate(zip(out, values)):
        check_out(o, shape, dtype, f"out[{i}]", arrays)
        if o.device.id != v.device.id:
            raise ValueError(f"out[{i}] is on GPU {o.device.id} but values[{i}] on GPU "
                             f"{v.device.id}; each result stays on its input's device")
    return list(out)


@own_function
def all_reduce(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
               out: Sequence | None = None, shards: int = 0, groups: Any = None,
               accumulation_fn: Callable | None = None, async_op: bool = False) -> Any:
    """``collectives.all_reduce`` for CuPy arrays, with NCCL and ``async_op``."""
    values, shape, dtype, op = _prepare(values, op)
    request = nccl_request(algorithm, math.prod(shape))
    if request == "auto" and accumulation_fn is None and one_gpu.on_one_gpu(values):
        arrays = _arrays()  # logical devices sharing a GPU: one kernel reads them all
        results = _outputs(arrays, out, values, shape, result_dtype(op, dtype))
        if out is None or all(r is v for r, v in zip(results, values)) or (
                not unsafe_outputs(arrays, values, results)):
            one_gpu.all_reduce(arrays, values, results, op)
            return _handle(results, results, "all_reduce", async_op)
        # (an out that aliases in another way: the library's path, which buffers it)
    if accumulation_fn is not None or not _use_nccl(request, values, dtype, op, groups):
        # the library's algorithms, on the arrays checked above (nothing is checked again)
        results = run_all_reduce(_library_devices(), values, shape, dtype, op, algorithm, out=out,
                                 shards=shards, groups=groups, accumulation_fn=accumulation_fn)
        return _handle(results, results, "all_reduce", async_op)
    arrays = _arrays()
    final = result_dtype(op, dtype)
    results = _outputs(arrays, out, values, shape, final)
    assert request is not None  # _use_nccl said yes
    hybrid = request.startswith("nccl/") and groups is not None
    # NCCL reads and writes through pointers: C-contiguous arrays go as they are (results
    # are C-contiguous: new, or an ``out`` that _outputs checked); new results overlap nothing
    flats = [v if v.flags.c_contiguous and not hybrid else arrays.flat(v) for v in values]
    same = final == dtype and (out is None or not unsafe_outputs(arrays, values, results))
    work = (([r.reshape(-1) for r in results] if hybrid else results) if same
            else [arrays.result((f.size,), dtype, like=f) for f in flats])
    if hybrid:
        _hybrid(arrays, flats, work, op, request.split("/", 1)[1], shards, groups)
    else:
        group.all_reduce(arrays, flats, work, op.wire_op)
    _deliver(arrays, op, work, results, len(values))
    return _handle(results, results, "all_reduce", async_op)


def _hybrid(arrays, flats, work, op: ReduceOp, outer: str, shards: int, groups: Any) -> None:
    """NCCL reduce inside each group, ``outer`` across the groups' first devices, NCCL
    broadcast back inside each group (TensorFlow's "nccl/xring")."""
    layout = resolve_groups(groups, len(flats))
    assert layout is not None  # a hybrid call has groups
    for members in layout:
        if len(members) == 1:
            arrays.copy(work[members[0]], flats[members[0]])
        else:
            group.reduce(arrays, [flats[p] for p in members], work[members[0]], 0, op.wire_op)
    leaders = [work[members[0]] for members in layout]
    if len(leaders) > 1:
        run_all_reduce(_library_devices(), leaders, leaders[0].shape, leaders[0].dtype, op.wire_op,
                       outer, out=leaders, shards=shards)
    for members in layout:
        if len(members) > 1:
            group.broadcast([work[p] for p in members], 0)


def _deliver(arrays, op, work, results, n) -> None:
    for w, r in zip(work, results):
        if op is ReduceOp.MEAN:
            arrays.divide(w, n, out=r.reshape(-1))
        elif w is not r and w.data.ptr != r.data.ptr:
            arrays.copy(r.reshape(-1), w)


@own_function
def reduce(values: Sequence, op: ReduceOp | str = "sum", root: int = 0, algorithm: Any = "auto",
           *, out: Any = None, shards: int = 0, groups: Any = None,
           accumulation_fn: Callable | None = None, async_op: bool = False) -> Any:
    """``collectives.reduce`` for CuPy arrays, with NCCL and ``async_op``."""
    from collectives.runtime.validate import check_root

    values, shape, dtype, op = _prepare(values, op)
    root = check_root(root, len(values))
    request = nccl_request(algorithm, math.prod(shape))
    if (accumulation_fn is not None or (request or "").startswith("nccl/")
            or not _use_nccl(request, values, dtype, op)):
        result = run_reduce(_library_devices(), values, shape, dtype, op, root, algorithm, out=out,
                            shards=shards, groups=groups, accumulation_fn=accumulation_fn)
        return _handle(result, [result], "reduce", async_op)
    arrays = _arrays()
    final = result_dtype(op, dtype)
    result = _outputs(arrays, None if out is None else [out], [values[root]], shape, final)[0]
    flats = [arrays.flat(v) for v in values]
    in_place = result is values[root] or not overlaps(arrays, result, values[root])
    total = (result.reshape(-1) if final == dtype and in_place
             else arrays.result((flats[root].size,), dtype, like=flats[root]))
    group.reduce(arrays, flats, total, root, op.wire_op)
    _deliver(arrays, op, [total], [result], len(values))
    return _handle(result, [result], "reduce", async_op)


@own_function
def batch_all_reduce(value_lists: Sequence[Sequence], op: ReduceOp | str = "sum",
                     algorithm: Any = "auto", *, num_packs: int = 0,
                     agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10,
                     bytes_per_pack: int | None = None, shards: int = 0, groups: Any = None,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES, async_op: bool = False) -> Any:
    """``collectives.batch_all_reduce`` for CuPy arrays: the core's batch loop, each pack
    packed on its device and reduced as ``all_reduce`` (so through NCCL where that applies)."""
    from collectives.algorithms.batch import in_place, plan_batch, start_batch
    from collectives.runtime.validate import check_shards

    if isinstance(value_lists, (str, bytes)) or not isinstance(value_lists, Sequence):
        raise TypeError("value_lists must be a list with, per tensor, one array per device")
    if len(value_lists) == 0:
        return _handle([], [], "batch_all_reduce", async_op)
    tensors = [_prepare(v, op, f"value_lists[{k}]") for k, v in enumerate(value_lists)]
    n = len(tensors[0][0])
    for k, (values, *_rest) in enumerate(tensors):
        if len(values) != n:
            raise ValueError(f"value_lists[{k}] has {len(values)} devices but value_lists[0] "
                             f"has {n}; every tensor needs one array per device")
    parts = plan_batch([t[1] for t in tensors], [t[2] for t in tensors], algorithm,
                       num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                       agg_small_grads_max_group=agg_small_grads_max_group,
                       bytes_per_pack=bytes_per_pack, shards=check_shards(shards),
                       extra_names=("nccl",), bucket_bytes=bucket_bytes,
                       alone_bytes=_arrays().alone_bytes(tensors[0][0][0]))

    def reduce_pack(part, buffers, fresh):
        writes = in_place(fresh, op, buffers[0].dtype)  # (a bucket: reduced where it is)
        return all_reduce(buffers, op, part.spec.algorithm, shards=part.spec.shards,
                          groups=groups, out=buffers if writes else None)

    per_device = [[t[0][d] for t in tensors] for d in range(n)]
    batch = start_batch(per_device, parts, reduce_pack, arrays=_arrays(),
                        home=lambda array: array.device, validated=True)
    results = batch.finish(batch.pending)
    devices = [v for values, *_ in tensors for v in values]
    return _handle(results, devices, "batch_all_reduce", async_op)
