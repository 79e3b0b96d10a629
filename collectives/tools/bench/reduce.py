"""reduce's bench record: the root holds the whole reduction, the others nothing."""

from __future__ import annotations

import numpy as np

from ...ops import result_dtype
from .common import Runner, cached, reduced_period, tile, zero


def expected(case, participant: int, cache: dict) -> np.ndarray | None:
    """The reduction of every input on the root; None elsewhere."""
    if participant != case.root:
        return None
    return cached(cache, ("full", case), lambda: tile(reduced_period(case, cache), 0, case.count))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """Out of place: the result goes to a preallocated output on the root."""
    out = kit.zeros(case.count, result_dtype(case.op, case.dtype), case.root)
    op, root = case.op.value, case.root
    return Runner(lambda: [kit.api.reduce(inputs, op, root, algorithm, out=out)], zero([out]),
                  [out])


def devices_in_place(case, algorithm: str, inputs: list, kit) -> Runner:
    """In place: ``out`` is the root's input buffer."""
    bufs = [kit.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]

    def restore() -> None:
        for b, x in zip(bufs, inputs):
            kit.copyto(b, x)

    op, root = case.op.value, case.root
    return Runner(lambda: [kit.api.reduce(bufs, op, root, algorithm, out=bufs[root])], restore,
                  [bufs[root]])


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner (the SPMD reduce takes no ``out=``: no in-place runner)."""
    op, root, x = case.op.value, case.root, case.input(comm.rank)
    return Runner(lambda: [comm.reduce(x, op, root, algorithm)], lambda: None), None
