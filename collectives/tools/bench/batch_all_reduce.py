"""batch_all_reduce's bench record: a size's elements as ``TENSORS`` tensors all-reduced in
one call (a model's gradients, packed), so every participant holds the whole reduction."""

from __future__ import annotations

import numpy as np

from .all_reduce import expected as expected  # the same values as one all-reduce of them all
from .common import Runner

TENSORS = 8  # tensors of one call; fewer when the size has fewer elements


def split(x: np.ndarray) -> list[np.ndarray]:
    """``x`` cut into ``TENSORS`` tensors (views) of nearly equal sizes."""
    return np.array_split(x, min(TENSORS, max(len(x), 1)))


def devices(case, algorithm: str, inputs: list, kit) -> Runner:
    """The tensors of every device as ``value_lists[k][d]``; the results, per device, as
    its list of tensors (batch_all_reduce allocates them: it takes no ``out=``)."""
    n = case.n
    per_device = [split(x) for x in inputs]
    value_lists = [[per_device[d][k] for d in range(n)] for k in range(len(per_device[0]))]
    op = case.op.value

    def call() -> list:
        results = kit.api.batch_all_reduce(value_lists, op, algorithm)
        return [[r[d] for r in results] for d in range(n)]

    return Runner(call, lambda: None)


def devices_in_place(case, algorithm: str, inputs: list, kit) -> None:
    """No in-place form: batch_all_reduce takes no ``out=``."""
    return None


def spmd(comm, case, algorithm: str) -> tuple[Runner, None]:
    """This rank's runner: its tensors in one ``batch_all_reduce`` (no in-place form)."""
    xs, op = split(case.input(comm.rank)), case.op.value
    return Runner(lambda: [comm.batch_all_reduce(xs, op, algorithm)], lambda: None), None
