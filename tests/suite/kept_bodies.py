"""A body for every SPMD transport (``bodies.py``'s contract): fused buckets kept from one
batched call to the next (``collectives/algorithms/reuse.py``).

A training loop all-reduces the same gradient list every step and drops the last step's
results: each call then packs into the buckets the last one used and hands back the same
result objects, with this call's values. A result still held (or a view of one) keeps its
values through later calls: those calls take new buckets.
"""

from __future__ import annotations

import gc

import numpy as np

from collectives.ops import ReduceOp
from collectives.tools.reference import exact_inputs, reference
from suite.bodies import BATCH_TENSORS, Report, _case

SUM = ReduceOp.SUM
# the tensors the default buckets fuse: not empty, and not the only one of their dtype (a
# tensor alone in its bucket is reduced as it is, into a new result)
FUSED = {k for k, (d, s) in enumerate(BATCH_TENSORS)
         if np.prod(s) and sum(other == d for other, _ in BATCH_TENSORS) > 1}


def _inputs(n: int, step: int) -> list:
    return [exact_inputs(n, int(np.prod(s)), np.dtype(d), SUM, seed=step * 31 + k, shape=s)
            for k, (d, s) in enumerate(BATCH_TENSORS)]


def kept_buckets(comm, steps: int = 3) -> Report:
    """Steps whose results are dropped reuse the result objects (every tensor of a fused
    bucket reduced in place) and give each step's bits; a result held, and a view of one,
    keep theirs."""
    n, r = comm.size, comm.rank
    report: Report = {}
    last: list | None = None
    for step in range(steps):
        xs = _inputs(n, step)
        got = comm.batch_all_reduce([x[r] for x in xs])
        for k, x in enumerate(xs):
            _case(report, f"kept/{step}/{k}", got[k], reference(x, SUM), SUM)
        ids = [id(g) for k, g in enumerate(got) if k in FUSED]
        if last is not None:
            report[f"kept/{step}/reused"] = (
                None if ids == last else "the last step's results were not reused", None)
        last = ids
        del got
        gc.collect()
    xs = _inputs(n, steps)
    held = comm.batch_all_reduce([x[r] for x in xs])
    view = held[0][1:]  # (a view of a result: its bucket's memory)
    held_view_of, held_rest = reference(xs[0], SUM)[1:], held[1:]
    del held
    for later in range(2):
        comm.batch_all_reduce([x[r] for x in _inputs(n, steps + 1 + later)])
    _case(report, "kept/held/view", view, held_view_of, SUM)
    for k, x in enumerate(xs[1:], 1):
        _case(report, f"kept/held/{k}", held_rest[k - 1], reference(x, SUM), SUM)
    return report
