"""scatter's bench record: participant ``p`` holds block ``p`` of the root's input."""

from __future__ import annotations

import numpy as np

from .common import Runner, cached


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """Block ``participant`` of the root's input."""
    root = cached(cache, ("root", case), lambda: case.input(case.root))
    return root[participant * case.count:(participant + 1) * case.count]


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """The root's input as ``n`` rows, one to each device (the multi-device scatter allocates
    its results: it takes no ``out=``)."""
    n = case.n
    rows = inputs[case.root].reshape(n, case.count)
    return Runner(lambda: kit.api.scatter(rows, n), lambda: None)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> None:
    """No in-place form: the multi-device scatter takes no ``out=``."""
    return None


def spmd(comm, case, algorithm: str) -> tuple[Runner, Runner]:
    """This rank's out-of-place runner (non-roots pass no input, ``out`` one row) and its
    in-place one (``out`` is the root's own row of its input, as in nccl-tests)."""
    n, c, root = case.n, case.count, case.root
    x = case.input(root).reshape(n, c) if comm.rank == root else None
    out = np.zeros(c, case.dtype)
    oop = Runner(lambda: [comm.scatter(x, root, algorithm, out=out)], lambda: out.fill(0), [out])
    mine = np.zeros((n, c), case.dtype) if x is not None else None
    own = mine[root] if mine is not None else np.zeros(c, case.dtype)

    def restore() -> None:
        if x is not None:
            assert mine is not None  # made when x is
            np.copyto(mine, x)

    return oop, Runner(lambda: [comm.scatter(mine, root, algorithm, out=own)], restore, [own])
