"""Mistakes a type checker must catch, one per line marked ``# error``: each must fail mypy
(the test counts them), as ``op="summ"`` and friends do."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import collectives
from collectives import Communicator, Work

# (the assignments are the mistakes: what is assigned is never read)
# ruff: noqa: F841

F32 = npt.NDArray[np.float32]
grads: list[F32] = [np.ones(4, np.float32)] * 2


def mistakes(comm: Communicator, x: F32) -> None:
    collectives.all_reduce(grads, op="summ")  # error
    collectives.all_reduce(grads, "sum", algorithm="rign")  # error
    collectives.all_reduce(grads, "sum", "ring/rign")  # error
    collectives.all_reduce(grads, "sum", [("xrign", 2, -1)])  # error
    collectives.reduce(grads, "avgg", 0)  # error
    comm.all_reduce(x, op="summ")  # error
    comm.all_reduce(x, algorithm="natve")  # error
    comm.reduce_scatter(x, "mean", "rign")  # error
    late: F32 = comm.all_reduce(x, async_op=True)  # error
    now: Work[F32] = comm.all_reduce(x)  # error
    ints: list[npt.NDArray[np.int64]] = collectives.all_reduce(grads)  # error
    one: F32 = collectives.all_reduce(grads)  # error
    comm.all_reduce(x, timeout="30")  # error
    comm.all_reduce(x, shards=2.5)  # error
    collectives.all_reduce(grads, compression="fp8")  # error
    comm.all_reduce(x, compression="bf61")  # error
    comm.explain("all_reduse", x)  # error
    collectives.init("local", calibrate="fersh")  # error
