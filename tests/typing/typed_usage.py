"""A program that uses the API as its users do: it must pass mypy, and it runs.

Each ``assert_type`` is what a type checker must see: NumPy arrays in give NumPy arrays out,
``async_op=True`` gives a ``Work`` whose ``wait()`` gives the same, a communicator's calls keep
the array type of ``x``.
"""

from __future__ import annotations

from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import collectives
from collectives import Communicator, ReduceOp, Work

F32 = npt.NDArray[np.float32]


def multi_device() -> None:
    grads: list[F32] = [np.full(8, float(d), np.float32) for d in range(4)]
    summed = collectives.all_reduce(grads, "sum", "ring")
    assert_type(summed, list[F32])
    handle = collectives.all_reduce(grads, ReduceOp.MEAN, "pscpu/pscpu", groups=2, async_op=True)
    assert_type(handle, Work[list[F32]])
    assert_type(handle.wait(), list[F32])
    root = collectives.reduce(grads, "max", root=1, algorithm="tree")
    assert_type(root, F32)
    assert_type(collectives.broadcast(grads[0], 4), list[F32])
    assert_type(collectives.all_gather(grads, 0, "rechd"), list[F32])
    assert_type(collectives.reduce_scatter(grads, "min"), list[F32])
    assert_type(collectives.gather(grads, 0), F32)
    rows: F32 = np.zeros((4, 2), np.float32)
    assert_type(collectives.scatter(rows, 4), list[F32])
    assert_type(collectives.all_to_all(grads), list[F32])
    batch = collectives.batch_all_reduce([grads, grads], "sum", "pscpu:2k:xring", num_packs=2)
    assert_type(batch, list[list[F32]])
    ranged = collectives.all_reduce(grads, "sum", [("pscpu", 1, 1024), ("xring", 2, -1)])
    assert_type(ranged, list[F32])
    squeezed = collectives.all_reduce(grads, "mean", compression="fp16")
    assert_type(squeezed, list[F32])
    assert_type(collectives.batch_all_reduce([grads], compression="bf16"), list[list[F32]])
    assert float(summed[0][0]) == 6.0 and float(root[0]) == 3.0 and len(batch) == 2


def step(comm: Communicator) -> float:
    x: F32 = np.full(4, comm.rank, np.float32)
    total = comm.all_reduce(x, "sum", "ring", timeout=30)
    assert_type(total, F32)
    pending = comm.all_reduce(x, async_op=True)
    assert_type(pending, Work[F32])
    assert_type(pending.wait(), F32)
    assert_type(comm.reduce(x, "prod", root=0), F32 | None)
    assert_type(comm.broadcast(x, 0), F32)
    assert_type(comm.all_gather(x), F32)
    assert_type(comm.reduce_scatter(x, "mean"), F32)
    assert_type(comm.gather(x), F32 | None)
    assert_type(comm.all_to_all(x), F32)
    assert_type(comm.batch_all_reduce([x, x]), list[F32])
    assert_type(comm.batch_all_reduce([x, x], async_op=True), Work[list[F32]])
    buckets = comm.buckets([x, x], "sum", bucket_bytes=1 << 20)
    buckets.ready(1, x)
    buckets.ready(0, x)
    assert_type(buckets.wait(), list[F32])
    assert_type(comm.all_reduce(x, algorithm="tree"), F32)
    assert_type(comm.all_reduce(x, "sum", compression="fp16"), F32)
    assert_type(comm.explain("all_reduce", x).name, str)  # local: nothing moves
    inbox: F32 = np.empty(4, np.float32)
    request = comm.irecv(inbox, (comm.rank - 1) % comm.size)
    assert_type(request, Work[F32])
    comm.send(x, (comm.rank + 1) % comm.size)
    assert_type(request.wait(), F32)
    child = comm.dup()
    assert_type(child, Communicator)
    comm.barrier()
    return float(total[0])


def run() -> None:
    results = collectives.run(step, 2)
    assert_type(results, list[float])
    assert results == [1.0, 1.0]
    comm = collectives.init("local")
    assert_type(comm, Communicator)
    out: F32 = np.zeros(2, np.float32)
    if comm.rank != 0:  # (a non-root's call: this communicator has only the root)
        assert_type(comm.broadcast(None, 0, out=out), F32)
    learned: Any = comm.broadcast(np.zeros(2), 0)  # the root (its only rank) passes x
    assert learned.shape == (2,)


if __name__ == "__main__":
    multi_device()
    run()
    print("typed usage ran")
