"""broadcast's bench record: every participant holds the root's input."""

from __future__ import annotations

import numpy as np

from .common import Runner, cached, zero


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """The root's input, on every participant."""
    return cached(cache, ("moved", case), lambda: case.input(case.root))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """Out of place: the root's input goes to preallocated outputs."""
    n, root = case.n, case.root
    outs = [kit.zeros(case.count, case.dtype, p) for p in range(n)]
    return Runner(lambda: kit.api.broadcast(inputs[root], n, algorithm, out=outs), zero(outs),
                  outs)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> Runner:
    """In place: ``out`` is every device's input buffer, the root's included."""
    n, root = case.n, case.root
    bufs = [kit.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]

    def restore() -> None:
        for b, x in zip(bufs, inputs):
            kit.copyto(b, x)

    return Runner(lambda: kit.api.broadcast(bufs[root], n, algorithm, out=bufs), restore, bufs)


def spmd(comm, case, algorithm: str) -> tuple[Runner, Runner]:
    """This rank's out-of-place and in-place runners (non-roots pass no input)."""
    root = case.root
    x = case.input(root) if comm.rank == root else None
    out = np.zeros(case.count, case.dtype)
    mine = np.zeros(case.count, case.dtype)  # zeros while timed, like the devices' buffers

    def restore() -> None:
        if x is not None:
            np.copyto(mine, x)

    oop = Runner(lambda: [comm.broadcast(x, root, algorithm, out=out)], zero([out]), [out])
    return oop, Runner(lambda: [comm.broadcast(mine if x is not None else None, root,
                                               algorithm, out=mine)], restore, [mine])
