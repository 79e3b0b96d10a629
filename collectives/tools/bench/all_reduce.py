"""all_reduce's bench record: every participant holds the whole reduction."""

from __future__ import annotations

import numpy as np

from ...ops import result_dtype
from .common import Runner, cached, reduced_period, tile, zero


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """The reduction of every input, the same on every participant."""
    return cached(cache, ("full", case), lambda: tile(reduced_period(case, cache), 0, case.count))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """Out of place: results go to preallocated outputs; the inputs stay untouched."""
    outs = [kit.zeros(case.count, result_dtype(case.op, case.dtype), p) for p in range(case.n)]
    op = case.op.value
    return Runner(lambda: kit.api.all_reduce(inputs, op, algorithm, out=outs), zero(outs), outs)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> Runner:
    """In place: ``out`` is each device's input buffer."""
    bufs = [kit.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]

    def restore() -> None:
        for b, x in zip(bufs, inputs):
            kit.copyto(b, x)

    op = case.op.value
    return Runner(lambda: kit.api.all_reduce(bufs, op, algorithm, out=bufs), restore, bufs)


def spmd(comm, case, algorithm: str) -> tuple[Runner, Runner | None]:
    """This rank's out-of-place and in-place runners (no in-place one where the result's
    dtype differs from the input's: integer MEAN)."""
    op, final, x = case.op.value, result_dtype(case.op, case.dtype), case.input(comm.rank)
    out = np.zeros(case.count, final)
    oop = Runner(lambda: [comm.all_reduce(x, op, algorithm, out=out)], zero([out]), [out])
    if final != case.dtype:
        return oop, None
    mine = np.zeros_like(x)  # zeros while timed; the checked call gets x
    return oop, Runner(lambda: [comm.all_reduce(mine, op, algorithm, out=mine)],
                       lambda: np.copyto(mine, x), [mine])
