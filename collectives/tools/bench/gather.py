"""gather's bench record: the root holds every input, one row per participant; the others
nothing."""

from __future__ import annotations

import numpy as np

from .common import Runner, cached


def expected(case, participant: int, cache: dict) -> np.ndarray | None:
    """Every input in participant order on the root, one row each; None elsewhere."""
    if participant != case.root:
        return None
    return cached(cache, ("stacked", case), lambda: np.stack(case.inputs()))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """The multi-device gather allocates its result on the root (it takes no ``out=``)."""
    root = case.root
    return Runner(lambda: [kit.api.gather(inputs, root)], lambda: None)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> None:
    """No in-place form: the multi-device gather takes no ``out=``."""
    return None


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner (the SPMD gather allocates its result: no in-place runner)."""
    x, root = case.input(comm.rank), case.root
    return Runner(lambda: [comm.gather(x, root, algorithm)], lambda: None), None
