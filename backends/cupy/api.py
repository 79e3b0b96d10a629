"""The multi-device API for CuPy arrays, with NCCL and ``async_op``.

These functions take the arguments of ``collectives.all_reduce`` and friends, plus
``async_op=True`` (a ``DeviceWork`` handle instead of the result). They check the arrays once
and hand the call to the first runner that takes it (``runners.py``, where ``explain`` says
which and why):

* ``algorithm="nccl"``: NCCL's own collective, one GPU per array (two arrays on one GPU raise
  ``ValueError`` naming it). Dtypes and ops NCCL cannot reduce exactly
  (``nccl_reductions``) run the library's ring instead, which is what the name means to the
  core;
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

from collections.abc import Callable, Sequence
from typing import Any

from collectives.algorithms.fusion import DEFAULT_BUCKET_BYTES
from collectives.ops import ReduceOp
from collectives.runtime.execute.device_calls import check_batch_devices
from collectives.runtime.validate import check_root

from . import runners
from .call_parts import gpu_arrays, handle, nccl_request, prepare
from .devices import own_function

__all__ = ["all_reduce", "batch_all_reduce", "nccl_request", "reduce"]


@own_function
def all_reduce(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
               out: Sequence | None = None, shards: int = 0, groups: Any = None,
               accumulation_fn: Callable | None = None, shared_result: bool = False,
               async_op: bool = False) -> Any:
    """``collectives.all_reduce`` for CuPy arrays, with NCCL and ``async_op``: checked once,
    then run by the first of the runners that takes it (``runners.py``). ``shared_result``
    (one buffer's views for every device) needs devices that share memory: refused."""
    if shared_result:
        raise ValueError("shared_result=True needs devices that share memory; CuPy's GPUs do "
                         "not (each gets a result of its own): pass shared_result=False")
    values, shape, dtype, op = prepare(values, op)
    call = runners.DeviceCall("all_reduce", values, shape, dtype, op, algorithm, out=out,
                              shards=shards, groups=groups, accumulation_fn=accumulation_fn)
    runner, _ = runners.choose(call)
    results = runner.run(call)
    return handle(results, results, "all_reduce", async_op)


@own_function
def reduce(values: Sequence, op: ReduceOp | str = "sum", root: int = 0, algorithm: Any = "auto",
           *, out: Any = None, shards: int = 0, groups: Any = None,
           accumulation_fn: Callable | None = None, async_op: bool = False) -> Any:
    """``collectives.reduce`` for CuPy arrays, with NCCL and ``async_op`` (as ``all_reduce``)."""
    values, shape, dtype, op = prepare(values, op)
    call = runners.DeviceCall("reduce", values, shape, dtype, op, algorithm, out=out,
                              root=check_root(root, len(values)), shards=shards, groups=groups,
                              accumulation_fn=accumulation_fn)
    runner, _ = runners.choose(call)
    result = runner.run(call)
    return handle(result, [result], "reduce", async_op)


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
        return handle([], [], "batch_all_reduce", async_op)
    tensors = [prepare(v, op, f"value_lists[{k}]") for k, v in enumerate(value_lists)]
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
                       alone_bytes=gpu_arrays().alone_bytes(tensors[0][0][0]))

    def reduce_pack(part, buffers, fresh):
        writes = in_place(fresh, op, buffers[0].dtype)  # (a bucket: reduced where it is)
        return all_reduce(buffers, op, part.spec.algorithm, shards=part.spec.shards,
                          groups=groups, out=buffers if writes else None)

    per_device = [[t[0][d] for t in tensors] for d in range(n)]
    check_batch_devices(gpu_arrays(), per_device)
    batch = start_batch(per_device, parts, reduce_pack, arrays=gpu_arrays(),
                        home=lambda array: array.device, validated=True)
    results = batch.finish(batch.pending)
    devices = [v for values, *_ in tensors for v in values]
    return handle(results, devices, "batch_all_reduce", async_op)
