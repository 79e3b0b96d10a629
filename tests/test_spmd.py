"""The SPMD API over thread ranks: the same bits as multi-device, MEAN, out=, batches, large
counts (the correctness matrix itself is tests/suite, run by tests/test_suite_threads.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import exact_inputs, reference

import collectives
from collectives import ReduceOp

SIZES = [0, 1, 7, 1000]


@pytest.mark.parametrize("algorithm", ["ring", "rechd", "tree", "shuffle", "one_device",
                                       "nccl/xring", "rechd/tree"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_same_bits_as_multi_device(algorithm, n, rng):
    # Random floats make the order of additions visible: one schedule, one order, one result.
    values = [rng.standard_normal(10_007).astype(np.float32) for _ in range(n)]
    expected = collectives.all_reduce(values, "sum", algorithm, groups=2)[0]
    results = collectives.run(lambda comm: comm.all_reduce(values[comm.rank], "sum", algorithm,
                                                           groups=2), n)
    for r in results:
        assert np.array_equal(r.view(np.uint32), expected.view(np.uint32))


def test_mean_of_integers_is_float64():
    results = collectives.run(lambda comm: comm.all_reduce(np.array([comm.rank, 1], np.int32),
                                                           "avg"), 4)
    for r in results:
        assert r.dtype == np.float64
        np.testing.assert_array_equal(r, [1.5, 1.0])


def test_out_receives_result():
    def body(comm):
        out = np.empty(5)
        result = comm.all_reduce(np.ones(5), "sum", out=out)
        return result is out, out

    for same, out in collectives.run(body, 3):
        assert same
        np.testing.assert_array_equal(out, 3.0)


def test_batch_all_reduce_spmd():
    def body(comm):
        xs = [np.full((2, 3), comm.rank, np.float32), np.arange(5) + comm.rank, np.float64(2.0)]
        return comm.batch_all_reduce(xs, "sum", "pscpu:4:xring", num_packs=2)

    for got in collectives.run(body, 3):
        np.testing.assert_array_equal(got[0], np.full((2, 3), 3, np.float32))
        np.testing.assert_array_equal(got[1], np.arange(5) * 3 + 3)
        assert got[2].shape == () and got[2] == 6.0


def test_barrier_and_rank_results_in_order():
    assert collectives.run(lambda comm: (comm.barrier(), comm.rank, comm.size)[1:], 5) == [
        (r, 5) for r in range(5)]


def test_sizes_13_and_16_with_large_buffers():
    for n in (13, 16):
        values = exact_inputs(n, 70_001, np.float32, ReduceOp.SUM)
        results = collectives.run(
            lambda comm, values=values: comm.all_reduce(values[comm.rank], "sum", "ring"), n)
        for r in results:
            np.testing.assert_array_equal(r, reference(values, ReduceOp.SUM))


@pytest.mark.parametrize("groups", [2, [[0, 3], [1, 2]]])
def test_reduce_and_reduce_scatter_take_groups_for_two_level_names(groups):
    # (the docs said to pass groups=; these two had no such argument, so on thread ranks,
    # which have no nodes, a two-level reduce or reduce-scatter could not be grouped)
    want = sum(np.arange(8.0) * (r + 1) for r in range(4))

    def body(comm):
        x = np.arange(8.0) * (comm.rank + 1)
        reduced = comm.reduce(x, "sum", 3, "ring/ring", groups=groups)
        block = comm.reduce_scatter(x, "sum", "ring/ring", groups=groups)
        out, rows = np.empty(8), np.empty(2)  # (and prepared: the same)
        prepared = comm.reduce_init(x, "sum", 3, "ring/ring", out=out, groups=groups)
        scattered = comm.reduce_scatter_init(x, "sum", "ring/ring", out=rows, groups=groups)
        for call in (prepared, scattered):
            call.start().wait()
        buckets = comm.buckets([x, 2 * x], "sum", "ring/ring", groups=groups)
        buckets.ready(0, x)
        buckets.ready(1, 2 * x)
        summed, doubled = buckets.wait()
        assert np.array_equal(summed, want) and np.array_equal(doubled, 2 * want)
        assert np.array_equal(rows, block) and (comm.rank != 3 or np.array_equal(out, reduced))
        with pytest.raises(collectives.CollectiveMismatchError, match="groups"):
            comm.reduce(x, "sum", 0, "ring/ring", groups=groups if comm.rank else 4)
        return reduced, block

    got = collectives.run(body, 4)
    assert np.array_equal(got[3][0], want) and all(g[0] is None for g in got[:3])
    assert np.array_equal(np.concatenate([g[1] for g in got]), want)
    values = [np.arange(8.0) * (d + 1) for d in range(4)]
    blocks = collectives.reduce_scatter(values, "sum", "ring/ring", groups=groups)
    assert np.array_equal(np.concatenate(blocks), want)
