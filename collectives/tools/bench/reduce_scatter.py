"""reduce_scatter's bench record: participant ``p`` holds block ``p`` of the reduction."""

from __future__ import annotations

import numpy as np

from ...ops import result_dtype
from .common import Runner, reduced_period, tile, zero


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """Block ``participant`` of the reduction of every (n-block) input."""
    c = case.count
    return tile(reduced_period(case, cache), participant * c, (participant + 1) * c)


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """Out of place: each device's block goes to a preallocated output."""
    outs = [kit.zeros(case.count, result_dtype(case.op, case.dtype), p) for p in range(case.n)]
    op = case.op.value
    return Runner(lambda: kit.api.reduce_scatter(inputs, op, algorithm, out=outs), zero(outs),
                  outs)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> Runner:
    """In place: each device's output is its own block of its input (as in nccl-tests)."""
    c = case.count
    bufs = [kit.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]
    blocks = [b[p * c:(p + 1) * c] for p, b in enumerate(bufs)]

    def restore() -> None:
        for b, x in zip(bufs, inputs):
            kit.copyto(b, x)

    op = case.op.value
    return Runner(lambda: kit.api.reduce_scatter(bufs, op, algorithm, out=blocks), restore, blocks)


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner (the SPMD reduce_scatter allocates its result: no in-place runner)."""
    x = case.input(comm.rank)
    return Runner(lambda: [comm.reduce_scatter(x, case.op.value, algorithm)], lambda: None), None
