"""All-reduce over logical devices that share one GPU: one kernel reads every input.

Arrays of several logical devices on one GPU (``collectives.all_reduce([a0, a1, a2, a3])``
with every ``a_i`` on GPU 0) live in one memory, so no schedule needs to move them first:

* SUM, PROD, MAX and MIN (up to ``kernels.MAX_ARITY`` arrays): one kernel reads the ``n``
  inputs and writes their reduction, left to right (``x0 op x1 op ... op x{n-1}``, the order
  ``one_device`` reduces in), into every result. Memory traffic: ``2n`` units of the array's
  size (``n`` reads, ``n`` writes); one launch, whatever the size.
* MEAN (and more arrays): one kernel reduces into the first result; MEAN divides it by ``n``
  (as every path divides); ``n - 1`` device-to-device copies of it go into the other
  results: ``3n - 1`` units, one kernel and ``n - 1`` copies.

(The library's schedules, which copy inputs to one device first, move about ``3n + 1``.)
``algorithm="auto"`` takes this wherever every array is on one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collectives.ops import ReduceOp, result_dtype


def on_one_gpu(values: Sequence) -> bool:
    """Whether every array (more than one) is on the same GPU."""
    device = values[0].device.id
    return len(values) > 1 and all(v.device.id == device for v in values)


def all_reduce(arrays: Any, values: Sequence, results: Sequence, op: ReduceOp) -> None:
    """Reduce ``values`` into every one of ``results``: new arrays, or an ``out`` whose arrays
    are each their own input or share memory with nothing (the caller checked)."""
    n = len(values)
    flats = [arrays.flat(v) for v in values]
    outs = [r.reshape(-1) for r in results]
    dtype = flats[0].dtype
    if result_dtype(op, dtype) == dtype and arrays.spread(op, outs, flats):
        return  # (one kernel wrote every result)
    # the reduction goes into the first result (an input it is its own, at most: each
    # element is read before it is written), unless the result has another dtype
    same = result_dtype(op, dtype) == dtype
    first = outs[0] if same else arrays.result((flats[0].size,), dtype, like=flats[0])
    arrays.combine_into(op.wire_op, first, flats[0], flats[1:])
    if op is ReduceOp.MEAN:
        arrays.divide(first, n, out=outs[0])
    for out in outs[1:]:
        arrays.copy(out, outs[0])
