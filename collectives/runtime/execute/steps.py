"""Pieces both multi-device strategies use: the combine kernels and steps in elements."""

from __future__ import annotations

from ...algorithms.schedule import Schedule
from ...arrays import ArrayBackend
from ...ops import ReduceOp


def combiners(arrays: ArrayBackend, op: ReduceOp, accumulation_fn):
    """``combine(dst, srcs)``: dst = op(dst, *srcs); ``combine_into(dst, first, srcs)``: dst =
    op(first, *srcs). ``accumulation_fn(list) -> array`` replaces the op where given."""
    if accumulation_fn is None:
        return (lambda dst, srcs: arrays.combine(op, dst, srcs),
                lambda dst, first, srcs: arrays.combine_into(op, dst, first, srcs))
    def accumulate(dst, parts):
        total = accumulation_fn(parts)
        if tuple(getattr(total, "shape", ())) != tuple(dst.shape) or not hasattr(total, "dtype"):
            # copying it would broadcast it into every element: a wrong result, silently
            got = (f"shape {tuple(total.shape)}" if hasattr(total, "shape")
                   else f"a {type(total).__name__}")
            raise ValueError(f"accumulation_fn returned {got} for arrays of shape "
                             f"{tuple(dst.shape)}; it must return one array of its inputs' shape "
                             "(e.g. numpy.sum(xs, axis=0), tf.math.add_n)")
        arrays.copy(dst, total)

    return (lambda dst, srcs: accumulate(dst, [dst, *srcs]),
            lambda dst, first, srcs: accumulate(dst, [first, *srcs]))


def element_steps(schedule: Schedule, units: int, granule: int) -> list[list[tuple]]:
    """Per round, ``(dst, srcs, a, b, reduce)`` in elements; empty ranges dropped. Cached per
    length (schedules are cached: a training loop repeats its lengths)."""
    cache = schedule.elements
    steps = cache.get((units, granule))
    if steps is None:
        steps = _element_steps(schedule, units, granule)
        if len(cache) >= 64:
            cache.clear()
        cache[units, granule] = steps
    return steps


def _element_steps(schedule: Schedule, units: int, granule: int) -> list[list[tuple]]:
    den = schedule.den
    out = []
    for rnd in schedule.rounds:
        steps = []
        for dst, srcs, lo, hi, reduce in rnd:
            a, b = lo * units // den * granule, hi * units // den * granule
            if a < b:
                steps.append((dst, srcs, a, b, reduce))
        out.append(steps)
    return out
