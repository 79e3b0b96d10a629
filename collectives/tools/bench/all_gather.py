"""all_gather's bench record: every participant holds every input, in rank order."""

from __future__ import annotations

import numpy as np

from .common import Runner, cached, zero


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """Every input concatenated, on every participant."""
    return cached(cache, ("moved", case), lambda: np.concatenate(case.inputs()))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """Out of place: each device's result goes to a preallocated output of n blocks."""
    n, c = case.n, case.count
    outs = [kit.zeros(n * c, case.dtype, p) for p in range(n)]
    return Runner(lambda: kit.api.all_gather(inputs, 0, algorithm, out=outs), zero(outs), outs)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> Runner:
    """In place: each device's input is its own block of its output (as in nccl-tests)."""
    n, c = case.n, case.count
    bufs = [kit.zeros(n * c, case.dtype, p) for p in range(n)]
    own = [b[p * c:(p + 1) * c] for p, b in enumerate(bufs)]

    def reset() -> None:
        for o, x in zip(own, inputs):
            kit.copyto(o, x)

    return Runner(lambda: kit.api.all_gather(own, 0, algorithm, out=bufs), reset, bufs)


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner (the SPMD all_gather allocates its result: no in-place runner)."""
    x = case.input(comm.rank)
    return Runner(lambda: [comm.all_gather(x, 0, algorithm)], lambda: None), None
