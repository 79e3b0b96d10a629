"""Fused buckets kept from one batched call to the next (``collectives/algorithms/reuse.py``)
on CuPy arrays: the multi-device API (four logical devices on GPU 0) and a one-rank NCCL
communicator. A call whose last results nobody refers to packs into the same bucket and
hands back the same view objects, with fresh values; whatever still refers to a result (the
result, a view of it, a pointer into its memory, a handle in flight) keeps its values
through the next call. PyTorch's side runs on the CPU in tests/test_bucket_reuse.py."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from gpukit import STAND_IN, needs_gpu

import collectives

pytestmark = needs_gpu

SHAPES = [(3, 4), (5,), (2, 2, 2), (7,)]  # one fused bucket of four tensors
DEVICES = 4
no_reuse_under_stand_in = pytest.mark.skipif(
    STAND_IN, reason="the NumPy stand-in for CuPy counts no pointers: nothing is reused there")


def cupy():
    import cupy

    return cupy


def grads(step: int, device: int = 0) -> list:
    return [cupy().full(s, float((device + 1) * step), np.float32) for s in SHAPES]


def multi_device(step: int) -> list:
    per_device = [grads(step, d) for d in range(DEVICES)]
    return collectives.batch_all_reduce([list(t) for t in zip(*per_device)])


def total(step: int, members: int) -> float:
    return float(sum((d + 1) * step for d in range(members)))


def holds(results, want: float) -> bool:
    return all(bool((cupy().asarray(r) == want).all()) for r in results)


def nccl_comm():
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    return collectives.load_backend("nccl").init(MPI.COMM_SELF)


@no_reuse_under_stand_in
def test_results_that_are_gone_give_their_bucket_and_views_to_the_next_call():
    first = multi_device(1)
    ids = [id(r) for r in first[0]]
    del first
    gc.collect()
    second = multi_device(2)
    assert [id(r) for r in second[0]] == ids
    assert all(holds(row, total(2, DEVICES)) for row in second)
    comm = nccl_comm()
    first = comm.batch_all_reduce(grads(1))
    ids = [id(r) for r in first]
    del first
    second = comm.batch_all_reduce(grads(2))
    assert [id(r) for r in second] == ids and holds(second, 2.0)


HOLDERS = {
    "one result": lambda rs: [rs[2]],
    "a view of a result": lambda rs: [rs[0][1:]],
    "an array on a result's pointer": lambda rs: [
        cupy().ndarray((4,), np.float32, memptr=rs[0].data + 4)],
    "a result's pointer alone": lambda rs: [rs[3].data],
}


def _values(kept) -> list:
    """Kept arrays, or pointers read back as one float each."""
    out = []
    for k in kept:
        if isinstance(k, cupy().cuda.MemoryPointer):
            k = cupy().ndarray((1,), np.float32, memptr=k)
        out.append(k)
    return out


POINTERS = {"an array on a result's pointer", "a result's pointer alone"}


@pytest.mark.parametrize("holder", [
    pytest.param(h, marks=pytest.mark.skipif(
        STAND_IN and h in POINTERS, reason="the NumPy stand-in for CuPy has no MemoryPointer"))
    for h in HOLDERS])
def test_what_refers_to_a_result_keeps_its_values(holder):
    keep = HOLDERS[holder]
    multi_device(1)  # (a kept bucket, free)
    kept = keep(multi_device(2)[1])
    gc.collect()
    later = multi_device(3)
    assert holds(_values(kept), total(2, DEVICES)), f"{holder}: the next call overwrote it"
    assert all(holds(row, total(3, DEVICES)) for row in later)
    comm = nccl_comm()
    comm.batch_all_reduce(grads(1))
    kept = keep(comm.batch_all_reduce(grads(2)))
    later = comm.batch_all_reduce(grads(3))
    assert holds(_values(kept), 2.0), f"{holder}: the next NCCL call overwrote it"
    assert holds(later, 3.0)


def test_calls_in_flight_at_once_each_get_their_own_bucket():
    comm = nccl_comm()
    comm.batch_all_reduce(grads(1))  # (a kept bucket, free)
    handles = [comm.batch_all_reduce(grads(step), async_op=True) for step in (2, 3, 4)]
    results = [h.wait() for h in handles]
    assert [holds(r, float(step)) for r, step in zip(results, (2, 3, 4))] == [True] * 3
    assert holds(comm.batch_all_reduce(grads(5)), 5.0)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "prod"])
def test_an_empty_list_makes_its_call_on_nccl_and_comes_back_empty(op):
    """An empty list still makes one call (a zero-size all-reduce carrying the empty list's
    tag, so that ranks agree on it): NCCL takes a count of 0; every kind returns []."""
    comm = nccl_comm()
    assert comm.batch_all_reduce([], op) == []
    assert comm.batch_all_reduce([], op, async_op=True).wait() == []
    buckets = comm.buckets([], op)
    assert buckets.wait() == [] and buckets.wait() == []
    assert holds(comm.batch_all_reduce(grads(3), op), 3.0)  # (and the next call runs)
