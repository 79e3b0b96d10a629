"""The rounds strategy: each round's steps over whole ranges (right for GPUs and NCCL).

Inputs are first copied into the work buffers (the inputs themselves are never written), then
every round runs between the backend's ``begin_round`` and ``end_round`` hooks, one copy or
one n-ary combine per step: a GPU backend enqueues each on the destination device's stream
and orders rounds with events; a transport that must group its calls per round does so in
the hooks. Steps of one round never read what another writes, so they may run concurrently.
"""

from __future__ import annotations

from .steps import combiners, element_steps


def run(schedule, inputs, work, op, backend, *, granule=1, input_offsets=None,
        accumulation_fn=None) -> None:
    arrays = backend.arrays
    length = len(work[0])
    units = length // granule if granule else 0
    combine, _ = combiners(arrays, op, accumulation_fn)
    starts = list(input_offsets) if input_offsets is not None else [0] * len(work)
    for p, (x, w) in enumerate(zip(inputs, work)):
        if x is not None and x is not w and len(x):
            arrays.copy(w[starts[p]:starts[p] + len(x)], x)
    for index, rnd in enumerate(element_steps(schedule, units, granule)):
        if not rnd:
            continue
        backend.begin_round(index)
        for dst, srcs, a, b, reduce in rnd:
            if reduce:
                combine(work[dst][a:b], [work[q][a:b] for q in srcs])
            else:
                arrays.copy(work[dst][a:b], work[srcs[0]][a:b])
        backend.end_round(index)
