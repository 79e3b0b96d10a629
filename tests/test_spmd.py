"""The SPMD API over thread ranks: same matrix, same schedules, same bits as multi-device."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ALGORITHMS, RANKS, assert_identical, assert_reduced, combos, exact_inputs, reference

import collectives
from collectives import ReduceOp

SIZES = [0, 1, 7, 1000]


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("algorithm", ALGORITHMS + ["pscpu/pscpu", "nccl/xring"])
def test_all_reduce_matrix(algorithm, n):
    pairs = combos() if n in (1, 3, 4) else combos(dtypes=[np.float32, np.int8, np.float16,
                                                           np.complex64, np.bool_])

    def body(comm):
        out = []
        for dtype, op in pairs:
            for count in SIZES:
                x = exact_inputs(n, count, dtype, op)[comm.rank]
                before = x.copy()
                out.append(comm.all_reduce(x, op, algorithm, groups=2))
                np.testing.assert_array_equal(x, before)
        return out

    per_rank = collectives.run(body, n, timeout=60)
    k = 0
    for dtype, op in pairs:
        for count in SIZES:
            expected = reference(exact_inputs(n, count, dtype, op), op)
            results = [per_rank[r][k] for r in range(n)]
            for r in results:
                assert_reduced(r, expected, op)
            assert_identical(results)
            k += 1


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


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_broadcast_gather_scatter(algorithm, n):
    def body(comm):
        got = {}
        for dtype, op in combos(dtypes=[np.float64, np.int16]):
            x = exact_inputs(n, 101, dtype, op)[comm.rank]
            for root in sorted({0, n - 1}):
                got["reduce", dtype, op, root] = comm.reduce(x, op, root, algorithm)
            got["scatter", dtype, op] = comm.reduce_scatter(x.reshape(101, 1), op, algorithm)
        bcast_alg = algorithm if algorithm != "rechd" else "tree"
        for root in sorted({0, n - 1}):
            mine = np.arange(12.0).reshape(3, 4) + root if comm.rank == root else None
            got["bcast", root] = comm.broadcast(mine, root, bcast_alg)
        got["gather"] = comm.all_gather(np.full((2, 3), comm.rank, np.int32), axis=1,
                                        algorithm=algorithm)
        return got

    per_rank = collectives.run(body, n)
    for dtype, op in combos(dtypes=[np.float64, np.int16]):
        values = exact_inputs(n, 101, dtype, op)
        expected = reference(values, op)
        for root in sorted({0, n - 1}):
            for r in range(n):
                got = per_rank[r]["reduce", dtype, op, root]
                if r == root:
                    assert_reduced(got, expected, op)
                else:
                    assert got is None
        for r in range(n):
            assert_reduced(per_rank[r]["scatter", dtype, op],
                           expected.reshape(101, 1)[r * 101 // n:(r + 1) * 101 // n], op)
    for root in sorted({0, n - 1}):
        for r in range(n):
            np.testing.assert_array_equal(per_rank[r]["bcast", root], np.arange(12.0).reshape(3, 4) + root)
    gathered = np.concatenate([np.full((2, 3), r, np.int32) for r in range(n)], axis=1)
    for r in range(n):
        np.testing.assert_array_equal(per_rank[r]["gather"], gathered)


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
