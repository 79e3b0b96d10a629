"""What the TensorFlow adapter runs on the host: NumPy arrays in, NumPy arrays out.

Nothing here imports TensorFlow. ``cross_device_ops`` hands these functions NumPy views of the
per-device tensors (directly in eager mode, through one ``tf.numpy_function`` per batch inside
``tf.function``) and places what they return on the destination devices.

The logical devices of one process share its memory, so a batch is reduced *once*: the
algorithm's reduce schedule onto device 0, and that one result is then shared by every
destination (``tf.identity`` between logical CPU devices hands over the buffer, as TensorFlow's
own ``ReductionToOneDevice`` does). The values equal the algorithm's all-reduce bit for bit:
a reduce is the all-reduce's reduce phase plus copies. Across workers (one process each), the
local totals then go through the ``Communicator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import numpy as np

import collectives
from collectives.algorithms.batch import plan_batch, start_batch
from collectives.algorithms.packing import make_plan
from collectives.algorithms.spec import SpecRange, parse_spec
from collectives.arrays import NUMPY
from collectives.compression import for_batch, requested, wire_name
from collectives.hints import Algorithm
from collectives.ops import BFLOAT16, ReduceOp, result_dtype
from collectives.runtime.validate import check_op, same_layout
from collectives.widened import integer_mean

from .agreement import agree, signature

__all__ = [
    "Packing",
    "check_packing",
    "cross_worker_spec",
    "gather_ragged",
    "local_algorithm",
    "reduce_batch",
    "reduce_batch_across_workers",
    "reduce_to_root",
]

Groups = Sequence[Sequence[int]] | int | Callable[[int], Sequence[Sequence[int]] | None] | None


@dataclass(frozen=True)
class Packing:
    """The packing knobs of ``collectives.batch_all_reduce``, as one value. TensorFlow's
    classes pack only where their own knobs say so: no fusion buckets (``bucket_bytes=0``)."""

    num_packs: int = 0
    agg_small_grads_max_bytes: int = 0
    agg_small_grads_max_group: int = 10
    bytes_per_pack: int | None = None
    bucket_bytes: int = 0

    def kwargs(self) -> dict:
        return {"num_packs": self.num_packs,
                "agg_small_grads_max_bytes": self.agg_small_grads_max_bytes,
                "agg_small_grads_max_group": self.agg_small_grads_max_group,
                "bytes_per_pack": self.bytes_per_pack, "bucket_bytes": self.bucket_bytes}


def _groups_for(groups: Groups, n: int):
    return groups(n) if callable(groups) else groups


def reduce_to_root(values: Sequence[np.ndarray], op: ReduceOp | str = "sum", algorithm: str = "auto",
                   *, shards: int = 0, groups: Groups = None,
                   accumulation_fn: Callable | None = None,
                   empty: Callable = np.empty) -> np.ndarray:
    """``collectives.reduce(values, op, root=0, algorithm)`` into ``empty(shape, dtype)``.

    The core's reduce, with the result in a buffer the adapter allocates (an aligned one, that
    TensorFlow can adopt without a copy); the core reuses its work buffers across calls.
    """
    if len(values) == 0:
        raise ValueError("values is empty; pass one array per device")
    shape, dtype = same_layout(values)
    parsed = check_op(op, dtype)
    out = empty(shape, result_dtype(parsed, dtype))
    # (a name the spec parser checked, or the caller's: the core checks it too)
    return collectives.reduce(values, parsed, 0, cast(Algorithm, algorithm), out=out, shards=shards,
                              groups=_groups_for(groups, len(values)),
                              accumulation_fn=accumulation_fn)


def check_packing(packing: Packing) -> None:
    """Raise now for packing knobs the core would reject at the first batch."""
    make_plan([], [], **packing.kwargs())


@lru_cache(maxsize=256)
def _plan(shapes: tuple, dtypes: tuple, spec: tuple[SpecRange, ...], packing: Packing, shards: int):
    # A training loop reduces the same batch every step: plan it once.
    return plan_batch(list(shapes), list(dtypes), list(spec), shards=shards, **packing.kwargs())


def _spec_key(spec) -> tuple[SpecRange, ...]:
    if isinstance(spec, tuple) and spec and all(isinstance(r, SpecRange) for r in spec):
        return spec
    return tuple(parse_spec(spec))


def reduce_batch(values: Sequence[Sequence[np.ndarray]], op: ReduceOp | str = "sum",
                 spec="auto", *, packing: Packing = Packing(), shards: int = 0,
                 groups: Groups = None, empty: Callable = np.empty) -> list[np.ndarray]:
    """Reduce tensor ``k``'s per-device arrays ``values[k]``: one result per tensor, in order.

    ``spec`` is any all-reduce spec of ``collectives.algorithms.spec`` (its size ranges pick each tensor's
    algorithm and shards); ``packing`` packs each range's tensors into few buffers first.
    """
    if not values:
        return []
    n = len(values[0])
    for k, v in enumerate(values):
        if len(v) != n:
            raise ValueError(f"tensor {k} has {len(v)} per-device values but tensor 0 has {n}")
    shapes = tuple(tuple(np.shape(v[0])) for v in values)
    dtypes = tuple(np.dtype(v[0].dtype) for v in values)
    parts = _plan(shapes, dtypes, _spec_key(spec), packing, shards)

    def reduce_pack(part, buffers, fresh):
        return [reduce_to_root(buffers, op, part.spec.algorithm, shards=part.spec.shards,
                               groups=groups, empty=empty)]

    per_device = [[v[d] for v in values] for d in range(n)]
    batch = start_batch(per_device, parts, reduce_pack, arrays=NUMPY)
    return [r[0] for r in batch.finish(batch.pending)]


def local_algorithm(algorithm: str) -> str:
    """The algorithm a worker runs among its own devices: A of "A/B", else the name itself."""
    return algorithm.split("/")[0] if "/" in algorithm else algorithm


def cross_worker_spec(ranges: Sequence[SpecRange]) -> list[tuple[str, int, int]]:
    """The spec the workers run among themselves: B of every "A/B" range, shards and limits kept."""
    return [(r.algorithm.split("/")[-1], r.shards, r.limit) for r in ranges]


def reduce_batch_across_workers(values: Sequence[Sequence[np.ndarray]], op: ReduceOp | str, spec,
                                comm, *, packing: Packing = Packing(), workers_sum: str = "mean",
                                timeout: float | None = None, empty: Callable = np.empty,
                                compression: str | None = None,
                                agreed: bool = False) -> list[np.ndarray]:
    """Reduce over this worker's devices, then over every worker through ``comm``.

    1. each tensor is reduced over the local devices with the local algorithm of its spec
       range (A of "A/B"), as a SUM;
    2. the local totals go through ``comm.batch_all_reduce`` with the cross-worker spec (B of
       "A/B", the range's shards and limit) and the packing knobs, ``compression``
       ("fp16", "bf16") carrying the float32 and float64 totals narrower;
    3. MEAN divides by the global device count (workers x local devices); SUM of floating
       values divides by the worker count when ``workers_sum="mean"`` (see
       ``MultiWorkerAllReduce``), and is the plain total when ``workers_sum="sum"``. A total
       that compression carries is divided before step 2 (``worker_division``).

    An integer MEAN is summed in float64 from step 1 on, as the core's is
    (``collectives.widened``): summed in its own dtype it wrapped across workers where one
    process over the same devices did not (int8 100s gave -28.0), and it never travels
    compressed: a call of its own where compression is asked for, after the workers agree on
    the whole list (which tensors go in which call depends on it, and a worker whose list
    differed would pair its compressed call with a peer's, quietly), unless ``agreed``: the
    caller's workers agreed on it already (the adapter's batches do).

    Every worker must bring the same number of devices and tensors of the same shapes.
    """
    op = ReduceOp.parse(op)
    if not values:
        return []
    ranges = parse_spec(spec)
    n = len(values[0])
    sizes = [int(np.prod(np.shape(v[0]))) for v in values]
    dtypes = [np.dtype(v[0].dtype) for v in values]
    wide = [integer_mean(op, d) for d in dtypes]
    locals_ = []
    for k, v in enumerate(values):
        rng = next(r for r in ranges if r.limit < 0 or sizes[k] <= r.limit)
        parts = [np.asarray(x, np.float64) for x in v] if wide[k] else list(v)
        locals_.append(reduce_to_root(parts, ReduceOp.SUM, local_algorithm(rng.algorithm),
                                      empty=empty))
    division = worker_division(op, dtypes, n, comm.size, workers_sum, compression)
    locals_ = [t / d if early else t for t, (d, early) in zip(locals_, division)]
    exact = []
    if op is ReduceOp.MEAN and requested(compression):
        if not agreed:
            agree(comm, signature({"call": "reduce_batch_across_workers", "op": op.name,
                                   "compression": wire_name(str(compression)),
                                   "tensors": tuple(
                                       ("dense", d.name, tuple(np.shape(v[0])))
                                       for d, v in zip(dtypes, values))}), timeout=timeout)
        exact = [k for k in range(len(values)) if wide[k]]
    carried = [k for k in range(len(values)) if k not in exact]
    totals: list = [None] * len(values)
    for ks, carrying in ((carried, compression), (exact, None)):
        if ks:
            reduced = comm.batch_all_reduce([locals_[k] for k in ks], ReduceOp.SUM,
                                            cross_worker_spec(ranges), timeout=timeout,
                                            compression=carrying, **packing.kwargs())
            for k, total in zip(ks, reduced):
                totals[k] = total
    out = []
    for total, (d, early) in zip(totals, division):
        if d != 1 and not early:  # (integers divide into float64, as NumPy's true division)
            total = (np.true_divide(total, d) if op is ReduceOp.MEAN else
                     np.true_divide(total, d, out=total, casting="unsafe"))
        out.append(total)
    return out


def worker_division(op: ReduceOp, dtypes: Sequence[np.dtype], devices: int, workers: int,
                    workers_sum: str, compression: str | None) -> list[tuple[int, bool]]:
    """Per tensor, what its total over every worker is divided by (MEAN's: every device,
    workers x devices; a floating SUM's: the workers where ``workers_sum="mean"``; else 1),
    and whether before it crosses the workers: where ``compression`` carries it in a narrower
    float, whose sum over the workers may pass that float's range (65504 for float16) where
    the mean does not, as the core's compressed MEAN divides first. (It was divided after: a
    mean of 20000 over 2 workers came back inf.)"""
    if op is ReduceOp.MEAN:
        divisors = [devices * workers] * len(dtypes)
    else:
        divisors = [workers if workers_sum == "mean" and _is_inexact(d) and workers > 1 else 1
                    for d in dtypes]
    carried = for_batch(compression, ReduceOp.SUM, dtypes)
    return [(d, c is not None and d != 1) for d, c in zip(divisors, carried)]


def gather_ragged(comm, x: np.ndarray, axis: int = 0, *, timeout: float | None = None) -> np.ndarray:
    """Concatenation over ranks of ``x`` along ``axis``, whose size along ``axis`` may differ.

    The sizes are gathered first; every rank then pads its block to the largest size so one
    ``all_gather`` of equal shapes carries them, and each rank's padding is cut off again.
    """
    x = np.asarray(x)
    moved = np.moveaxis(x, axis, 0) if x.ndim else x.reshape(1)
    rows = comm.all_gather(np.array([moved.shape[0]], np.int64), timeout=timeout)
    most = int(rows.max()) if rows.size else 0
    padded = np.zeros((most, *moved.shape[1:]), moved.dtype)
    padded[:moved.shape[0]] = moved
    gathered = comm.all_gather(padded, timeout=timeout).reshape(comm.size, most, *moved.shape[1:])
    joined = np.concatenate([gathered[r, :int(rows[r])] for r in range(comm.size)], axis=0)
    return np.moveaxis(joined, 0, axis) if x.ndim else joined


def _is_inexact(dtype: np.dtype) -> bool:
    """Floating or complex, bfloat16 included (NumPy files ml_dtypes' bfloat16 as kind 'V')."""
    return dtype.kind in "fc" or dtype == BFLOAT16
