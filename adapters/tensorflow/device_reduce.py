"""What the device path runs on a kit's arrays (``kits``): arrays in, arrays out, no TensorFlow.

The counterpart of ``host`` for arrays that stay on their devices (CuPy arrays on GPUs):

* ``all_reduce_batch``: every device gets each tensor's result, on its own device
  (``collectives.batch_all_reduce``; on CuPy arrays NCCL where the spec says ``"nccl"`` and
  each device has a GPU of its own);
* ``reduce_batch``: each tensor's result on device ``root`` only (the route of
  ``ReductionToOneDevice``, and of destinations that are not the value's devices);
* ``reduce_batch_across_workers``: the local total on ``root``, then every worker's through
  a ``Communicator`` whose transport reads host memory (MPI): the totals are staged through
  the kit's host buffers (pinned for CuPy) and come back into the same device arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

import collectives
from collectives.algorithms.batch import plan_batch, start_batch
from collectives.algorithms.spec import SpecRange, parse_spec
from collectives.hints import Algorithm, Op
from collectives.ops import ReduceOp

from .host import Packing, cross_worker_spec, local_algorithm, worker_division
from .kits import PinnedBuffer

__all__ = ["all_reduce_batch", "reduce_batch", "reduce_batch_across_workers"]

_UNPACKED = Packing()


def _spec(spec) -> list:
    return list(spec) if isinstance(spec, (list, tuple)) and spec and all(
        isinstance(r, SpecRange) for r in spec) else list(parse_spec(spec))


def all_reduce_batch(kit, values: Sequence[Sequence], op: ReduceOp | str, spec, *,
                     packing: Packing = _UNPACKED, groups=None) -> list[list]:
    """``results[k][d]``: tensor k reduced over every device, on device d."""
    if not values:
        return []
    # (op: any spelling ReduceOp.parse takes)
    return collectives.batch_all_reduce([list(v) for v in values], cast(Op, op), _spec(spec),
                                        groups=groups, **packing.kwargs())


def reduce_batch(kit, values: Sequence[Sequence], op: ReduceOp | str, spec, *, root: int = 0,
                 packing: Packing = _UNPACKED, groups=None) -> list:
    """``results[k]``: tensor k reduced over every device, on device ``root``.

    Each range of the spec packs its tensors on each device (the packing knobs), reduces each
    pack onto ``root`` with its algorithm, and unpacks there.
    """
    if not values:
        return []
    n = len(values[0])
    for k, v in enumerate(values):
        if len(v) != n:
            raise ValueError(f"tensor {k} has {len(v)} per-device values but tensor 0 has {n}")
    shapes = [tuple(v[0].shape) for v in values]
    dtypes = [np.dtype(v[0].dtype) for v in values]
    parts = plan_batch(shapes, dtypes, _spec(spec), extra_names=kit.extra_names,
                       **packing.kwargs())

    def reduce_pack(part, buffers, fresh):
        return [collectives.reduce(buffers, op, root, part.spec.algorithm,
                                   shards=part.spec.shards, groups=groups)]

    per_device = [[v[d] for v in values] for d in range(n)]
    batch = start_batch(per_device, parts, reduce_pack, arrays=kit.arrays, home=kit.home)
    return [r[0] for r in batch.finish(batch.pending)]


def reduce_batch_across_workers(kit, values: Sequence[Sequence], op: ReduceOp | str, spec, comm,
                                *, root: int = 0, packing: Packing = _UNPACKED,
                                workers_sum: str = "mean", timeout: float | None = None,
                                buffer: PinnedBuffer | None = None,
                                compression: str | None = None) -> list:
    """``host.reduce_batch_across_workers`` for device arrays; results on device ``root``.

    1. each tensor is summed onto ``root`` over the local devices with the A of its spec
       range's "A/B" (the name itself for a one-level name);
    2. the local totals are staged to the host (into ``buffer``, pinned, for CuPy), go
       through ``comm.batch_all_reduce`` with the cross-worker spec and the packing knobs
       (the same calls as the host path, ``compression`` included), and are copied back
       into the device arrays of step 1;
    3. MEAN divides by the global device count; floating SUMs by the worker count when
       ``workers_sum="mean"`` (before step 2 where compression carries the total:
       ``host.worker_division``). (The device path carries floating tensors only.)
    """
    op = ReduceOp.parse(op)
    if not values:
        return []
    ranges = _spec(spec)
    n = len(values[0])
    totals = []
    for v in values:
        size = int(np.prod(v[0].shape))
        rng = next(r for r in ranges if r.limit < 0 or size <= r.limit)
        totals.append(collectives.reduce(list(v), ReduceOp.SUM, root,
                                         cast(Algorithm, local_algorithm(rng.algorithm))))
    division = worker_division(op, [np.dtype(t.dtype) for t in totals], n, comm.size,
                               workers_sum, compression)
    totals = [kit.divide(t, d) if early else t for t, (d, early) in zip(totals, division)]
    hosts = kit.stage(totals, buffer if buffer is not None else PinnedBuffer())
    reduced = comm.batch_all_reduce(hosts, ReduceOp.SUM, cross_worker_spec(ranges),
                                    timeout=timeout, compression=compression,
                                    **packing.kwargs())
    totals = [kit.unstage(r, like) for r, like in zip(reduced, totals)]
    return [kit.divide(t, d) if d != 1 and not early else t
            for t, (d, early) in zip(totals, division)]
