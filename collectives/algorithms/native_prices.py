"""What a transport's own collective (MPI's, the shared window's) costs: its measured times
where calibration took them, interpolated at the call's bytes, else the plan MPI libraries
run priced at C's overheads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from .cost import Fabric, Placement, Prediction
from .sampling import predict
from .schedule import Collective


def interpolate(points: Sequence[tuple[int, float]], nbytes: int) -> float:
    """Seconds at ``nbytes`` from measured ``(nbytes, seconds)`` points: log-log between
    them, the smallest below them, the last segment's seconds per byte above them."""
    points = sorted(points)
    nbytes = max(nbytes, 1)
    if nbytes <= points[0][0] or len(points) == 1:
        return points[0][1] if nbytes <= points[0][0] else points[0][1] * nbytes / points[0][0]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    (b0, t0), (b1, t1) = points[-2], points[-1]
    return t1 + (nbytes - b1) * max(t1 - t0, 0.0) / (b1 - b0)


NATIVE_AS = {Collective.ALL_REDUCE: "rechd", Collective.REDUCE: "tree",
             Collective.BROADCAST: "tree", Collective.ALL_GATHER: "rechd",
             Collective.REDUCE_SCATTER: "rechd"}


def predict_native(method: str, collective: Collective, size: int, nbytes: int, fabric: Fabric,
                   placement: Placement | None = None, *, dtype: str = "float32",
                   payload: int | None = None,
                   pricing: Callable[[str, Fabric], Prediction] | None = None
                   ) -> Prediction | None:
    """A transport's own collective (``method``: "native", "shm"): its measured times where
    the fabric has them (interpolated at ``payload``, the call's own bytes), else, for
    "native", the plan MPI libraries run (Rabenseifner's halving-doubling, a binomial tree)
    at C's overheads; None for a method never measured. ``pricing(name, fabric)`` prices that
    plan instead of ``predict`` (the closed forms, for counts without a placement)."""
    points = fabric.timings(method, collective, size)
    if points:
        seconds = interpolate(points, payload if payload is not None else nbytes)
        return Prediction(method, collective, size, nbytes, seconds, note="measured")
    if method != "native" or collective not in NATIVE_AS:
        return None
    name = NATIVE_AS[collective]
    if pricing is not None:
        guess = pricing(name, native_fallback(fabric))
    else:
        guess = predict(collective, name, size, nbytes, native_fallback(fabric), placement,
                        dtype=dtype)
    guess.algorithm, guess.note = method, f"modelled as {name} at native overheads"
    return guess


def native_fallback(fabric: Fabric) -> Fabric:
    """The fabric a native (C) collective runs on: the links, without Python's overheads."""
    return replace(fabric, overhead=0.0, round_overhead=fabric.native_overhead, serial=False)


__all__ = ["NATIVE_AS", "interpolate", "native_fallback", "predict_native"]
