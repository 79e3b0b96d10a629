"""all_to_all's bench record: participant ``j`` holds block ``j`` of every input, in
participant order."""

from __future__ import annotations

import numpy as np

from .common import Runner, cached


def expected(case, participant: int, cache: dict) -> np.ndarray:
    """Block ``participant`` of each participant's input, concatenated in participant order."""
    inputs = cached(cache, ("inputs", case), lambda: np.stack(case.inputs()))
    c = case.count
    return np.ascontiguousarray(inputs[:, participant * c:(participant + 1) * c]).reshape(-1)


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """The multi-device all-to-all allocates its results (it takes no ``out=``)."""
    return Runner(lambda: kit.api.all_to_all(inputs), lambda: None)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> None:
    """No in-place form: the multi-device all-to-all takes no ``out=``."""
    return None


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner (the SPMD all-to-all allocates its result: no in-place runner)."""
    x = case.input(comm.rank)
    return Runner(lambda: [comm.all_to_all(x, None, algorithm)], lambda: None), None
