"""The tiles strategy: the whole schedule runs tile by tile (right for CPUs).

Because every step is element-wise (see ``collectives.algorithms.schedule``), each cache-sized tile can
go through all rounds while it is hot, and tiles run in parallel on the backend's workers. So
any algorithm reads each input once and writes each output once from main memory.

Whole-buffer inputs are not copied in up front: until a participant's tile is first written,
reads of it go straight to its input, and its first reduce reads the input as the left
operand. That saves one full pass over memory per participant.
"""

from __future__ import annotations

from .steps import combiners, element_steps


def run(schedule, inputs, work, op, backend, *, granule=1, input_offsets=None,
        accumulation_fn=None) -> None:
    arrays = backend.arrays
    length = len(work[0])
    units = length // granule if granule else 0
    plan = element_steps(schedule, units, granule)
    combine, combine_into = combiners(arrays, op, accumulation_fn)
    starts = list(input_offsets) if input_offsets is not None else [0] * len(work)
    lazy = input_offsets is None and all(x is not None for x in inputs)

    def settle(rnd, a, b, ready):
        # A participant whose tile this round only partly wrote would mix work and input:
        # copy the rest of its input in now, so from here on its work tile is whole.
        written: dict[int, list[tuple[int, int]]] = {}
        for dst, _, lo, hi, _ in rnd:
            lo, hi = max(lo, a), min(hi, b)
            if lo < hi and not ready[dst]:
                written.setdefault(dst, []).append((lo, hi))
        for p, spans in written.items():
            at = a
            for lo, hi in sorted(spans):
                if at < lo:
                    arrays.copy(work[p][at:lo], inputs[p][at:lo])
                at = max(at, hi)
            if at < b:
                arrays.copy(work[p][at:b], inputs[p][at:b])
            ready[p] = True

    def run_tile(a: int, b: int) -> None:
        ready = [x is w for x, w in zip(inputs, work)] if lazy else [True] * len(work)
        if not lazy:
            for p, (x, w) in enumerate(zip(inputs, work)):
                if x is None or x is w:
                    continue
                lo, hi = max(a, starts[p]), min(b, starts[p] + len(x))
                if lo < hi:
                    arrays.copy(w[lo:hi], x[lo - starts[p]:hi - starts[p]])
        for rnd in plan:
            for dst, srcs, lo, hi, reduce in rnd:
                lo, hi = max(lo, a), min(hi, b)
                if lo >= hi:
                    continue
                sources = [(work[q] if ready[q] else inputs[q])[lo:hi] for q in srcs]
                target = work[dst][lo:hi]
                if reduce:
                    if ready[dst]:
                        combine(target, sources)
                    else:
                        combine_into(target, inputs[dst][lo:hi], sources)
                else:
                    arrays.copy(target, sources[0])
            if lazy:
                settle(rnd, a, b, ready)
        for p in range(len(work)):
            if not ready[p]:  # never written: the result is the input itself
                arrays.copy(work[p][a:b], inputs[p][a:b])

    backend.map_parallel(run_tile, length, work[0].itemsize if length else 1)
